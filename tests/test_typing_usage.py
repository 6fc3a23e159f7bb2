"""Runs the engine-usage module that mypy checks, so it is exercised, not only typed."""

from __future__ import annotations

import pytest

import kernelpick as kp
from kernelpick.core import ENV_DISABLED, ENV_FORCE, ENV_STRICT
from tests.typing import engine_usage


def test_engine_usage_selects_and_rejects_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (ENV_DISABLED, ENV_FORCE, ENV_STRICT):
        monkeypatch.delenv(variable, raising=False)
    assert engine_usage.kernel_for("h100", 4096, 4096) == "cuda_rowwise_scaled_mm"
    with pytest.raises(RuntimeError, match="my_w8a16: weight-only"):
        engine_usage.kernel_for("a100", 4096, 4096)
    assert engine_usage.fp8_range(kp.device_profile("mi300x")) == 224.0
    decision = kp.choose(
        kp.device_profile("cpu"), kp.quant_config("fp8_weight_only", weight_shape=(16, 16))
    )
    lines = engine_usage.trace_lines(decision)
    assert "cpu_w8a16_reference [W8A16]: ok" in lines
    assert lines[-1] == "cpu_wna16_reference [W8A16]: quant_dtype"
