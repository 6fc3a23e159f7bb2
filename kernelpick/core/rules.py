"""The rules a kernel declares in its catalog row, the kind rules the core adds and the
table they read: the core's side of ``kp.rules`` (``kernelpick/rules.py`` re-exports this
module; a rule's own module is private to the core)."""

from kernelpick.core._config_rules import (
    ActivationScales,
    Alignment,
    DynamicActivationScales,
    Fp8Dtypes,
    InputDtypes,
    MinTokens,
    NotBothPerTensor,
    OutDtypes,
    QuantDtypes,
    ScaleDtypes,
    WeightScales,
)
from kernelpick.core._device_rules import (
    CpuIsa,
    CpuIsaAnyOf,
    CudaArchs,
    MinComputeCapability,
    MinTorch,
    NeedsLibrary,
    NeedsToolchain,
    NeedsTorchFeature,
    RocmArchs,
)
from kernelpick.core._kinds import KIND_TABLE, Service
from kernelpick.core._quant import ActivationGrouping
from kernelpick.core._specs import KIND_RULES, Requirement
from kernelpick.core._weight_rules import (
    LAWS,
    OPT_IN_DEFAULTS,
    ActOrder,
    GroupSizes,
    WholeGroupsPerPart,
    ZeroPoints,
)

__all__ = [
    "KIND_RULES",
    "KIND_TABLE",
    "LAWS",
    "OPT_IN_DEFAULTS",
    "ActOrder",
    "ActivationGrouping",
    "ActivationScales",
    "Alignment",
    "CpuIsa",
    "CpuIsaAnyOf",
    "CudaArchs",
    "DynamicActivationScales",
    "Fp8Dtypes",
    "GroupSizes",
    "InputDtypes",
    "MinComputeCapability",
    "MinTokens",
    "MinTorch",
    "NeedsLibrary",
    "NeedsToolchain",
    "NeedsTorchFeature",
    "NotBothPerTensor",
    "OutDtypes",
    "QuantDtypes",
    "Requirement",
    "RocmArchs",
    "ScaleDtypes",
    "Service",
    "WeightScales",
    "WholeGroupsPerPart",
    "ZeroPoints",
]
