"""The rules that read the device: its arch, toolkit, torch, features and libraries.

A failing one is what a different device (or software stack) fixes, so the hints name
its ``needed`` as the device to move to: each says exactly what would pass.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kernelpick.core._arch import CpuArch, CudaArch, RocmArch, Version, as_version
from kernelpick.core._device import (
    FEATURE_BUILD_ROOT,
    FEATURE_CXX_COMPILER,
    FEATURE_NINJA,
    DeviceCaps,
    missing_toolchain_parts,
)
from kernelpick.core._errors import InvalidValueError, positive_int
from kernelpick.core._quant import QuantConfig
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._rule_fields import as_cuda_arch, either, flag_names, non_empty_text

__all__ = [
    "CpuIsa",
    "CpuIsaAnyOf",
    "CudaArchs",
    "MinComputeCapability",
    "MinTorch",
    "NeedsLibrary",
    "NeedsToolchain",
    "NeedsTorchFeature",
    "RocmArchs",
]


@attrs.frozen
class MinComputeCapability:
    """The device's CUDA compute capability is at least ``arch`` (``"8.9"`` is parsed)."""

    arch: CudaArch = attrs.field(converter=as_cuda_arch)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if isinstance(caps.arch, CudaArch) and caps.arch >= self.arch:
            return None
        return Reason(RejectCode.COMPUTE_CAPABILITY, str(self.arch), str(caps.arch))

    def render(self) -> str:
        return f"compute capability >= {self.arch}"


def _cuda_table(
    value: Mapping[int, Version | str | None],
) -> tuple[tuple[int, Version | None], ...]:
    if not isinstance(value, Mapping) or not value:
        raise InvalidValueError("CudaArchs", value, "a non-empty mapping {major: least CUDA}")
    for major in value:
        positive_int("CudaArchs major", major, "a compute capability major, e.g. 9")
    return tuple((k, None if v is None else Version.parse(v)) for k, v in value.items())


@attrs.frozen
class CudaArchs:
    """The device's compute capability major is one of these (``{9: "12.9"}`` is SM 9.x
    with CUDA 12.9 or newer, None: any CUDA): for kernels built for one architecture
    family (sm_90a, sm_100a), which a newer GPU does not run."""

    majors: tuple[tuple[int, Version | None], ...] = attrs.field(converter=_cuda_table)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        table = dict(self.majors)
        arch = caps.arch
        if not isinstance(arch, CudaArch) or arch.major not in table:
            return Reason(RejectCode.GPU_ARCH, self._archs(), str(arch))
        least = table[arch.major]
        if least is not None and (caps.toolkit_version is None or caps.toolkit_version < least):
            needed = f"CUDA {least} or newer on SM {arch.major}.x"
            return Reason(RejectCode.TOOLKIT_VERSION, needed, caps.toolkit)
        return None

    def _archs(self) -> str:
        parts = [
            f"SM {major}.x" + ("" if least is None else f" with CUDA >= {least}")
            for major, least in self.majors
        ]
        return either(parts)

    def render(self) -> str:
        return "arch " + self._archs()


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
            return Reason(RejectCode.GPU_ARCH, self._archs(), name)
        least = table[name]
        if least is not None and (caps.toolkit_version is None or caps.toolkit_version < least):
            return Reason(
                RejectCode.TOOLKIT_VERSION, f"ROCm {least} or newer on {name}", caps.toolkit
            )
        return None

    def _archs(self) -> str:
        """``gfx942, or gfx950/gfx1200/gfx1201 with ROCm >= 7.0``: each arch with the least
        ROCm it needs, so that a reason, and the device hint made from it, never offers an
        arch the device's ROCm would still be turned down on."""
        by_floor: dict[Version | None, list[str]] = {}
        for name, least in self.archs:
            by_floor.setdefault(least, []).append(name)
        parts = by_floor.pop(None, [])
        parts += ["/".join(names) + f" with ROCm >= {v}" for v, names in by_floor.items()]
        if by_floor and len(parts) > 1:  # ", or": the ROCm floor binds to the last group only
            return f"{', '.join(parts[:-1])}, or {parts[-1]}"
        return either(parts)

    def render(self) -> str:
        return "arch " + self._archs()


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
    """The torch build has ``feature``, a fact found by trial on the device (``FEATURE_*``);
    ``meaning`` says it in words."""

    feature: str = attrs.field(validator=non_empty_text)
    meaning: str = attrs.field(validator=non_empty_text)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if self.feature in caps.features:
            return None
        found = "a trial call found this torch build lacks it"
        return Reason(RejectCode.TORCH_FEATURE, self.meaning, found)

    def render(self) -> str:
        return self.meaning


@attrs.frozen
class NeedsLibrary:
    """An optional library (its name, e.g. ``"cupy"``) is usable on the device: installed,
    and its driver answers."""

    library: str = attrs.field(validator=non_empty_text)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if self.library in caps.libraries:
            return None
        found = (
            f"{self.library} is not usable "
            "(not installed, no driver, or NVRTC cannot compile a kernel)"
        )
        return Reason(RejectCode.LIBRARY_UNAVAILABLE, self.library, found)

    def render(self) -> str:
        return f"{self.library} usable"


# What the probe looked for and did not find, part by part (kernels/_cpu_toolchain.py).
_MISSING = {
    FEATURE_CXX_COMPILER: "no C++ compiler on PATH ($CXX, else c++)",
    FEATURE_NINJA: "no ninja (on PATH, or from the ninja package)",
    FEATURE_BUILD_ROOT: "no build root it can create and write (under TORCH_EXTENSIONS_DIR, "
    "by default ~/.cache/torch_extensions)",
}


@attrs.frozen
class NeedsToolchain:
    """A C++ toolchain: a compiler and ninja on the device's PATH and an extensions directory
    it can write, so a kernel compiled at first use by ``torch.utils.cpp_extension`` can be
    built (``FEATURE_CPP_TOOLCHAIN``, or each of ``CPP_TOOLCHAIN_PARTS``, found by the CPU
    adapter's probe). A rejection names each part that was not found."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        # torch.utils.cpp_extension.load runs $CXX (else c++) through ninja: without both,
        # the kernel's first call would fail after the weights were made for it.
        missing = missing_toolchain_parts(caps.features)
        if not missing:
            return None
        found = "; ".join(_MISSING[part] for part in missing)
        return Reason(RejectCode.TOOLCHAIN, "a C++ toolchain", found)

    def render(self) -> str:
        return "a C++ toolchain (compiler and ninja)"


# One named converter per field: attrs' mypy plugin reads named functions only.
def _isa_flags(value: object) -> frozenset[str]:
    return flag_names(value, "CpuIsa flags")


@attrs.frozen
class CpuIsa:
    """The device is a CPU whose ISA has every one of ``flags``, named as /proc/cpuinfo
    names them (``{"avx2", "fma", "f16c"}``; a bare string is refused)."""

    flags: frozenset[str] = attrs.field(converter=_isa_flags)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        # Code compiled for these instructions faults (SIGILL) on a CPU without them.
        arch = caps.arch
        if isinstance(arch, CpuArch) and self.flags <= arch.isa:
            return None
        if isinstance(arch, CpuArch):
            found = f"{arch.machine} CPU lacks {_flag_list(self.flags - arch.isa)}"
        else:
            found = f"device is not a CPU ({caps.platform} {arch})"
        return Reason(RejectCode.CPU_ISA, _flag_list(self.flags), found)

    def render(self) -> str:
        return f"CPU with {_flag_list(self.flags)}"


@attrs.frozen
class CpuIsaAnyOf:
    """The device is a CPU whose ISA has at least one of ``flags`` (named as
    ``/proc/cpuinfo`` names them): one of several instruction sets that each run a kernel's
    code right, where the ISA without any of them runs it wrong or not at all."""

    flags: frozenset[str] = attrs.field(converter=_isa_flags)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        arch = caps.arch
        if isinstance(arch, CpuArch) and self.flags & arch.isa:
            return None
        if isinstance(arch, CpuArch):
            found = f"{arch.machine} CPU has none of them"
        else:
            found = f"device is not a CPU ({caps.platform} {arch})"
        return Reason(RejectCode.CPU_ISA, f"one of {_flag_list(self.flags)}", found)

    def render(self) -> str:
        return f"CPU with one of {_flag_list(self.flags)}"


def _flag_list(flags: frozenset[str]) -> str:
    # Every flag is needed; commas, never "and", which joins the parts of a device hint.
    return ", ".join(sorted(flags))
