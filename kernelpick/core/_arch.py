"""Platforms, architectures and versions: the hardware and software facts a rule reads."""

from __future__ import annotations

import enum
import functools
import re

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError, parse_enum

__all__ = [
    "Arch",
    "CpuArch",
    "CudaArch",
    "Platform",
    "RocmArch",
    "Version",
    "as_platform",
    "as_version",
]


class Platform(enum.Enum):
    CUDA = "cuda"
    ROCM = "rocm"
    CPU = "cpu"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> Platform:
        return parse_enum(cls, value, "platform")


def _non_negative_int(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    # bool is an int subclass; True as a version or arch number is always a mistake.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidValueError(attribute.name, value, "a non-negative integer")


# Numeric parts (three kept), then nothing, a local or build suffix (+cpu, -abc) or a
# pre/dev/post release tag (a0, rc1, .dev2025): "2.x" and "12.8garbage" are refused.
# ASCII digits only (\d would take "١٢"), and at most 18 of them, so int() never refuses.
_N = "[0-9]{1,18}"
_VERSION = re.compile(
    rf"^\s*v?({_N})(?:\.({_N}))?(?:\.({_N})(?:\.[0-9]+)*)?"
    r"(?=$|\s|[+\-~]|\.?(?:a|b|rc|dev|post)[0-9]*(?:$|[+.\-]))"
)


# Ordered by total_ordering from __lt__ rather than attrs' order=True, whose generic
# comparison measured 1.2 us against 0.2 us here (2-core dev VM, attrs 26.1): the rules
# compare versions and archs on every uncached decision, budgeted at 3000 dict lookups.
@functools.total_ordering
@attrs.frozen
class Version:
    """A release number, compared numerically: ``Version.parse("2.13.0+cpu") >= Version(2, 8)``."""

    major: int = attrs.field(validator=_non_negative_int)
    minor: int = attrs.field(default=0, validator=_non_negative_int)
    patch: int = attrs.field(default=0, validator=_non_negative_int)

    def __lt__(self, other: object) -> bool:
        # The exact class, as attrs' __eq__ requires: with isinstance, a subclass would
        # compare <= and >= but not ==, and total_ordering would disagree with itself.
        if not isinstance(other, Version) or type(other) is not type(self):
            return NotImplemented
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __ge__(self, other: object) -> bool:
        # Spelled out, not derived by total_ordering: MinTorch asks >= on every decision.
        if not isinstance(other, Version) or type(other) is not type(self):
            return NotImplemented
        return (self.major, self.minor, self.patch) >= (other.major, other.minor, other.patch)

    @classmethod
    def parse(cls, value: object) -> Version:
        """From a Version or text such as ``"12.8"``, ``"2.13.0+cpu"``, ``"7.0.51831-abc"``.
        An instance of a subclass comes back as this class, so it compares with the rest."""
        if isinstance(value, Version):
            return value if type(value) is cls else cls(value.major, value.minor, value.patch)
        match = _VERSION.match(str(value)) if isinstance(value, str) else None
        if match is None:
            raise InvalidValueError("version", value, "text such as '12.8' or '2.13.0+cpu'")
        return cls(*(int(part) for part in match.groups() if part is not None))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}"
        return f"{text}.{self.patch}" if self.patch else text


def as_version(value: object) -> Version:
    """``Version.parse`` as a plain function, for use as an attrs converter."""
    return Version.parse(value)


def as_platform(value: object) -> Platform:
    """``Platform.parse`` as a plain function, for use as an attrs converter."""
    return Platform.parse(value)


def _cuda_major(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 99:
        raise InvalidValueError("compute capability major", value, "an integer from 1 to 99")


def _cuda_minor(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 9:
        raise InvalidValueError("compute capability minor", value, "an integer from 0 to 9")


# "8.9", or nvcc's "sm_89", "sm_90a", "sm_100f": the suffix only narrows the compile
# target and says nothing the rules use, so it is accepted and dropped.
_CUDA_DOTTED = re.compile(r"^([0-9]{1,2})\.([0-9])$")
_CUDA_SM = re.compile(r"^(?:sm_|compute_)([0-9]{1,2})([0-9])[af]?$")


@functools.total_ordering
@attrs.frozen
class CudaArch:
    """An NVIDIA compute capability, e.g. ``CudaArch(8, 9)`` for Ada; ordered (major, minor)."""

    major: int = attrs.field(validator=_cuda_major)
    minor: int = attrs.field(validator=_cuda_minor)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, CudaArch) or type(other) is not type(self):  # as for Version
            return NotImplemented
        return (self.major, self.minor) < (other.major, other.minor)

    def __ge__(self, other: object) -> bool:
        # Spelled out, as for Version: MinComputeCapability asks >= on every decision.
        if not isinstance(other, CudaArch) or type(other) is not type(self):
            return NotImplemented
        return (self.major, self.minor) >= (other.major, other.minor)

    @classmethod
    def parse(cls, value: object) -> CudaArch:
        """From a CudaArch, ``"8.9"``, ``"sm_89"`` or ``"sm_90a"``; an instance of a
        subclass comes back as this class."""
        if isinstance(value, CudaArch):
            return value if type(value) is cls else cls(value.major, value.minor)
        text = value.strip().lower() if isinstance(value, str) else ""
        match = _CUDA_DOTTED.match(text) or _CUDA_SM.match(text)
        expected = "'major.minor' such as '8.9', or 'sm_89'"
        if match is None:
            raise InvalidValueError("CUDA compute capability", value, expected)
        try:
            return cls(int(match.group(1)), int(match.group(2)))
        except InvalidValueError:  # "0.5": well-formed, out of range; name what was given
            raise InvalidValueError("CUDA compute capability", value, expected) from None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# gfx + a 1-2 digit major and two hex digits: gfx90a, gfx942, gfx1100, gfx1201.
_GFX = re.compile(r"^gfx[0-9]{1,2}[0-9a-f]{2}$")
# MI300-series (gfx940/941/942) implement the fnuz FP8 variants in hardware; every later
# AMD architecture uses OCP e4m3fn (AMD CDNA3 ISA guide;
# docs/design.md#the-catalog-and-its-hardware-facts).
_FNUZ_ARCHS = frozenset({"gfx940", "gfx941", "gfx942"})


def _gfx_name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _GFX.match(value):
        raise InvalidValueError("AMD GPU architecture", value, "a gfx name such as 'gfx942'")


@attrs.frozen
class RocmArch:
    """An AMD GPU architecture, e.g. ``RocmArch("gfx942")`` for MI300X."""

    name: str = attrs.field(validator=_gfx_name)

    @classmethod
    def parse(cls, value: object) -> RocmArch:
        """From a RocmArch, a gfx name, or torch's ``gcnArchName`` (``gfx942:sramecc+:xnack-``)."""
        if isinstance(value, RocmArch):
            return value
        text = value.split(":", 1)[0].strip().lower() if isinstance(value, str) else value
        if not isinstance(text, str) or not _GFX.match(text):
            raise InvalidValueError(
                "AMD GPU architecture", value, "a gfx name such as 'gfx942' or 'gfx942:sramecc+'"
            )
        return cls(text)

    @property
    def native_fp8(self) -> Dtype:
        return Dtype.FLOAT8_E4M3FNUZ if self.name in _FNUZ_ARCHS else Dtype.FLOAT8_E4M3FN

    def __str__(self) -> str:
        return self.name


def _isa_flags(value: object) -> frozenset[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise InvalidValueError("CPU ISA flags", value, "a collection of flag names")
    return frozenset(str(flag).strip().lower() for flag in items)


def _machine_name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidValueError("CPU machine name", value, "a name such as 'x86_64' or 'aarch64'")


@attrs.frozen
class CpuArch:
    """A host CPU: machine name (``x86_64``, ``aarch64``) and ISA flags (``avx2``, ``amx_bf16``)."""

    machine: str = attrs.field(validator=_machine_name)
    isa: frozenset[str] = attrs.field(default=frozenset(), converter=_isa_flags)

    def __str__(self) -> str:
        flags = ", ".join(sorted(self.isa))
        return f"{self.machine} ({flags})" if flags else self.machine


Arch = CudaArch | RocmArch | CpuArch
