"""Engine integration: the quantized (FP8 and int8) linear methods (select before
allocating), a one-call conversion of an ordinary PyTorch model, and quantized checkpoints
out and in (compressed-tensors' formats; transformers' FineGrainedFP8 block layout in),
and tensor-parallel shards of those layers on torch.distributed (``TensorParallel``,
``shard_linear``).

Each kernel selected is logged to ``logging.getLogger("kernelpick.integration")`` once per
(device, config): INFO, WARNING for a degraded choice, the full trace at DEBUG.
kernelpick adds no handler; the application configures logging."""

import typing as _typing
import warnings as _warnings

from kernelpick.integration._errors import (
    CheckpointError,
    KernelSelectionError,
    ModelConversionError,
    TensorParallelError,
)
from kernelpick.integration._log import SELECTIONS_LOGGER
from kernelpick.integration.checkpoints import (
    CheckpointInfo,
    inspect_checkpoint,
    load_quantized,
    save_quantized,
)
from kernelpick.integration.convert import (
    ConversionReport,
    LayerReport,
    SkippedLayer,
    model_summary,
    quantize_model,
)
from kernelpick.integration.formats import quantization_config
from kernelpick.integration.layer import (
    ONLINE_SCHEMES,
    CheckpointFormat,
    Fp8PtpcLinearMethod,
    LayerState,
    ParallelStyle,
    QuantizedLinear,
    QuantizedLinearMethod,
    Recipe,
    TensorParallel,
    WeightLoader,
    layer_state,
    shard_linear,
    weight_loader_of,
)

__all__ = [
    "ONLINE_SCHEMES",
    "SELECTIONS_LOGGER",
    "CheckpointError",
    "CheckpointFormat",
    "CheckpointInfo",
    "ConversionReport",
    "Fp8PtpcLinearMethod",
    "KernelSelectionError",
    "LayerReport",
    "LayerState",
    "ModelConversionError",
    "ParallelStyle",
    "QuantizedLinear",
    "QuantizedLinearMethod",
    "Recipe",
    "SkippedLayer",
    "TensorParallel",
    "TensorParallelError",
    "WeightLoader",
    "inspect_checkpoint",
    "layer_state",
    "load_quantized",
    "model_summary",
    "quantization_config",
    "quantize_model",
    "save_quantized",
    "shard_linear",
    "weight_loader_of",
]

# The names from before the module held int8 as well as FP8; they go away in 0.4.0.
_DEPRECATED = {"Fp8Linear": "QuantizedLinear", "Fp8LinearMethod": "QuantizedLinearMethod"}


def __getattr__(name: str) -> _typing.Any:
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        _warnings.warn(
            f"kernelpick.integration.{name} is deprecated and goes away in 0.4.0; use "
            f"kernelpick.integration.{new} (it runs FP8 and int8 schemes alike)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module 'kernelpick.integration' has no attribute {name!r}", name=name)
