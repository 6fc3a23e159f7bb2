"""Device profiles: named DeviceCaps for real products, so selection is testable anywhere.

A profile describes a current stack: torch 2.13, CUDA 13.0, ROCm 7.2, cupy usable on
the CUDA profiles, and a C++ toolchain on the CPU profile
(docs/design.md#device-profiles). ``attrs.evolve`` changes any fact, e.g.
``attrs.evolve(kp.device_profile("a100"), libraries=frozenset())`` for an A100 without cupy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kernelpick.core._device import (
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    DeviceCaps,
)
from kernelpick.core._errors import UnknownNameError

__all__ = ["device_profile", "device_profiles"]

TORCH = "2.13.0"
# torch 2.13's builds (PyTorch's RELEASE.md): CUDA 12.6 and 13.0, 13.0 the default wheel's;
# ROCm 7.2. 13.0 meets every toolkit rule (block-wise FP8 on SM 9.x needs 12.9).
CUDA = "13.0"
ROCM = "7.2"
CUPY = ("cupy",)


def _nvidia(arch: str, name: str) -> DeviceCaps:
    return DeviceCaps.cuda(arch, name=name, torch_version=TORCH, cuda_version=CUDA, libraries=CUPY)


def _amd(arch: str, name: str) -> DeviceCaps:
    return DeviceCaps.rocm(arch, name=name, torch_version=TORCH, rocm_version=ROCM)


def _cpu(name: str, isa: tuple[str, ...]) -> DeviceCaps:
    # torch 2.13's CPU build runs _scaled_mm with scalar and row-wise scales, as measured
    # on a two-core AVX2 machine (docs/design.md#the-catalog-and-its-hardware-facts); a
    # current development stack has a C++ compiler and ninja for the compiled CPU kernels.
    return DeviceCaps.cpu(
        machine="x86_64",
        isa=isa,
        name=name,
        torch_version=TORCH,
        features=(FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE, FEATURE_CPP_TOOLCHAIN),
    )


_PROFILES: dict[str, DeviceCaps] = {
    "t4": _nvidia("7.5", "Tesla T4"),
    "a100": _nvidia("8.0", "NVIDIA A100-SXM4-80GB"),
    "a10g": _nvidia("8.6", "NVIDIA A10G"),
    "l4": _nvidia("8.9", "NVIDIA L4"),
    "l40s": _nvidia("8.9", "NVIDIA L40S"),
    "rtx4090": _nvidia("8.9", "NVIDIA GeForce RTX 4090"),
    "h100": _nvidia("9.0", "NVIDIA H100 80GB HBM3"),
    "h200": _nvidia("9.0", "NVIDIA H200"),
    "gh200": _nvidia("9.0", "NVIDIA GH200 480GB"),
    "b200": _nvidia("10.0", "NVIDIA B200"),
    # Row-wise scaled_mm on SM 12.x has failure reports (pytorch#192707) but a CUTLASS path
    # (pytorch#155991); the profile keeps row-wise until a real run says otherwise.
    "rtx5090": _nvidia("12.0", "NVIDIA GeForce RTX 5090"),
    "mi250x": _amd("gfx90a", "AMD Instinct MI250X"),
    "mi300x": _amd("gfx942", "AMD Instinct MI300X"),
    "mi325x": _amd("gfx942", "AMD Instinct MI325X"),
    "mi355x": _amd("gfx950", "AMD Instinct MI355X"),
    # The compiled CPU kernels need AVX2, FMA and F16C (CpuIsa), which every x86-64 CPU
    # since Haswell / Zen 1 has; their AVX-512 paths are chosen at build time, not by a
    # rule, so one CPU profile covers every such host.
    "cpu": _cpu("x86-64 CPU (AVX2)", ("avx2", "fma", "f16c")),
}

_VIEW: Mapping[str, DeviceCaps] = MappingProxyType(_PROFILES)


def device_profiles() -> Mapping[str, DeviceCaps]:
    """Every profile by name, read-only."""
    return _VIEW


def device_profile(name: str) -> DeviceCaps:
    """The profile called ``name`` (case-insensitive); ``UnknownNameError`` lists the names."""
    key = name.strip().lower() if isinstance(name, str) else name
    found = _PROFILES.get(key) if isinstance(key, str) else None
    if found is None:
        raise UnknownNameError("device profile", name, _PROFILES)
    return found
