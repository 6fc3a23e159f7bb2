"""Requirements: the small pure rules a kernel declares in the catalog.

Each requirement is a frozen value with ``check(caps, config) -> Reason | None`` and
``render()``. Kernel authors list them on a ``KernelSpec``; an engine can write its own
class with the same two methods (the ``Requirement`` protocol).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kernelpick.core._arch import CudaArch, RocmArch, Version, as_version
from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import Dtype
from kernelpick.core._quant import GroupShape, QuantConfig
from kernelpick.core._reasons import Reason, RejectCode

__all__ = [
    "ActivationQuantized",
    "ActivationScales",
    "Alignment",
    "Fp8Dtypes",
    "InputDtypes",
    "MinComputeCapability",
    "MinTorch",
    "NeedsLibrary",
    "NeedsTorchFeature",
    "NotBothPerTensor",
    "OutDtypes",
    "Requirement",
    "RocmArchs",
    "WeightOnlyActivation",
    "WeightScales",
]


@runtime_checkable
class Requirement(Protocol):
    """A rule a kernel needs to hold. Pure: it reads its arguments and nothing else."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None: ...

    def render(self) -> str: ...


def _either(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _listed(items: Iterable[Dtype] | Iterable[GroupShape]) -> str:
    return _either(sorted(str(item) for item in items))


@attrs.frozen
class MinComputeCapability:
    """The device's CUDA compute capability is at least ``arch``."""

    arch: CudaArch

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if isinstance(caps.arch, CudaArch) and caps.arch >= self.arch:
            return None
        return Reason(RejectCode.COMPUTE_CAPABILITY, str(self.arch), str(caps.arch))

    def render(self) -> str:
        return f"compute capability >= {self.arch}"


def _rocm_table(
    value: Mapping[str, Version | str | None],
) -> tuple[tuple[str, Version | None], ...]:
    # Declared order is kept: it is the order a person reads in the reason.
    return tuple(
        (RocmArch.parse(k).name, None if v is None else Version.parse(v)) for k, v in value.items()
    )


@attrs.frozen
class RocmArchs:
    """The device is one of these AMD archs, each with the least ROCm version it needs (or None)."""

    archs: tuple[tuple[str, Version | None], ...] = attrs.field(converter=_rocm_table)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        table = dict(self.archs)
        name = caps.arch.name if isinstance(caps.arch, RocmArch) else str(caps.arch)
        if name not in table:
            return Reason(RejectCode.GPU_ARCH, _either(list(table)), name)
        least = table[name]
        if least is not None and (caps.toolkit_version is None or caps.toolkit_version < least):
            return Reason(
                RejectCode.TOOLKIT_VERSION, f"ROCm {least} or newer on {name}", caps.toolkit
            )
        return None

    def render(self) -> str:
        parts = (name if v is None else f"{name} (ROCm >= {v})" for name, v in self.archs)
        return "arch " + _either(list(parts))


@attrs.frozen
class MinTorch:
    """The device's torch is at least ``version``."""

    version: Version = attrs.field(converter=as_version)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if caps.torch_version >= self.version:
            return None
        return Reason(RejectCode.TORCH_VERSION, str(self.version), str(caps.torch_version))

    def render(self) -> str:
        return f"torch >= {self.version}"


@attrs.frozen
class NeedsTorchFeature:
    """The torch build has ``feature``, a fact found by trial on the device (``FEATURE_*``)."""

    feature: str
    meaning: str

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if self.feature in caps.features:
            return None
        found = "a trial call found this torch build lacks it"
        return Reason(RejectCode.TORCH_FEATURE, self.meaning, found)

    def render(self) -> str:
        return self.meaning


@attrs.frozen
class NeedsLibrary:
    """An optional library is usable on the device: installed, and its driver answers."""

    library: str

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if self.library in caps.libraries:
            return None
        found = f"{self.library} is not usable (not installed, or no driver)"
        return Reason(RejectCode.LIBRARY_UNAVAILABLE, self.library, found)

    def render(self) -> str:
        return f"{self.library} usable"


@attrs.frozen
class Fp8Dtypes:
    """The config's FP8 operands use one of these formats."""

    dtypes: frozenset[Dtype]

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if config.weight.dtype in self.dtypes and (act is None or act.dtype in self.dtypes):
            return None
        found = {config.weight.dtype} | ({act.dtype} if act else set())
        return Reason(RejectCode.FP8_DTYPE, _listed(self.dtypes), _listed(found - self.dtypes))

    def render(self) -> str:
        return f"FP8 {_listed(self.dtypes)}"


@attrs.frozen
class ActivationScales:
    """A W8A8 kernel reads activation scales of these granularities."""

    groups: frozenset[GroupShape]

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        # A weight-only config is judged by the kind rule, not here.
        if act is None or act.scale.group in self.groups:
            return None
        return Reason(RejectCode.ACTIVATION_SCALES, _listed(self.groups), str(act.scale.group))

    def render(self) -> str:
        return f"activation {_listed(self.groups)}"


@attrs.frozen
class WeightScales:
    """The kernel reads weight scales of these granularities."""

    groups: frozenset[GroupShape]

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        group = config.weight.scale.group
        if group in self.groups:
            return None
        return Reason(RejectCode.WEIGHT_SCALES, _listed(self.groups), str(group))

    def render(self) -> str:
        return f"weight {_listed(self.groups)}"


@attrs.frozen
class NotBothPerTensor:
    """At least one operand is scaled finer than per-tensor (else the tensor-wise kernel serves)."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if act is None or act.scale.group != GroupShape.PER_TENSOR:
            return None
        if config.weight.scale.group != GroupShape.PER_TENSOR:
            return None
        return Reason(
            RejectCode.SCALE_COMBINATION,
            "per-token activation or per-channel weight scales",
            "both per-tensor",
        )

    def render(self) -> str:
        return "not both per-tensor"


@attrs.frozen
class Alignment:
    """K and N are multiples of ``multiple``."""

    multiple: int

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.k % self.multiple == 0 and config.n % self.multiple == 0:
            return None
        return Reason(
            RejectCode.SHAPE_ALIGNMENT,
            f"K and N to be multiples of {self.multiple}",
            f"N={config.n}, K={config.k}",
        )

    def render(self) -> str:
        return f"K, N % {self.multiple} == 0"


@attrs.frozen
class OutDtypes:
    """The kernel writes one of these output dtypes."""

    dtypes: frozenset[Dtype]

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.out_dtype in self.dtypes:
            return None
        return Reason(RejectCode.OUT_DTYPE, _listed(self.dtypes), str(config.out_dtype))

    def render(self) -> str:
        return f"out {_listed(self.dtypes)}"


@attrs.frozen
class InputDtypes:
    """The kernel reads activations in one of these dtypes."""

    dtypes: frozenset[Dtype]

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.input_dtype in self.dtypes:
            return None
        return Reason(RejectCode.INPUT_DTYPE, _listed(self.dtypes), str(config.input_dtype))

    def render(self) -> str:
        return f"input {_listed(self.dtypes)}"


# The two kind rules below are not declared by kernels: the core applies them to every
# kernel of the kind (see specs.KIND_RULES), so no kernel can forget them.


@attrs.frozen
class ActivationQuantized:
    """A W8A8 kernel quantizes activations, so the config must say how."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.activation is not None:
            return None
        return Reason(RejectCode.ACTIVATION_REQUIRED, "an activation quantization", "none")

    def render(self) -> str:
        return "an activation quantization (W8A8)"


@attrs.frozen
class WeightOnlyActivation:
    """A W8A16 kernel leaves activations in high precision: it can stand in for a per-tensor
    activation scale (degraded), never for a finer one such as per-token (vLLM issue 61316)."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if act is None or act.scale.group == GroupShape.PER_TENSOR:
            return None
        return Reason(
            RejectCode.WEIGHT_ONLY_ACTIVATION,
            "no activation quantization, or per-tensor (degraded)",
            act.scale.group.render(),
        )

    def render(self) -> str:
        return "activation none, or per-tensor (degraded)"
