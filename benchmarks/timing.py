"""Timing the decision, a pure host-side call of microseconds: ``timeit`` medians.

Kernel times are ``kernelpick.bench.median_seconds`` (CUDA events on a GPU), which
``kernelpick bench`` ships in the wheel; this helper serves the suite alone.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Mapping

__all__ = ["median_ns"]


def median_ns(statement: str, names: Mapping[str, object], *, loops: int, repeats: int) -> float:
    """Median nanoseconds per execution of ``statement`` (``timeit``, ``loops`` a repeat)."""
    timer = timeit.Timer(statement, globals=dict(names))
    timer.timeit(max(1, loops // 10))  # warm-up
    return statistics.median(t / loops * 1e9 for t in timer.repeat(repeats, loops))
