"""Engine integration: the quantized (FP8 and int8) linear methods (select before
allocating), a one-call conversion of an ordinary PyTorch model, and quantized checkpoints
out and in (compressed-tensors' formats; transformers' FineGrainedFP8 block layout in),
and tensor-parallel shards of those layers on torch.distributed (``TensorParallel``,
``shard_linear``).

Each kernel selected is logged to ``logging.getLogger("kernelpick.integration")`` once per
(device, config): INFO, WARNING for a degraded choice, the full trace at DEBUG.
kernelpick adds no handler; the application configures logging."""

from kernelpick.integration._errors import (
    CheckpointError,
    KernelSelectionError,
    ModelConversionError,
    TensorParallelError,
)
from kernelpick.integration.checkpoints._save_load import load_quantized, save_quantized
from kernelpick.integration.convert._quantize_model import quantize_model
from kernelpick.integration.convert._report import ConversionReport, LayerReport, SkippedLayer
from kernelpick.integration.formats._model_config import quantization_config
from kernelpick.integration.layer._loaders import WeightLoader, weight_loader_of
from kernelpick.integration.layer._method import (
    ONLINE_SCHEMES,
    Fp8LinearMethod,
    Fp8PtpcLinearMethod,
)
from kernelpick.integration.layer._module import Fp8Linear
from kernelpick.integration.layer._parallel import ParallelStyle, TensorParallel
from kernelpick.integration.layer._shard_linear import shard_linear
from kernelpick.integration.layer._state import CheckpointFormat, LayerState, layer_state

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
    "ParallelStyle",
    "SkippedLayer",
    "TensorParallel",
    "TensorParallelError",
    "WeightLoader",
    "layer_state",
    "load_quantized",
    "quantization_config",
    "quantize_model",
    "save_quantized",
    "shard_linear",
    "weight_loader_of",
]
