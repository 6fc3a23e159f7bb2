"""The rules a kernel declares in its catalog row: small pure values with
``check(caps, config) -> Reason | None`` and ``render() -> str``.

``kp.rules.KIND_RULES`` are the rules the core adds to every kernel of a kind, so a new
weight-only kernel cannot forget the per-token check. A rule of your own is any frozen
class with the same two methods (the ``Requirement`` protocol).
"""

from kernelpick.core._requirements import (
    ActivationScales,
    Alignment,
    CpuIsa,
    DynamicActivationScales,
    Fp8Dtypes,
    InputDtypes,
    MinComputeCapability,
    MinTorch,
    NeedsLibrary,
    NeedsToolchain,
    NeedsTorchFeature,
    NotBothPerTensor,
    OutDtypes,
    Requirement,
    RocmArchs,
    WeightScales,
)
from kernelpick.core._specs import KIND_RULES

__all__ = [
    "KIND_RULES",
    "ActivationScales",
    "Alignment",
    "CpuIsa",
    "DynamicActivationScales",
    "Fp8Dtypes",
    "InputDtypes",
    "MinComputeCapability",
    "MinTorch",
    "NeedsLibrary",
    "NeedsToolchain",
    "NeedsTorchFeature",
    "NotBothPerTensor",
    "OutDtypes",
    "Requirement",
    "RocmArchs",
    "WeightScales",
]
