"""One quantized layer, from recipe to forward: recipe -> plan -> allocate -> load -> accept
-> prepare -> apply.

- ``Recipe``: the scheme, block size and checkpoint format, checked once and purely.
- ``LayerSteps.plan``: select before allocating; a ``LayerPlan`` names the parameters.
  ``partition_config`` and ``check_partition`` are the config and the refusals of one
  rank's part, from its sizes alone (what ``kernelpick.plan`` reports before any download).
- the loaders (``loader_for``): each tensor checked as it arrives, an engine's own loader
  behind the same checks.
- ``accept`` / ``accept_float``: the only place a layer's tensors are checked and made
  canonical (``CanonicalWeights``), whichever path brought them.
- ``install``: the kernel prepares what it runs on, once (``bundle_for`` makes it again
  when the canonical tensors changed); ``run`` applies it.

The linear method (``QuantizedLinearMethod``), the module (``QuantizedLinear``) and
tensor-parallel shards (``TensorParallel``, ``shard_linear``) are made of these steps.
"""

from kernelpick.integration.layer._accept import (
    CanonicalWeights,
    Check,
    accept,
    accept_float,
    check_bias,
    check_float,
    float_weight_check,
    scale_check,
    weight_check,
)
from kernelpick.integration.layer._allocate import (
    ParameterFactory,
    check_partition,
    partition_config,
)
from kernelpick.integration.layer._int_form import (
    INT_NAMES,
    SHAPE_NAME,
    IntWeights,
    accept_int,
    check_shape,
    int_params,
    is_weight_only_int,
)
from kernelpick.integration.layer._loaders import WeightLoader, shard_index, weight_loader_of
from kernelpick.integration.layer._method import Fp8PtpcLinearMethod, QuantizedLinearMethod
from kernelpick.integration.layer._module import QuantizedLinear, accept_before_loading
from kernelpick.integration.layer._parallel import ParallelStyle, TensorParallel
from kernelpick.integration.layer._plan import LayerPlan, Param
from kernelpick.integration.layer._prepare import (
    LayerWeights,
    bundle_for,
    install,
    run,
    weights_from,
)
from kernelpick.integration.layer._recipe import (
    ONLINE_SCHEMES,
    CheckpointFormat,
    Recipe,
    refuse_integer,
)
from kernelpick.integration.layer._shard_linear import shard_linear
from kernelpick.integration.layer._shards import scale_shape
from kernelpick.integration.layer._state import (
    ALL_SHARDS,
    CheckpointShape,
    LayerState,
    Prepared,
    attach,
    find_state,
    layer_state,
)
from kernelpick.integration.layer._steps import LayerSteps, frozen

__all__ = [
    "ALL_SHARDS",
    "INT_NAMES",
    "ONLINE_SCHEMES",
    "SHAPE_NAME",
    "CanonicalWeights",
    "Check",
    "CheckpointFormat",
    "CheckpointShape",
    "Fp8PtpcLinearMethod",
    "IntWeights",
    "LayerPlan",
    "LayerState",
    "LayerSteps",
    "LayerWeights",
    "ParallelStyle",
    "Param",
    "ParameterFactory",
    "Prepared",
    "QuantizedLinear",
    "QuantizedLinearMethod",
    "Recipe",
    "TensorParallel",
    "WeightLoader",
    "accept",
    "accept_before_loading",
    "accept_float",
    "accept_int",
    "attach",
    "bundle_for",
    "check_bias",
    "check_float",
    "check_partition",
    "check_shape",
    "find_state",
    "float_weight_check",
    "frozen",
    "install",
    "int_params",
    "is_weight_only_int",
    "layer_state",
    "partition_config",
    "refuse_integer",
    "run",
    "scale_check",
    "scale_shape",
    "shard_index",
    "shard_linear",
    "weight_check",
    "weight_loader_of",
    "weights_from",
]
