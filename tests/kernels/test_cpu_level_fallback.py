"""A CPU kernel whose best ISA level does not compile falls back to the next one down."""

from __future__ import annotations

import logging

import pytest

import kernelpick as kp
from kernelpick.core import CpuArch
from kernelpick.kernels import _cpu_gemm
from kernelpick.kernels._cpu_build import KernelBuildError, levels_within
from kernelpick.kernels._cpu_gemm import CpuFp8Gemm
from tests.support.cpu_levels import LEVELS, NEEDS_A_LEVEL, caps_at

pytestmark = NEEDS_A_LEVEL

CONFIG = kp.quant_config("fp8_per_channel", weight_shape=(64, 128))


def _levels(caps: kp.DeviceCaps) -> list[str]:
    assert isinstance(caps.arch, CpuArch)
    return levels_within(caps.arch.isa)


def _failing(monkeypatch: pytest.MonkeyPatch, bad: str, compiler: bool) -> list[str]:
    """``_custom_op`` failing for level ``bad`` (as its compiler, or as something else);
    the levels it was asked for, in order."""
    asked: list[str] = []
    real = _cpu_gemm._custom_op

    def custom_op(level: str) -> object:
        asked.append(level)
        if level == bad:
            raise KernelBuildError(level, "c++: error: unrecognized command-line option")
        return real(level)

    monkeypatch.setattr(_cpu_gemm, "_custom_op", custom_op)
    monkeypatch.setattr(_cpu_gemm, "compile_failed", lambda level: compiler and level == bad)
    return asked


@pytest.mark.skipif(len(LEVELS) < 2, reason="needs a CPU that runs two ISA levels")
def test_a_level_that_does_not_compile_gives_way_to_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caps = caps_at(LEVELS[0])
    best, below = _levels(caps)[:2]
    asked = _failing(monkeypatch, best, compiler=True)
    monkeypatch.setattr(_cpu_gemm, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kernelpick.kernels"):
        bound = kp.bind("cpu_fp8_gemm", CONFIG, caps)
        again = kp.bind("cpu_fp8_gemm", CONFIG, caps)  # a model's next layer
    assert isinstance(bound, CpuFp8Gemm)
    assert isinstance(again, CpuFp8Gemm)
    assert bound.level == again.level == below
    assert asked == [best, below, best, below]
    # Said once per process, not once per layer.
    assert caplog.text.count(f"the {best} CPU kernel did not compile") == 1


def test_a_failure_that_is_not_the_compilers_is_raised_not_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    best = LEVELS[0]
    asked = _failing(monkeypatch, best, compiler=False)
    with pytest.raises(KernelBuildError):
        kp.bind("cpu_fp8_gemm", CONFIG, caps_at(best))
    assert asked == [best]


def test_when_no_level_compiles_the_best_levels_error_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    levels = _levels(caps_at(LEVELS[0]))

    def custom_op(level: str) -> object:
        raise KernelBuildError(level, f"{level} failed")

    monkeypatch.setattr(_cpu_gemm, "_custom_op", custom_op)
    monkeypatch.setattr(_cpu_gemm, "compile_failed", lambda level: True)
    with pytest.raises(KernelBuildError) as raised:
        kp.bind("cpu_fp8_gemm", CONFIG, caps_at(LEVELS[0]))
    assert raised.value.level == levels[0]
