"""Engine integration: the FP8 linear methods (select before allocating), a one-call
conversion of an ordinary PyTorch model, and quantized checkpoints out and in."""

from kernelpick.integration.checkpoint import load_quantized, save_quantized
from kernelpick.integration.convert import quantize_model
from kernelpick.integration.errors import (
    CheckpointError,
    KernelSelectionError,
    ModelConversionError,
)
from kernelpick.integration.loaders import WeightLoader, weight_loader_of
from kernelpick.integration.method import ONLINE_SCHEMES, Fp8LinearMethod, Fp8PtpcLinearMethod
from kernelpick.integration.modules import Fp8Linear
from kernelpick.integration.report import ConversionReport, LayerReport, SkippedLayer
from kernelpick.integration.state import CheckpointFormat, LayerState, layer_state

__all__ = [
    "ONLINE_SCHEMES",
    "CheckpointError",
    "CheckpointFormat",
    "ConversionReport",
    "Fp8Linear",
    "Fp8LinearMethod",
    "Fp8PtpcLinearMethod",
    "KernelSelectionError",
    "LayerReport",
    "LayerState",
    "ModelConversionError",
    "SkippedLayer",
    "WeightLoader",
    "layer_state",
    "load_quantized",
    "quantize_model",
    "save_quantized",
    "weight_loader_of",
]
