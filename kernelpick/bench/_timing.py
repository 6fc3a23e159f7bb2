"""Timing that holds up on a shared, noisy machine: medians of repeated runs after warm-up."""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable, Mapping

import torch

__all__ = ["median_ns", "median_seconds"]


def _sync(device: torch.device) -> None:
    # GPU work is asynchronous: a timer must wait for it to finish.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of ``run`` over ``repeats`` calls, after two warm-up calls."""
    for _ in range(2):
        run()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_ns(statement: str, names: Mapping[str, object], *, loops: int, repeats: int) -> float:
    """Median nanoseconds per execution of ``statement`` (``timeit``, ``loops`` a repeat)."""
    timer = timeit.Timer(statement, globals=dict(names))
    timer.timeit(max(1, loops // 10))  # warm-up
    return statistics.median(t / loops * 1e9 for t in timer.repeat(repeats, loops))
