"""What the GPU checks share: a case's context, GPU-side timing, operands rotated past the
L2 cache, and the fp32 reference of the quantized operands.

A callable is timed as a ring of thunks, one per rotated weight. Its calls are captured in
one CUDA graph (at least one pass round the ring, about 2 ms of GPU work) and the replays
are timed with CUDA events, so Python's launch overhead is not what is measured; where a
call cannot be captured, the same calls run back to back between one pair of events, and
the timing says so. Callables timed together have their replays interleaved, so a ratio is
the median of per-round ratios.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from kernelpick.core import Dtype, InvalidValueError, QuantConfig
from kernelpick.kernels import torch_dtype

__all__ = [
    "Context",
    "Skip",
    "Timing",
    "activation_reference",
    "copies",
    "cuda_device",
    "l2_bytes",
    "paired_ratio",
    "relative_error",
    "time_paired",
]

REPLAYS = 9  # timed replays of each callable (the median is reported), at least 3
REPLAY_MS = 2.0  # GPU time one replay should span
MAX_CALLS = 256
H200_L2 = 50 * 2**20  # when torch does not say
ROTATION_BUDGET = 8 * 2**30  # one ring's bytes, at most


class Skip(Exception):
    """Raised by a case that cannot run on this machine; the message says why."""


@attrs.frozen
class Context:
    """What the runner hands each case."""

    root: Path  # the repository
    out_dir: Path  # where the JSON goes, and any file a case writes
    deadline: float  # time.monotonic() past which a case cuts its repeats short


def cuda_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def l2_bytes() -> int:
    """The current GPU's last-level (L2) cache, from torch's device properties."""
    props = torch.cuda.get_device_properties(cuda_device())
    return int(getattr(props, "L2_cache_size", 0) or H200_L2)


def copies(bytes_each: int) -> int:
    """How many copies of a ``bytes_each`` operand a ring holds: at least twice the L2 in
    all (so every call reads its weight from HBM), never fewer than 2."""
    from benchmarks.rotation import rotation_count

    return rotation_count(bytes_each, 2 * l2_bytes(), ROTATION_BUDGET)


@attrs.frozen
class Timing:
    """One callable's time per call, in milliseconds."""

    ms: float  # the median over replays
    samples: tuple[float, ...]  # ms per call, one per replay
    calls: int  # calls per replay
    ring: int  # operands rotated
    method: str  # "graph", or "events" and why no graph was captured
    truncated: bool  # the case's time limit cut the replays short

    def record(self) -> dict[str, Any]:
        return {
            "ms": self.ms,
            "calls_per_replay": self.calls,
            "replays": len(self.samples),
            "ring": self.ring,
            "method": self.method,
            "truncated": self.truncated,
            "spread": (max(self.samples) - min(self.samples)) / self.ms,
        }


def paired_ratio(top: Timing, bottom: Timing) -> float:
    """The median of per-replay ratios (replays of the two were interleaved)."""
    return statistics.median(a / b for a, b in zip(top.samples, bottom.samples, strict=False))


def _elapsed_ms(run: Callable[[], object]) -> float:
    # torch ships torch.cuda.Event without annotations.
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _in_sequence(calls: Sequence[Callable[[], object]]) -> Callable[[], None]:
    def run() -> None:
        for call in calls:
            call()

    return run


def _replayable(ring: Sequence[Callable[[], object]]) -> tuple[Callable[[], object], int, str]:
    """Warm-up, then (one replay, calls in it, method)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        for _ in range(2):
            _in_sequence(ring)()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    per_call = _elapsed_ms(_in_sequence(ring)) / len(ring)
    wanted = math.ceil(REPLAY_MS / max(per_call, 1e-4) / len(ring))
    passes = max(1, min(wanted, MAX_CALLS // len(ring)))
    sequence = _in_sequence([ring[i % len(ring)] for i in range(passes * len(ring))])
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            sequence()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as error:  # a call that cannot be captured is timed as it is
        torch.cuda.synchronize()
        return sequence, passes * len(ring), f"events (no graph: {type(error).__name__}: {error})"
    return graph.replay, passes * len(ring), "graph"


def time_paired(
    rings: Mapping[str, Sequence[Callable[[], object]]], deadline: float
) -> dict[str, Timing]:
    """Each ring's time per call; replays interleaved, fewer when past ``deadline``
    (``time.monotonic()``)."""
    prepared = {name: _replayable(ring) for name, ring in rings.items()}
    names = list(prepared)
    samples: dict[str, list[float]] = {name: [] for name in names}
    truncated = False
    for r in range(REPLAYS):
        if r >= 3 and time.monotonic() > deadline:
            truncated = True
            break
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run, calls, _ = prepared[name]
            samples[name].append(_elapsed_ms(run) / calls)
    return {
        name: Timing(
            statistics.median(samples[name]),
            tuple(samples[name]),
            prepared[name][1],
            len(rings[name]),
            prepared[name][2],
            truncated,
        )
        for name in names
    }


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want).clamp(min=1e-30))


def _group_values(v: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """``v`` zero-padded to whole groups, viewed ``[gm, r, gk, c]``, and (r, c)."""
    m, k = v.shape
    r, c = (m if rows == -1 else rows), (k if cols == -1 else cols)
    gm, gk = -(-m // r), -(-k // c)
    padded = torch.nn.functional.pad(v, (0, gk * c - k, 0, gm * r - m))
    return padded.view(gm, r, gk, c), (r, c)


def activation_reference(
    x: torch.Tensor, config: QuantConfig, fp8: Dtype, input_scale: torch.Tensor | None
) -> torch.Tensor:
    """The activation as a W8A8 kernel should quantize it, dequantized to fp32: the formula
    of docs/design.md#quantization-numerics, written out here with exact fp32 division, so
    it does not share code (or a bug) with the kernels' quantizers."""
    act = config.activation
    v = x.float()
    if act is None:
        return v
    fmt = Dtype.INT8 if act.dtype is Dtype.INT8 else fp8
    qmax = fmt.quant_max
    m, k = v.shape
    if act.scale.static:
        if input_scale is None:
            raise InvalidValueError("input_scale", None, "a tensor (the config is static)")
        scale = input_scale.float().reshape(1, 1)
        r, c = m, k
    else:
        grouped, (r, c) = _group_values(v.abs(), act.scale.group.rows, act.scale.group.cols)
        amax = grouped.amax(dim=(1, 3))
        if act.scale.dtype is Dtype.FLOAT8_E8M0FNU:
            exponent = torch.frexp(amax).exponent - 1 - math.floor(math.log2(qmax))
            scale = torch.ldexp(torch.ones_like(amax), exponent.clamp_(-127, 127))
        else:
            scale = (amax / qmax).clamp_(min=1.0 / (qmax * 512.0))
    full = scale.repeat_interleave(r, dim=0)[:m].repeat_interleave(c, dim=1)[:, :k]
    q = (v / full).clamp_(-qmax, qmax)
    q = q.round_() if fmt is Dtype.INT8 else q.to(torch_dtype(fmt)).float()
    return q * full
