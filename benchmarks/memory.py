"""Peak resident memory while something runs, sampled from the operating system."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["peak_extra_rss", "resident_bytes"]

T = TypeVar("T")
_STATM = Path("/proc/self/statm")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``; 0 where it is unreadable)."""
    try:
        return int(_STATM.read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def peak_extra_rss(run: Callable[[], T], interval: float = 0.0005) -> tuple[T, int]:
    """``run()``'s result and the most resident memory it added above where it started.

    A thread samples the resident set every ``interval`` seconds; torch's kernels release
    the GIL, so the sampler sees the peaks of tensor work.
    """
    start = resident_bytes()
    peak = start
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, resident_bytes())
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run()
    finally:
        done.set()
        sampler.join()
    peak = max(peak, resident_bytes())
    return result, peak - start
