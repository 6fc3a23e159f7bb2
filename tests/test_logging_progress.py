"""What the integration says while it works: one log record per (device, config) selected,
a warning for a degraded choice, the full trace at DEBUG, no handler of its own, and a
progress bar over quantize_model's layers that changes nothing else."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
import torch
from tqdm import tqdm

import kernelpick as kp
from kernelpick.integration import (
    Fp8Linear,
    Fp8LinearMethod,
    ModelConversionError,
    layer_state,
    quantize_model,
)
from kernelpick.integration import _convert as convert_module
from kernelpick.integration import _log as log_module
from kernelpick.integration import _swap as swap

CPU = kp.device_profile("cpu")
A100 = kp.device_profile("a100")
# (in, out) of the linears: three shapes, repeated as a model's blocks repeat them.
SHAPES = ((64, 128), (128, 64), (64, 32))
# Every CPU W8A8 kernel disabled: a W8A8 scheme falls back to the weight-only stand-in.
W8A8_OFF = kp.Policy(
    disabled={"cpu_rowwise_scaled_mm", "cpu_tensorwise_scaled_mm", "cpu_dequant_reference"}
)


@pytest.fixture(autouse=True)
def _fresh_log() -> Iterator[None]:
    # Selections are logged once per process: other tests may have logged these configs.
    log_module.forget_logged()
    yield
    log_module.forget_logged()


def _model(copies: int, seed: int = 0) -> torch.nn.ModuleDict:
    torch.manual_seed(seed)
    return torch.nn.ModuleDict(
        {
            f"b{j}_{i}": torch.nn.Linear(k, n)
            for j in range(copies)
            for i, (k, n) in enumerate(SHAPES)
        }
    )


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("kernelpick") and r.levelno == level]


# -- logging ----------------------------------------------------------------------------


def test_each_device_and_config_is_logged_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    report = quantize_model(_model(copies=4), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(report.layers) == 12
    infos = _records(caplog, logging.INFO)
    assert len(infos) == 3  # one per shape, not one per layer
    assert all(r.name == "kernelpick.integration" for r in infos)
    messages = [r.getMessage() for r in infos]
    for message, (k, n) in zip(messages, SHAPES, strict=True):
        assert message.startswith('quantization="fp8_per_channel": cpu_rowwise_scaled_mm')
        assert f"on {CPU.name} for " in message
        assert f"N={n} K={k}" in message
    assert "(first at layer 'b0_0')" in messages[0]
    assert not _records(caplog, logging.WARNING)
    # Once per process: a second model of the same shapes adds nothing.
    caplog.clear()
    quantize_model(_model(copies=2), caps=CPU, policy=kp.Policy(), progress=False)
    assert not _records(caplog, logging.INFO)


def test_a_degraded_choice_warns_once_per_device_and_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kernelpick")
    method = Fp8LinearMethod("fp8_per_tensor", A100, kp.Policy())
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
    model = _model(copies=2)
    report = quantize_model(model, "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
    assert all(layer.degraded for layer in report.layers)
    assert len(_records(caplog, logging.WARNING)) == 3
    assert not _records(caplog, logging.INFO)  # one record per config: the warning says it all
    assert "cpu_w8a16_reference" in _records(caplog, logging.WARNING)[0].getMessage()


def test_debug_holds_the_full_trace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kernelpick")
    quantize_model(_model(copies=1), "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
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
    quantize_model(_model(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert not caplog.records
    caplog.set_level(logging.INFO, logger="kernelpick")
    quantize_model(_model(copies=1), caps=CPU, policy=kp.Policy(), progress=False)
    assert len(_records(caplog, logging.INFO)) == 3


def test_kernelpick_adds_no_handler_and_sets_no_level() -> None:
    quantize_model(_model(copies=1), "fp8_per_tensor", caps=CPU, policy=W8A8_OFF, progress=False)
    for name in ("kernelpick", "kernelpick.integration"):
        logger = logging.getLogger(name)
        assert logger.handlers == []
        assert logger.level == logging.NOTSET
        assert logger.propagate


# -- the progress bar -------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_true_draws_a_bar_of_the_layers(capsys: pytest.CaptureFixture[str]) -> None:
    quantize_model(_model(copies=2), caps=CPU, policy=kp.Policy(), progress=True)
    err = capsys.readouterr().err
    assert "quantize_model" in err
    assert "6/6" in err
    assert "layer" in err


def test_progress_none_draws_nothing_where_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert not sys.stderr.isatty()
    quantize_model(_model(copies=2), caps=CPU, policy=kp.Policy())
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("progress", "drawn"), [(None, True), (False, False)])
def test_on_a_terminal_the_bar_is_drawn_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch, progress: bool | None, drawn: bool
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    quantize_model(_model(copies=2), caps=CPU, policy=kp.Policy(), progress=progress)
    assert ("6/6" in terminal.getvalue()) is drawn
    assert (terminal.getvalue() == "") is not drawn


def test_progress_of_another_type_is_refused_before_anything_changes() -> None:
    model = _model(copies=1)
    with pytest.raises(kp.InvalidValueError, match=r"progress.*True, False, or None"):
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress="yes")  # type: ignore[arg-type]
    assert all(type(module) is torch.nn.Linear for module in model.values())


def test_the_bar_changes_nothing_the_conversion_does() -> None:
    shown, hidden = _model(copies=2), _model(copies=2)
    with_bar = quantize_model(shown, caps=CPU, policy=kp.Policy(), progress=True)
    without = quantize_model(hidden, caps=CPU, policy=kp.Policy(), progress=False)
    assert with_bar == without
    for (name, a), (_, b) in zip(
        shown.state_dict().items(), hidden.state_dict().items(), strict=True
    ):
        assert a.dtype == b.dtype
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def test_an_interrupt_closes_the_bar_and_leaves_whole_layers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[float] = []

    class Recording(tqdm):  # type: ignore[type-arg]
        def close(self) -> None:
            if not self.disable:
                closed.append(self.n)
            super().close()

    real, calls = swap.Swaps.replace, []

    def replace(self: swap.Swaps, path: str, new: torch.nn.Module) -> None:
        calls.append(path)
        if len(calls) == 4:
            raise KeyboardInterrupt
        real(self, path, new)

    monkeypatch.setattr(convert_module, "tqdm", Recording)
    monkeypatch.setattr(swap.Swaps, "replace", replace)
    model = _model(copies=2)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress=True)
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert closed == [3]  # closed, having counted the three layers converted
    kinds = [type(module) for module in model.values()]
    assert kinds == [Fp8Linear] * 3 + [torch.nn.Linear] * 3
    monkeypatch.setattr(swap.Swaps, "replace", real)
    report = quantize_model(model, caps=CPU, policy=kp.Policy(), progress=True)
    assert len(report.layers) == 3
    assert closed == [3, 3]
