"""Requirements: the small pure rules a kernel declares in the catalog.

Each requirement is a frozen value with ``check(caps, config) -> Reason | None`` and
``render()``. Kernel authors list them on a ``KernelSpec``; an engine can write its own
class with the same two methods (the ``Requirement`` protocol). The rules that read the
device are in ``_device_rules``, those that read the config in ``_config_rules``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

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
from kernelpick.core._device import DeviceCaps
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
from kernelpick.core._kinds import ActivationQuantized, WeightOnlyActivation
from kernelpick.core._quant import QuantConfig
from kernelpick.core._reasons import Reason

__all__ = [
    "ActivationQuantized",
    "ActivationScales",
    "Alignment",
    "CpuIsa",
    "CpuIsaAnyOf",
    "CudaArchs",
    "DynamicActivationScales",
    "Fp8Dtypes",
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
    "WeightOnlyActivation",
    "WeightScales",
]


@runtime_checkable
class Requirement(Protocol):
    """A rule a kernel needs to hold. Pure: it reads its arguments and nothing else.

    ``check`` returns None when the rule holds, else a ``kp.Reason(code, needed, found)``
    (anything else is refused when the rule is evaluated). Hints evaluate every rule on
    every named scheme's config too, not only on configs of the kind the kernel serves.
    """

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None: ...

    def render(self) -> str: ...
