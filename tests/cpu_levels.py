"""The compiled CPU kernels' ISA levels this host can run, for the tests that run each."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import CpuArch
from kernelpick.kernels._cpu_build import ISA_LEVELS

HOST = kp.probe("cpu")
HOST_ISA = HOST.arch.isa if isinstance(HOST.arch, CpuArch) else frozenset()
# Every level whose flags the host has; the others cannot run here.
LEVELS = [level for level, (flags, _) in ISA_LEVELS.items() if flags <= HOST_ISA]
NEEDS_A_LEVEL = pytest.mark.skipif(
    not LEVELS or "cpp_toolchain" not in HOST.features,
    reason="needs an x86 CPU with AVX2+FMA+F16C and a C++ toolchain",
)


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
