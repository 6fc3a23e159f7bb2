"""``quantize_model``'s progress bar: a tqdm bar on stderr that never changes the conversion.

stderr may be missing (``None`` under pythonw or with fd 2 closed, ``2>&-``), closed, or a
pipe whose reader is gone. None of that is the conversion's business: where there is no
stream to draw on the bar is off, and a bar that fails to draw turns itself off and says
nothing more. Only ``OSError`` and ``ValueError`` (what a dead or closed stream raises) are
caught; an interrupt while drawing still stops the conversion, as anywhere else.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, NoReturn

from tqdm import tqdm

__all__ = ["ProgressBar", "is_terminal"]

_DRAWING_ERRORS = (OSError, ValueError)


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is an open terminal; False for None, a closed file, or an object
    without ``isatty``."""
    isatty = getattr(stream, "isatty", None)
    if not callable(isatty):
        return False
    try:
        return bool(isatty())
    except _DRAWING_ERRORS:  # a closed file raises ValueError
        return False


def _open(stream: object) -> bool:
    return stream is not None and not getattr(stream, "closed", False)


class _Bar(tqdm):  # type: ignore[type-arg]
    """tqdm's bar, which registers itself before its first draw: one whose first draw fails
    is closed (unregistered) before the error goes on, not left among tqdm's instances,
    below which every later bar of the process would be drawn."""

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except _DRAWING_ERRORS:
            with contextlib.suppress(*_DRAWING_ERRORS):
                self.close()
            raise


class ProgressBar:
    """A bar of ``total`` layers on stderr. ``progress``: None shows it where stderr is a
    terminal (so logs and CI output get no carriage-return noise), True wherever stderr is
    open, False never."""

    def __init__(self, progress: bool | None, total: int) -> None:
        stream = sys.stderr
        shown = is_terminal(stream) if progress is None else progress and _open(stream)
        self._bar: tqdm[NoReturn] | None = None  # iterates nothing
        if shown:
            try:  # tqdm draws the empty bar as it starts
                self._bar = _Bar(total=total, desc="quantize_model", unit="layer", file=stream)
            except _DRAWING_ERRORS:
                self._bar = None

    def update(self, count: int) -> None:
        if self._bar is None:
            return
        try:
            self._bar.update(count)
        except _DRAWING_ERRORS:
            self._off()

    def close(self) -> None:
        """Leave the terminal on a fresh line; never raises a drawing error, so it cannot
        hide the error a conversion was stopped by."""
        self._off()

    def _off(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            # tqdm marks the bar closed before it writes, so a failure here ends it too.
            with contextlib.suppress(*_DRAWING_ERRORS):
                bar.close()
