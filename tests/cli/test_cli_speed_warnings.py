"""`kernelpick explain` shows a selection's speed warnings: on the cpu profile without its
C++ toolchain (the newcomer's AVX2 machine without ninja) or without AVX2, fp8_per_tensor
and int8_per_channel run an emulation, and the text and the JSON say so."""

from __future__ import annotations

import json

import attrs
import pytest

import kernelpick as kp
from kernelpick.cli import _commands
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch
from tests.support.cli_run import run_cli

CPU = kp.device_profile("cpu")
VARIANTS = {
    "no-toolchain": attrs.evolve(CPU, features=CPU.features - {FEATURE_CPP_TOOLCHAIN}),
    "no-avx2": attrs.evolve(CPU, arch=CpuArch("x86_64", frozenset({"fma", "f16c"}))),
}


@pytest.fixture(autouse=True)
def _variants(monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = {**kp.device_profiles(), **VARIANTS}
    monkeypatch.setattr(_commands, "device_profile", lambda name: profiles[name])


@pytest.mark.parametrize("device", sorted(VARIANTS))
@pytest.mark.parametrize("scheme", ["fp8_per_tensor", "int8_per_channel"])
def test_explain_shows_the_speed_warning(device: str, scheme: str) -> None:
    status, out, _ = run_cli("explain", "--device", device, "--scheme", scheme)
    assert status == 0
    decision = kp.choose(VARIANTS[device], kp.quant_config(scheme, weight_shape=(4096, 4096)))
    assert isinstance(decision, kp.Selected)
    assert decision.warnings  # an emulation, in every variant
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: {w.render()}" for w in decision.warnings]
    assert any("is a slow path" in line for line in warnings)
    if device == "no-toolchain":
        assert any("turned down only for a missing tool" in line for line in warnings)
    status, out, _ = run_cli("explain", "--device", device, "--scheme", scheme, "--json")
    record = json.loads(out)
    assert [w["code"] for w in record["warnings"]] == [w.code.value for w in decision.warnings]


def test_a_full_toolchain_explains_without_warnings() -> None:
    status, out, _ = run_cli("explain", "--device", "cpu", "--scheme", "fp8_per_tensor")
    assert status == 0
    assert "warning:" not in out


def test_overlapping_commands_leave_the_library_logger_as_they_found_it() -> None:
    """Two commands in threads whose runs overlap (A starts, B starts, A ends, B ends):
    each removes only its own handler, and nothing else of the logger changes, so an
    application's own handlers still get kernelpick's records."""
    import contextlib
    import io
    import logging

    from kernelpick.cli import _library_log

    logger = logging.getLogger("kernelpick")
    handlers, propagate = list(logger.handlers), logger.propagate
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    first.enter_context(_library_log(io.StringIO()))
    second.enter_context(_library_log(io.StringIO()))
    first.close()
    second.close()
    assert logger.handlers == handlers
    assert logger.propagate is propagate
