"""Whether one benchmark fits this machine's memory, asked before anything is allocated.

A layer too large for the memory would otherwise end in torch's allocation traceback, or
with the process killed part-way. ``check_fits`` refuses it first, saying what it needs;
``allocation_failures`` turns an allocation that fails anyway (the estimate counts the
benchmark's own tensors, not every library temporary) into the same one-line error.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

from kernelpick.core import InvalidValueError

__all__ = ["allocation_failures", "available_bytes", "bench_bytes", "check_fits"]

_GIB = 2**30
_FP32 = 4


def bench_bytes(shape: tuple[int, int], tokens: int, itemsize: int) -> int:
    """The bytes ``bench_layer`` holds at its peak for an ``[N, K]`` layer, ``tokens`` rows
    and a layer dtype of ``itemsize`` bytes (``e``), the largest of its stages:

    - drawing the weight: an fp32 draw and its scaled copy, ``8 NK``;
    - loading it: the fp32 weight, the activations in fp32, the weight handed over in the
      layer's dtype and the layer's own copy of it, the FP8 weight: ``(5 + 2e) NK + 4 MK``;
    - running: the fp32 weight, its copy in the layer's dtype, the FP8 weight, the
      activations in fp32 and in the layer's dtype, ``(5 + e) NK + (4 + e) MK``, and the
      outputs: the reference, the kernel's in fp32 and their difference (``12 MN``), or
      while a kernel runs those two and its output and working copy of the activations
      (``(8 + e) MN + 5 MK``: quantized or decoded, fp32 at most, and FP8).
    """
    n, k = shape
    nk, mk, mn, e = n * k, tokens * k, tokens * n, itemsize
    drawing = 2 * _FP32 * nk
    loading = (_FP32 + 2 * e + 1) * nk + _FP32 * mk
    held = (_FP32 + e + 1) * nk + (_FP32 + e) * mk
    running = held + max(3 * _FP32 * mn, (2 * _FP32 + e) * mn + (_FP32 + 1) * mk)
    return max(drawing, loading, running)


def available_bytes(device: torch.device) -> int | None:
    """The memory free for a benchmark on ``device``: a GPU's free memory, or on the host
    what Linux says is available (MemAvailable), else its physical memory; None where
    neither can be read."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # reported in kB
                if available >= 0:
                    return available
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # no sysconf (Windows), or no such name
        return None


def _size(shape: tuple[int, int], tokens: int) -> str:
    n, k = shape
    return f"M={tokens} N={n} K={k}"


_LOWER = "lower --tokens (M) or --shape (N,K)"


def check_fits(shape: tuple[int, int], tokens: int, itemsize: int, device: torch.device) -> None:
    """Refuse a benchmark whose tensors take more memory than ``device`` has free (and, for
    a GPU, the host the random weight is drawn on), naming both amounts."""
    needed = bench_bytes(shape, tokens, itemsize)
    # Drawn on the host and then moved: on a GPU the host holds the weight's fp32 draw and
    # its scaled copy, or the activations, one at a time.
    n, k = shape
    host = max(2 * n * k, tokens * k) * _FP32
    places = [(device, needed)]
    if device.type == "cuda":
        places.append((torch.device("cpu"), host))
    for place, need in places:
        free = available_bytes(place)
        if free is not None and need > free:
            expected = (
                f"one that fits in memory: it needs {need / _GIB:.1f} GiB of {place.type} "
                f"memory and {free / _GIB:.1f} GiB is available; {_LOWER}"
            )
            raise InvalidValueError("benchmark size", _size(shape, tokens), expected)


# torch's words for an allocation that failed: the CPU allocator's RuntimeError, and the
# GPU's torch.OutOfMemoryError (a RuntimeError too).
_ALLOCATION_FAILED = re.compile(r"can't allocate memory|DefaultCPUAllocator|out of memory")
_TRIED = re.compile(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]?i?B|\d+ bytes)")


@contextlib.contextmanager
def allocation_failures(shape: tuple[int, int], tokens: int) -> Iterator[None]:
    """Within: an allocation that fails is ``InvalidValueError`` on one line, with what
    torch tried to allocate, not torch's traceback."""
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        text = str(error)
        if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and not (
            _ALLOCATION_FAILED.search(text)
        ):
            raise
        tried = _TRIED.search(text)
        what = f" (tried to allocate {tried.group(1)})" if tried else ""
        expected = f"one that fits in memory: allocating failed{what}; {_LOWER}"
        raise InvalidValueError("benchmark size", _size(shape, tokens), expected) from error
