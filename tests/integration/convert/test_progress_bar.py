"""quantize_model's progress bar: drawn on stderr where asked, and never a reason for the
conversion to fail or to change: a missing, closed or broken stderr turns the bar off."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
import torch
from tqdm import tqdm

import kernelpick as kp
from kernelpick.integration import ModelConversionError, QuantizedLinear, quantize_model
from kernelpick.integration.convert import _progress as progress_module
from kernelpick.integration.convert import _swap as swap
from tests.support.models import linears

CPU = kp.device_profile("cpu")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_true_draws_a_bar_of_the_layers(capsys: pytest.CaptureFixture[str]) -> None:
    quantize_model(linears(copies=2), caps=CPU, policy=kp.Policy(), progress=True)
    err = capsys.readouterr().err
    assert "quantize_model" in err
    assert "6/6" in err
    assert "layer" in err


def test_progress_none_draws_nothing_where_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert not sys.stderr.isatty()
    quantize_model(linears(copies=2), caps=CPU, policy=kp.Policy())
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("progress", "drawn"), [(None, True), (False, False)])
def test_on_a_terminal_the_bar_is_drawn_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch, progress: bool | None, drawn: bool
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    quantize_model(linears(copies=2), caps=CPU, policy=kp.Policy(), progress=progress)
    assert ("6/6" in terminal.getvalue()) is drawn
    assert (terminal.getvalue() == "") is not drawn


def test_progress_of_another_type_is_refused_before_anything_changes() -> None:
    model = linears(copies=1)
    with pytest.raises(kp.InvalidValueError, match=r"progress.*True, False, or None"):
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress="yes")  # type: ignore[arg-type]
    assert all(type(module) is torch.nn.Linear for module in model.values())


def test_the_bar_changes_nothing_the_conversion_does() -> None:
    shown, hidden = linears(copies=2), linears(copies=2)
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

    class Recording(progress_module._Bar):
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

    monkeypatch.setattr(progress_module, "_Bar", Recording)
    monkeypatch.setattr(swap.Swaps, "replace", replace)
    model = linears(copies=2)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=kp.Policy(), progress=True)
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert closed == [3]  # closed, having counted the three layers converted
    kinds = [type(module) for module in model.values()]
    assert kinds == [QuantizedLinear] * 3 + [torch.nn.Linear] * 3
    monkeypatch.setattr(swap.Swaps, "replace", real)
    report = quantize_model(model, caps=CPU, policy=kp.Policy(), progress=True)
    assert len(report.layers) == 3
    assert closed == [3, 3]


# -- a stderr that cannot be drawn on ------------------------------------------------------


def _converted(model: torch.nn.ModuleDict) -> list[bool]:
    return [type(module) is QuantizedLinear for module in model.values()]


@pytest.mark.parametrize("progress", [None, True, False])
def test_no_stderr_at_all_converts_without_a_bar(
    monkeypatch: pytest.MonkeyPatch, progress: bool | None
) -> None:
    # sys.stderr is None under pythonw, and for a script run with fd 2 closed (2>&-).
    monkeypatch.setattr(sys, "stderr", None)
    model = linears(copies=1)
    report = quantize_model(model, caps=CPU, policy=kp.Policy(), progress=progress)
    assert len(report.layers) == 3
    assert all(_converted(model))


@pytest.mark.parametrize("progress", [None, True])
def test_a_closed_stderr_converts_without_a_bar(
    monkeypatch: pytest.MonkeyPatch, progress: bool | None
) -> None:
    closed = io.StringIO()
    closed.close()  # isatty and write now raise ValueError
    monkeypatch.setattr(sys, "stderr", closed)
    model = linears(copies=1)
    quantize_model(model, caps=CPU, policy=kp.Policy(), progress=progress)
    assert all(_converted(model))


class _Gone(_Terminal):
    """A terminal whose reader goes away after ``writes`` writes (a closed pipe, a hung-up
    terminal): every later write raises ``error``."""

    def __init__(self, writes: int, error: Exception) -> None:
        super().__init__()
        self.writes, self.error = writes, error

    def write(self, text: Any) -> int:
        if self.writes <= 0:
            raise self.error
        self.writes -= 1
        return super().write(text)


# Errors tqdm does not swallow itself (it turns a bar off on EIO, and on a ValueError that
# says "closed"): a reader gone, a full disk, a detached stream.
ERRORS = [
    BrokenPipeError(32, "Broken pipe"),
    OSError(28, "No space left on device"),
    ValueError("underlying buffer has been detached"),
]


class _Eager(progress_module._Bar):
    """A bar that draws on every update, as one over slow layers does (tqdm waits 0.1 s)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["mininterval"] = 0
        super().__init__(**kwargs)


@pytest.mark.parametrize("writes", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_stderr_that_fails_to_draw_turns_the_bar_off_not_the_conversion(
    monkeypatch: pytest.MonkeyPatch, writes: int, error: Exception
) -> None:
    # writes: how far it draws before failing: as it starts, at an update, or as it closes.
    monkeypatch.setattr(progress_module, "_Bar", _Eager)
    monkeypatch.setattr(sys, "stderr", _Gone(writes, error))
    model, reference = linears(copies=1), linears(copies=1)
    bars = set(tqdm._instances)  # type: ignore[attr-defined]
    report = quantize_model(model, caps=CPU, policy=kp.Policy())  # None: "a terminal"
    assert report == quantize_model(reference, caps=CPU, policy=kp.Policy(), progress=False)
    assert all(_converted(model))
    # No bar is left registered with tqdm, whose later bars would be drawn below it.
    assert set(tqdm._instances) == bars  # type: ignore[attr-defined]


def test_a_bar_failing_to_close_does_not_hide_why_the_conversion_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, calls = swap.Swaps.replace, []

    def replace(self: swap.Swaps, path: str, new: torch.nn.Module) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, path, new)

    monkeypatch.setattr(swap.Swaps, "replace", replace)
    monkeypatch.setattr(sys, "stderr", _Gone(1, BrokenPipeError(32, "Broken pipe")))
    model = linears(copies=1)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=kp.Policy())
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert info.value.converted == ("b0_0",)
    assert _converted(model) == [True, False, False]
