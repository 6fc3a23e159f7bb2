"""Engine integration: the online-FP8 linear methods (select before allocating) and a
one-call conversion of an ordinary PyTorch model."""

from kernelpick.integration.convert import ConversionReport, LayerReport, quantize_model
from kernelpick.integration.errors import KernelSelectionError, ModelConversionError
from kernelpick.integration.method import (
    ONLINE_SCHEMES,
    Fp8OnlineLinearMethod,
    Fp8PtpcLinearMethod,
    LayerState,
    WeightLoader,
    layer_state,
    weight_loader_of,
)
from kernelpick.integration.modules import Fp8Linear

__all__ = [
    "ONLINE_SCHEMES",
    "ConversionReport",
    "Fp8Linear",
    "Fp8OnlineLinearMethod",
    "Fp8PtpcLinearMethod",
    "KernelSelectionError",
    "LayerReport",
    "LayerState",
    "ModelConversionError",
    "WeightLoader",
    "layer_state",
    "quantize_model",
    "weight_loader_of",
]
