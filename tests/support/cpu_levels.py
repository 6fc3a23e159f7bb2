"""The compiled CPU kernels' ISA levels this host can run, for the tests that run each."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch
from kernelpick.core._catalog_facts import INT8_DOT_ISA
from kernelpick.kernels._cpu_build import ISA_LEVELS, isa_level, levels_within

HOST = kp.probe("cpu")
HOST_ISA = HOST.arch.isa if isinstance(HOST.arch, CpuArch) else frozenset()
# Every level whose flags the host has; the others cannot run here.
LEVELS = levels_within(HOST_ISA)
NEEDS_A_LEVEL = pytest.mark.skipif(
    not LEVELS or "cpp_toolchain" not in HOST.features,
    reason="needs an x86 CPU with AVX2+FMA+F16C and a C++ toolchain",
)


# torch._int_mm on a CPU sums right only with an int8 dot product (INT8_DOT_ISA): a test that
# runs it on this host runs where the catalog would select it, and says why it skips elsewhere.
NEEDS_INT8_DOT = pytest.mark.skipif(
    not INT8_DOT_ISA.flags & HOST_ISA,
    reason=f"torch._int_mm is exact on a CPU only with one of {sorted(INT8_DOT_ISA.flags)}; "
    "this CPU has none (cpu_int8_int_mm is turned down here)",
)


def with_int8_dot(caps: kp.DeviceCaps) -> kp.DeviceCaps:
    """``caps`` of a CPU that also has VNNI, where the catalog selects ``cpu_int8_int_mm``:
    the VNNI flag that leaves the level they select as it was (AVX-VNNI is a level of its
    own without AVX-512, AVX512-VNNI one with it)."""
    arch = caps.arch
    assert isinstance(arch, CpuArch)
    level = isa_level(arch.isa)
    for flag in ("avx_vnni", "avx512_vnni"):
        if flag in arch.isa or isa_level(arch.isa | {flag}) == level:
            return with_flags(caps, flag)
    raise AssertionError(f"every VNNI flag changes the level of {sorted(arch.isa)}")


def with_flags(caps: kp.DeviceCaps, *flags: str) -> kp.DeviceCaps:
    """``caps`` of a CPU that also has ``flags``."""
    arch = caps.arch
    assert isinstance(arch, CpuArch)
    return attrs.evolve(caps, arch=attrs.evolve(arch, isa=arch.isa | set(flags)))


def skip_unless_runs(level: str) -> pytest.MarkDecorator:
    """Skips a test of ``level`` where this host cannot run it, naming what it lacks."""
    missing = sorted(ISA_LEVELS[level][0] - HOST_ISA)
    if missing:
        return pytest.mark.skip(reason=f"this CPU lacks the {level} level's {', '.join(missing)}")
    return pytest.mark.skipif(
        FEATURE_CPP_TOOLCHAIN not in HOST.features, reason=f"{level} needs a C++ toolchain"
    )


# Every level, as a parameter: a test of each runs where the host can run it and is skipped,
# with the flags it lacks, elsewhere (so a run shows which levels it left out).
EVERY_LEVEL = [pytest.param(level, marks=skip_unless_runs(level), id=level) for level in ISA_LEVELS]


def caps_at(level: str) -> kp.DeviceCaps:
    """This host's caps with exactly ``level``'s flags, so binding builds that level."""
    flags, _ = ISA_LEVELS[level]
    return attrs.evolve(HOST, arch=CpuArch("x86_64", flags))


def on_one_and_two_threads(call: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``call()`` with torch on one thread, then on two; the thread count is put back."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = call()
        torch.set_num_threads(2)
        two = call()
    finally:
        torch.set_num_threads(threads)
    return one, two
