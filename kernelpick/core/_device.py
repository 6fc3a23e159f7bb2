"""DeviceCaps: everything the decision needs to know about one device, as a value."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from kernelpick.core._arch import Arch, CpuArch, CudaArch, Platform, RocmArch, Version, as_version
from kernelpick.core._cpuinfo import isa_class
from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError

__all__ = [
    "CPP_TOOLCHAIN_PARTS",
    "FEATURE_BUILD_ROOT",
    "FEATURE_CPP_TOOLCHAIN",
    "FEATURE_CXX_COMPILER",
    "FEATURE_NINJA",
    "FEATURE_SCALED_MM",
    "FEATURE_SCALED_MM_ROWWISE",
    "DeviceCaps",
    "missing_toolchain_parts",
    "toolchain_features",
]

# Facts about the software stack that no version string can tell; adapters find them by a
# trial call or by probing. They are strings so that an engine can add its own.
FEATURE_SCALED_MM = "scaled_mm"
FEATURE_SCALED_MM_ROWWISE = "scaled_mm_rowwise"
# torch.utils.cpp_extension can build a kernel at first use: every part below was found.
FEATURE_CPP_TOOLCHAIN = "cpp_toolchain"
# The parts of that toolchain, each found on its own (kernelpick.kernels.toolchain_parts), so
# that a machine without one is told which is missing: a C++ compiler ($CXX, else c++) on
# PATH, ninja, and a build root under TORCH_EXTENSIONS_DIR this process can create and write.
FEATURE_CXX_COMPILER = "cxx_compiler"
FEATURE_NINJA = "ninja"
FEATURE_BUILD_ROOT = "writable_build_root"
CPP_TOOLCHAIN_PARTS = (FEATURE_CXX_COMPILER, FEATURE_NINJA, FEATURE_BUILD_ROOT)


def toolchain_features(found: Iterable[str]) -> frozenset[str]:
    """The features a probe records for the ``CPP_TOOLCHAIN_PARTS`` it ``found``: the one
    ``FEATURE_CPP_TOOLCHAIN`` when it found them all, else the parts it found."""
    parts = frozenset(found) & frozenset(CPP_TOOLCHAIN_PARTS)
    return frozenset({FEATURE_CPP_TOOLCHAIN}) if not missing_toolchain_parts(parts) else parts


def missing_toolchain_parts(features: Iterable[str]) -> tuple[str, ...]:
    """The ``CPP_TOOLCHAIN_PARTS`` that ``features`` lacks, in that order: none where it has
    ``FEATURE_CPP_TOOLCHAIN``, which stands for all of them."""
    present = frozenset(features)
    if FEATURE_CPP_TOOLCHAIN in present:
        return ()
    return tuple(part for part in CPP_TOOLCHAIN_PARTS if part not in present)


def _names(value: Iterable[str] | str) -> frozenset[str]:
    items = [value] if isinstance(value, str) else value
    try:
        return frozenset(str(item).strip() for item in items)
    except TypeError:
        raise InvalidValueError("name set", value, "a collection of names") from None


def _arch(value: Arch) -> Arch:
    # A subclass becomes the core type, as Version does: rules compare archs of one type.
    if isinstance(value, CudaArch):
        return CudaArch.parse(value)
    if isinstance(value, RocmArch):
        return RocmArch.parse(value)
    if isinstance(value, CpuArch):
        return value
    raise InvalidValueError("arch", value, "a CudaArch, RocmArch or CpuArch")


def _optional_version(value: object) -> Version | None:
    return None if value is None else Version.parse(value)


def _name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidValueError("device name", value, "a non-empty string")


@attrs.frozen(cache_hash=True)
class DeviceCaps:
    """The facts of one device that kernel rules read.

    ``toolkit_version`` is the CUDA runtime on NVIDIA, the ROCm (HIP) version on AMD and
    None on a CPU. ``libraries`` names the optional libraries that are usable, not merely
    installed (``"cupy"`` means cupy imports and a driver answers). ``features`` names facts
    of the software stack found by trial or probing (see ``FEATURE_*``): what the torch
    build runs, and whether a C++ toolchain can compile a kernel at first use. Build one
    with a named constructor, take a profile (``kp.device_profile``), or probe a live
    device.
    """

    arch: Arch = attrs.field(converter=_arch)
    name: str = attrs.field(validator=_name)
    torch_version: Version = attrs.field(converter=as_version)
    toolkit_version: Version | None = attrs.field(default=None, converter=_optional_version)
    libraries: frozenset[str] = attrs.field(default=frozenset(), converter=_names)
    features: frozenset[str] = attrs.field(default=frozenset(), converter=_names)

    @property
    def platform(self) -> Platform:
        if isinstance(self.arch, CudaArch):
            return Platform.CUDA
        if isinstance(self.arch, RocmArch):
            return Platform.ROCM
        return Platform.CPU

    @property
    def fp8_format(self) -> Dtype:
        """The FP8 e4m3 flavour the hardware computes in: e4m3fnuz on gfx94x, e4m3fn elsewhere."""
        if isinstance(self.arch, RocmArch):
            return self.arch.native_fp8
        return Dtype.FLOAT8_E4M3FN

    @property
    def toolkit(self) -> str:
        """The toolkit as a person reads it: ``CUDA 12.8``, ``ROCm 7.0`` or ``none``."""
        if self.toolkit_version is None:
            return "none"
        label = {Platform.CUDA: "CUDA", Platform.ROCM: "ROCm"}.get(self.platform, "toolkit")
        return f"{label} {self.toolkit_version}"

    @classmethod
    def cuda(
        cls,
        arch: CudaArch | str,
        *,
        name: str,
        torch_version: Version | str,
        cuda_version: Version | str,
        libraries: Iterable[str] | str = (),
        features: Iterable[str] | str = (),
    ) -> DeviceCaps:
        """An NVIDIA device from its compute capability (``"8.9"`` or ``"sm_89"``)."""
        return cls(
            arch=CudaArch.parse(arch),
            name=name,
            torch_version=Version.parse(torch_version),
            toolkit_version=Version.parse(cuda_version),
            libraries=libraries,
            features=features,
        )

    @classmethod
    def rocm(
        cls,
        arch: RocmArch | str,
        *,
        name: str,
        torch_version: Version | str,
        rocm_version: Version | str,
        libraries: Iterable[str] | str = (),
        features: Iterable[str] | str = (),
    ) -> DeviceCaps:
        """An AMD device from its gfx name or ``gcnArchName`` (``gfx942:sramecc+:xnack-``)."""
        return cls(
            arch=RocmArch.parse(arch),
            name=name,
            torch_version=Version.parse(torch_version),
            toolkit_version=Version.parse(rocm_version),
            libraries=libraries,
            features=features,
        )

    @classmethod
    def cpu(
        cls,
        *,
        machine: str,
        isa: Iterable[str] | str,
        name: str,
        torch_version: Version | str,
        features: Iterable[str] | str = (),
    ) -> DeviceCaps:
        """The host CPU, with the software-stack features found on it (``FEATURE_*``)."""
        return cls(
            arch=CpuArch(machine, isa),
            name=name,
            torch_version=Version.parse(torch_version),
            features=features,
        )

    @property
    def isa_class(self) -> str | None:
        """What a CPU has for quantized products (``AMX``, ``AVX-512 with BF16 and VNNI``,
        ``AVX2 only``, ...; see ``kernelpick.core._cpuinfo.ISA_CLASSES``); None on a GPU."""
        return isa_class(self.arch.isa) if isinstance(self.arch, CpuArch) else None

    def render(self) -> str:
        """One line: name, platform, arch (a CPU's with what it has for quantized
        products), toolkit and torch."""
        arch: object = self.arch
        if self.platform is Platform.CUDA:
            arch = f"compute capability {self.arch}"
        elif self.isa_class is not None:
            arch = f"{self.arch}: {self.isa_class}"
        toolkit = "" if self.toolkit_version is None else f", {self.toolkit}"
        return (
            f"{self.name}: {self.platform}, {arch}{toolkit}, torch {self.torch_version}, "
            f"FP8 {self.fp8_format}"
        )
