"""What the integration logs while it works: one record per (device, config) a layer really
gets, a warning for a degraded choice, the full trace at DEBUG (turned on now or later), and
no handler of its own. The progress bar is in test_progress_bar.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch
from kernelpick.integration import (
    ModelConversionError,
    QuantizedLinearMethod,
    layer_state,
    load_quantized,
    quantize_model,
    save_quantized,
)
from kernelpick.integration import _log as log_module
from kernelpick.integration.convert import _swap as swap
from tests.support.models import SHAPES, linears

CPU = kp.device_profile("cpu")
A100 = kp.device_profile("a100")
# (in, out) of the linears: three shapes, repeated as a model's blocks repeat them.
# Every CPU W8A8 kernel disabled: a W8A8 scheme falls back to the weight-only stand-in.
W8A8_OFF = kp.Policy(
    disabled={
        "cpu_fp8_gemm",
        "cpu_rowwise_scaled_mm",
        "cpu_tensorwise_scaled_mm",
        "cpu_dequant_reference",
    }
)


@pytest.fixture(autouse=True)
def _fresh_log() -> Iterator[None]:
    # Selections are logged once per process: other tests may have logged these configs.
    log_module.forget_logged()
    yield
    log_module.forget_logged()


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("kernelpick") and r.levelno == level]


# -- logging ----------------------------------------------------------------------------


def test_each_device_and_config_is_logged_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    report = quantize_model(linears(copies=4), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(report.layers) == 12
    infos = _records(caplog, logging.INFO)
    assert len(infos) == 3  # one per shape, not one per layer
    assert all(r.name == "kernelpick.integration" for r in infos)
    messages = [r.getMessage() for r in infos]
    for message, (k, n) in zip(messages, SHAPES, strict=True):
        assert message.startswith('quantization="fp8_per_channel": cpu_fp8_gemm')
        assert f"on {CPU.name} for " in message
        assert f"N={n} K={k}" in message
    assert "(first at layer 'b0_0')" in messages[0]
    assert not _records(caplog, logging.WARNING)
    # Once per process: a second model of the same shapes adds nothing.
    caplog.clear()
    quantize_model(linears(copies=2), caps=CPU, policy=kp.Policy(), progress=False)
    assert not _records(caplog, logging.INFO)


def test_a_degraded_choice_warns_once_per_device_and_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kernelpick")
    method = QuantizedLinearMethod("fp8_per_tensor", A100, kp.Policy())
    layers = []
    for index, (k, n) in enumerate([(128, 256), (128, 256), (128, 256), (256, 128)]):
        layer = torch.nn.Module()  # selection only: an A100 kernel needs no A100 to choose
        method.create_weights(layer, k, [n], k, n, torch.bfloat16, prefix=f"layers.{index}")
        layers.append(layer)
    assert all(layer_state(layer).decision.degraded for layer in layers)
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 2
    message = warnings[0].getMessage()
    assert message.startswith('quantization="fp8_per_tensor": cuda_w8a16_cupy selected on')
    assert A100.name in message
    assert "N=256 K=128" in message
    assert "(first at layer 'layers.0')" in message
    assert "activations are not quantized" in message
    assert "N=128 K=256" in warnings[1].getMessage()


def test_quantize_model_warns_for_a_degraded_choice(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    model = linears(copies=2)
    report = quantize_model(model, "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
    assert all(layer.degraded for layer in report.layers)
    assert len(_records(caplog, logging.WARNING)) == 3
    assert not _records(caplog, logging.INFO)  # one record per config: the warning says it all
    assert "cpu_fp8_w8a16_gemm" in _records(caplog, logging.WARNING)[0].getMessage()


@pytest.mark.parametrize(
    ("scheme", "passed_over", "emulation"),
    [("fp8_per_tensor", "cpu_fp8_gemm", "cpu_tensorwise_scaled_mm"),
     ("int8_per_channel", "cpu_int8_gemm", "cpu_dequant_reference")],
)  # fmt: skip
def test_a_slow_choice_warns_once_per_device_and_config_with_its_reasons(
    caplog: pytest.LogCaptureFixture, scheme: str, passed_over: str, emulation: str
) -> None:
    """The cpu profile without its C++ toolchain: the compiled kernel is turned down for
    the missing tool and an emulation runs; a layer's selection is made before any weight
    exists, so an AVX2 profile selects on any host."""
    caplog.set_level(logging.INFO, logger="kernelpick")
    caps = attrs.evolve(CPU, features=CPU.features - {FEATURE_CPP_TOOLCHAIN})
    method = QuantizedLinearMethod(scheme, caps, kp.Policy())
    for index in range(3):  # three layers of one shape: one record
        method.create_weights(torch.nn.Module(), 64, [32], 64, 32, torch.float32,
                              prefix=f"layers.{index}")  # fmt: skip
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert not _records(caplog, logging.INFO)
    message = warnings[0].getMessage()
    assert message.startswith(f'quantization="{scheme}": {emulation} selected on')
    assert f"{passed_over}, ahead in preference order, was turned down only" in message
    assert "toolchain" in message
    assert f"{emulation} is a slow path" in message


def test_the_same_kernel_with_other_warnings_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One (device, config, kernel) first selected with no warning (its faster peer
    disabled by policy), then with one (the peer turned down for a missing tool): the
    WARNING is not taken as said by the INFO before it."""
    caplog.set_level(logging.INFO, logger="kernelpick")
    zen4 = CpuArch("x86_64", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                              "avx512vbmi", "avx512_bf16", "avx512_vnni"})  # fmt: skip
    caps = attrs.evolve(CPU, arch=zen4, features=CPU.features - {FEATURE_CPP_TOOLCHAIN})
    for policy in (kp.Policy(disabled={"cpu_int4_gemm"}), kp.Policy()):
        method = QuantizedLinearMethod("int4_weight_only", caps, policy)
        method.create_weights(torch.nn.Module(), 256, [64], 256, 64, torch.bfloat16)
    infos, warnings = _records(caplog, logging.INFO), _records(caplog, logging.WARNING)
    assert [r.getMessage().split(" selected")[0] for r in infos + warnings] == [
        'quantization="int4_weight_only": cpu_int4pack_mm'
    ] * 2
    assert "cpu_int4_gemm, ahead in preference order" in warnings[0].getMessage()


def test_debug_holds_the_full_trace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kernelpick")
    quantize_model(linears(copies=1), "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
    debug = _records(caplog, logging.DEBUG)
    assert len(debug) == 3
    config = kp.quant_config(
        "fp8_per_tensor", weight_shape=(128, 64), out_dtype="float32", bias=True
    )
    decision = kp.choose(CPU, config, W8A8_OFF)
    assert decision.render() in debug[0].getMessage()
    assert "cpu_rowwise_scaled_mm: disabled" in debug[0].getMessage()


def test_a_selection_nobody_heard_is_logged_once_someone_listens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kernelpick")
    quantize_model(linears(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert not caplog.records
    caplog.set_level(logging.INFO, logger="kernelpick")
    quantize_model(linears(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(_records(caplog, logging.INFO)) == 3


def test_debug_turned_on_later_gets_the_trace_held_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    quantize_model(linears(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(_records(caplog, logging.INFO)) == 3
    assert not _records(caplog, logging.DEBUG)
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="kernelpick")
    quantize_model(linears(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(_records(caplog, logging.DEBUG)) == 3  # the traces, not the summaries again
    assert not _records(caplog, logging.INFO)
    caplog.clear()
    quantize_model(linears(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert not caplog.records  # everything the logger lets through was said


def test_a_refused_conversion_logs_nothing_and_the_call_that_converts_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    model = linears(copies=1)
    weight = model["b0_2"].get_parameter("weight")
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(ModelConversionError):
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress=False)
    assert not caplog.records  # no layer got a kernel
    with torch.no_grad():
        weight[0, 0] = 0.0
    quantize_model(model, caps=CPU, policy=kp.Policy(), progress=False)
    assert len(_records(caplog, logging.INFO)) == 3


def test_a_stopped_conversion_logs_the_layers_it_converted(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    real = swap.Swaps.replace

    def replace(self: swap.Swaps, path: str, new: torch.nn.Module) -> None:
        if path == "b0_1":
            raise KeyboardInterrupt
        real(self, path, new)

    monkeypatch.setattr(swap.Swaps, "replace", replace)
    model = linears(copies=1)
    with pytest.raises(ModelConversionError):
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress=False)
    assert ["'b0_0'" in r.getMessage() for r in _records(caplog, logging.INFO)] == [True]
    caplog.clear()
    monkeypatch.setattr(swap.Swaps, "replace", real)
    quantize_model(model, caps=CPU, policy=kp.Policy(), progress=False)
    logged = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert [("'b0_1'" in m, "'b0_2'" in m) for m in logged] == [(True, False), (False, True)]


def test_a_loaded_checkpoint_and_a_cast_log_the_kernels_their_layers_get(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    model = linears(copies=1)
    quantize_model(model, caps=CPU, policy=kp.Policy(), progress=False)
    save_quantized(model, tmp_path)
    log_module.forget_logged()
    caplog.set_level(logging.INFO, logger="kernelpick")
    load_quantized(linears(copies=1, seed=1), tmp_path, CPU, kp.Policy())
    assert len(_records(caplog, logging.INFO)) == 3
    caplog.clear()
    model.to(torch.bfloat16)  # a new config for each layer: selected again, and logged
    logged = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert len(logged) == 3
    assert all("bfloat16 -> bfloat16" in message for message in logged)


def test_kernelpick_adds_no_handler_and_sets_no_level() -> None:
    quantize_model(linears(copies=1), "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
    for name in ("kernelpick", "kernelpick.integration"):
        logger = logging.getLogger(name)
        assert logger.handlers == []
        assert logger.level == logging.NOTSET
        assert logger.propagate
