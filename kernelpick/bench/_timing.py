"""Timing that holds up on a shared, noisy machine: medians of repeated runs after warm-up.

On a GPU each run is timed with CUDA events recorded on the stream (HIP events on ROCm, whose
torch also says ``cuda``): a host clock would time the launch, not the work, unless it waits
for the GPU after every run, and then it also times that wait.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["median_seconds", "timer_for"]

Timer = Callable[[Callable[[], object]], float]


def _wall_seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _cuda_seconds(run: Callable[[], object]) -> float:
    # torch ships torch.cuda.Event without annotations.
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    run()
    end.record()
    end.synchronize()  # elapsed_time needs both events to have completed
    return float(start.elapsed_time(end)) / 1e3  # milliseconds


def timer_for(device: torch.device) -> Timer:
    """The seconds one call of a function takes on ``device``: CUDA events on a GPU, the host
    clock elsewhere."""
    return _cuda_seconds if device.type == "cuda" else _wall_seconds


def median_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median time of ``run`` on ``device`` over ``repeats`` calls, after two warm-up calls."""
    timer = timer_for(device)
    gpu = device.type == "cuda"
    # Events are recorded on the current stream of the current device: make that ``device``.
    with torch.cuda.device(device) if gpu else contextlib.nullcontext():
        for _ in range(2):
            run()
        if gpu:
            torch.cuda.synchronize(device)  # the warm-up's work must not land in the first run
        return statistics.median(timer(run) for _ in range(repeats))
