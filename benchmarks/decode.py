"""Decode speed of one FP8 linear layer on the CPU, against the best high-precision linear.

An LLM decodes a few tokens at a time: M is small, and a layer's time is the time to read
its weight from memory. So every callable here (the baselines and the kernels kernelpick
selects) rotates through several weights whose total is at least twice the last-level
cache, one weight a call, and each call reads its weight from DRAM, not from cache.

- Baselines: ``torch.nn.functional.linear`` in fp32, bf16 and fp16 (input and weight in
  that dtype). The best one at an M is the fastest of the three in this run.
- Candidates, through kernelpick's public API on ``kp.probe("cpu")``: ``ptpc``
  (``fp8_per_channel``, W8A8 with per-token activation scales) and ``w8a16``
  (``fp8_weight_only``), both with bf16 activations and bf16 output. Whatever kernel
  ``kp.choose`` selects is bound with ``kp.bind`` and run with ``apply``, activation
  quantization included; its id is recorded.
- Paired timing: within one repeat every callable is timed back to back (the order
  rotating from repeat to repeat); each figure is the median over the repeats of the
  per-repeat ratio, each absolute time the median of its own runs.
- The floor: memory read bandwidth is measured in the same run (the best pass of the
  fastest of a few streaming reductions over buffers larger than the cache). That op also
  reads the FP8 weight's bytes (rotated like the rest) as one more callable of the paired
  repeats: ``read_ms`` and ``*_vs_read`` are that read as the machine's load moved it.
  ``floor_ms`` is the FP8 weight's bytes over the better of the two bandwidths: no kernel
  that reads the weight once can be faster.
"""

from __future__ import annotations

import gc
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

import kernelpick as kp
from kernelpick.core import CpuArch
from kernelpick.kernels import CpuFp8Gemm, KernelBase, WeightBundle

__all__ = [
    "BASELINES",
    "BUFFER_BUDGET",
    "CANDIDATES",
    "FALLBACK_LLC_BYTES",
    "MIB",
    "Timed",
    "apply_call",
    "flat",
    "linear_call",
    "llc_bytes",
    "measure_bandwidth",
    "median_ratio",
    "nbytes",
    "paired",
    "rotation_count",
    "run_decode",
]

MIB = 2**20
FALLBACK_LLC_BYTES = 64 * MIB  # where sysfs does not say
# All rotation buffers of one shape together (3 baselines + 2 candidates), at most: a set
# never goes below 2 buffers, so a shape whose two fp32 weights exceed its share uses more.
BUFFER_BUDGET = 3 * 2**30
MAX_BUFFERS = 64
# Calls of one callable in a row, inside one timed block: enough to span about 10 ms at
# small M (timer and thread-pool wake-up noise), never more than 16 nor than its buffers.
BLOCK_SECONDS = 0.01
MAX_CALLS = 16
WARMUP_CALLS = 1  # then one more, timed alone, sizes the blocks
BASELINES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# Candidate name -> kernelpick scheme. Both run bf16 activations into a bf16 output.
CANDIDATES: dict[str, str] = {"ptpc": "fp8_per_channel", "w8a16": "fp8_weight_only"}
ACTIVATION = "bfloat16"
# Streaming reductions over a uint8 buffer (its size a multiple of 8): each reads every byte
# once and writes nothing. The fastest here measures the bandwidth, and times the "read"
# callable beside the kernels.
READ_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "uint8 max": torch.max,
    "int64 max": lambda b: b.view(torch.int64).max(),
    "float32 sum": lambda b: b.view(torch.float32).sum(),
}
_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def _parse_size(text: str) -> int:
    """Bytes of a sysfs cache size such as ``32768K``."""
    text = text.strip().upper()
    if text and text[-1] in _UNITS:
        return int(text[:-1]) * _UNITS[text[-1]]
    return int(text)


def llc_bytes(root: Path = _CACHE) -> tuple[int, str]:
    """The last-level (level 3) cache of CPU 0 in bytes, and where that figure came from;
    ``FALLBACK_LLC_BYTES`` where sysfs does not say."""
    sizes = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if level == 3 and kind != "Instruction":
            sizes.append(size)
    if sizes:
        return max(sizes), f"{root}/index*/size (level 3)"
    return FALLBACK_LLC_BYTES, "not in sysfs: 64 MiB assumed"


def _fastest_pass(run: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` runs after a warm-up: a floor is what the memory can do,
    and other work on a shared machine only ever slows a pass down."""
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_bandwidth(total_bytes: int, repeats: int) -> dict[str, Any]:
    """Memory read bandwidth: streaming reductions over 4 buffers of ``total_bytes`` in all
    (make it several times the last-level cache), the fastest op's best pass, in GB/s. Each op reads
    every byte once and writes nothing; which one is bandwidth-bound depends on torch's
    vectorization of it (int32 ``sum`` widens to int64 and is compute-bound, for one)."""
    each = max(MIB, total_bytes // 4) // 64 * 64
    # Written, not just allocated: a calloc'ed buffer would read the shared zero page.
    buffers = [torch.full((each,), i + 1, dtype=torch.uint8) for i in range(4)]
    by_op: dict[str, float] = {}
    with torch.inference_mode():
        for name, op in READ_OPS.items():

            def one_pass(op: Callable[[torch.Tensor], torch.Tensor] = op) -> None:
                for buffer in buffers:
                    op(buffer)

            by_op[name] = 4 * each / _fastest_pass(one_pass, max(3, repeats)) / 1e9
    best = max(by_op, key=by_op.__getitem__)
    buffers.clear()
    return {
        "bandwidth_gbps": by_op[best],
        "bandwidth_op": best,
        "bandwidth_by_op_gbps": by_op,
        "bandwidth_bytes": 4 * each,
    }


def rotation_count(bytes_each: int, target: int, cap: int) -> int:
    """Buffers in one rotation: at least ``target`` bytes in all, at most ``cap`` (never
    fewer than 2, never more than ``MAX_BUFFERS``)."""
    wanted = max(2, math.ceil(target / bytes_each))
    return max(2, min(wanted, cap // bytes_each, MAX_BUFFERS))


def nbytes(values: Sequence[object]) -> int:
    """Bytes of every tensor in ``values`` (a weight, or a bundle's tensors)."""
    return sum(v.untyped_storage().nbytes() for v in values if isinstance(v, torch.Tensor))


@attrs.define
class Timed:
    """One callable and its rotation: each call takes the next item, round the ring."""

    name: str
    call: Callable[[Any], object]
    items: Sequence[Any]
    cursor: int = 0
    calls: int = 1
    samples: list[float] = attrs.Factory(list)

    def once(self) -> None:
        item = self.items[self.cursor]
        self.cursor = (self.cursor + 1) % len(self.items)
        self.call(item)

    def block(self) -> float:
        """Seconds per call over ``calls`` calls in a row."""
        start = time.perf_counter()
        for _ in range(self.calls):
            self.once()
        return (time.perf_counter() - start) / self.calls

    def warm_up(self) -> None:
        for _ in range(WARMUP_CALLS):
            self.once()
        estimate = self.block()  # calls is 1 here
        # At most one pass round the ring: within a block no weight is read twice, and
        # between blocks every other callable streams its own weights through the cache.
        wanted = math.ceil(BLOCK_SECONDS / max(estimate, 1e-9))
        self.calls = max(1, min(MAX_CALLS, len(self.items), wanted))


def paired(timed: Sequence[Timed], repeats: int) -> None:
    """Every callable warmed up, then ``repeats`` rounds, each timing all of them back to
    back, starting one further along each round."""
    for one in timed:
        one.warm_up()
    for r in range(repeats):
        shift = r % len(timed)
        for one in (*timed[shift:], *timed[:shift]):
            one.samples.append(one.block())


@attrs.frozen
class _Candidate:
    name: str
    scheme: str
    kernel: KernelBase | None
    decision: str  # the kernel id, or why none was selected
    degraded: bool


def _candidate(name: str, scheme: str, caps: kp.DeviceCaps, n: int, k: int) -> _Candidate:
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype=ACTIVATION)
    decision = kp.choose(caps, config)
    if isinstance(decision, kp.Rejected):
        reasons = "; ".join(str(reason) for reason in decision.reasons)
        return _Candidate(name, scheme, None, f"rejected: {reasons}", False)
    kernel = kp.bind(decision, config, caps)
    return _Candidate(name, scheme, kernel, decision.kernel, decision.degraded)


def median_ratio(top: Sequence[float], bottom: Sequence[float]) -> float:
    return statistics.median(a / b for a, b in zip(top, bottom, strict=True))


def _shape(
    caps: kp.DeviceCaps,
    n: int,
    k: int,
    tokens: Sequence[int],
    repeats: int,
    target: int,
    bandwidth: dict[str, Any],
    seed: int,
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    candidates = [_candidate(name, s, caps, n, k) for name, s in CANDIDATES.items()]
    cap = BUFFER_BUDGET // (len(BASELINES) + len(CANDIDATES))
    counts = {
        name: rotation_count(n * k * dtype.itemsize, target, cap)
        for name, dtype in BASELINES.items()
    }
    fp8_count = rotation_count(n * k, target, cap)
    sources = [
        (torch.randn(n, k, generator=generator) / k**0.5).to(torch.bfloat16)
        for _ in range(max(fp8_count, *counts.values()))
    ]
    weights: dict[str, list[Any]] = {
        name: [source.to(dtype, copy=True) for source in sources[: counts[name]]]
        for name, dtype in BASELINES.items()
    }
    for candidate in candidates:
        if candidate.kernel is not None:
            quantize = candidate.kernel.quantize_weights
            weights[candidate.name] = [quantize(source) for source in sources[:fp8_count]]
    del sources
    # The FP8 weight's bytes, read by the bandwidth's op in the same repeats as the kernels:
    # a floor that moves with the machine's load as they do.
    read_bytes = math.ceil(n * k / 64) * 64
    weights["read"] = [
        torch.full((read_bytes,), i + 1, dtype=torch.uint8) for i in range(fp8_count)
    ]
    gc.collect()
    rotation = {
        name: {"buffers": len(items), "bytes": sum(nbytes(flat(item)) for item in items)}
        for name, items in weights.items()
    }
    fp8_bytes = n * k
    read = READ_OPS[bandwidth["bandwidth_op"]]
    samples: dict[int, dict[str, list[float]]] = {}
    with torch.inference_mode():
        for m in tokens:
            x = torch.randn(m, k, generator=generator)
            timed = [
                Timed(name, linear_call(x.to(dtype)), weights[name])
                for name, dtype in BASELINES.items()
            ]
            x_act = x.to(torch.bfloat16)
            timed += [
                Timed(c.name, apply_call(c.kernel, x_act), weights[c.name])
                for c in candidates
                if c.kernel is not None
            ]
            timed.append(Timed("read", read, weights["read"]))
            paired(timed, repeats)
            samples[m] = {t.name: t.samples for t in timed}
    del weights
    gc.collect()
    # The floor: the best bandwidth seen, up front or in any read among the repeats (a
    # busy machine slows one measurement, not necessarily both).
    fastest_read = min(t for by_name in samples.values() for t in by_name["read"])
    seen_gbps = max(bandwidth["bandwidth_gbps"], read_bytes / fastest_read / 1e9)
    floor_ms = fp8_bytes / (seen_gbps * 1e9) * 1e3
    rows = [_row(m, by_name, floor_ms) for m, by_name in samples.items()]
    return {
        "n": n,
        "k": k,
        "kernels": {c.name: c.decision for c in candidates},
        # The compiled CPU kernels' ISA build (avx2, avx512, avx512_bf16), where one ran.
        "builds": {c.name: c.kernel.level for c in candidates if isinstance(c.kernel, CpuFp8Gemm)},
        "degraded": {c.name: c.degraded for c in candidates},
        "fp8_weight_bytes": fp8_bytes,
        "read_gbps": read_bytes / fastest_read / 1e9,
        "floor_gbps": seen_gbps,
        "floor_ms": floor_ms,
        "rotation": rotation,
        "rows": rows,
    }


def flat(item: object) -> Sequence[object]:
    """The tensors of one rotation item: a bundle's, or the item itself."""
    return tuple(item) if isinstance(item, WeightBundle) else (item,)


def linear_call(x: torch.Tensor) -> Callable[[torch.Tensor], object]:
    """``F.linear`` of ``x`` with the weight it is handed (a baseline's rotation item)."""
    return lambda weight: torch.nn.functional.linear(x, weight)


def apply_call(kernel: KernelBase, x: torch.Tensor) -> Callable[[WeightBundle], object]:
    """``kernel.apply`` of ``x`` with the bundle it is handed (a candidate's rotation item)."""
    return lambda bundle: kernel.apply(x, bundle)


def _row(m: int, samples: dict[str, list[float]], floor_ms: float) -> dict[str, Any]:
    """One M: absolute medians (ms), the best baseline, and the paired ratios."""
    ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
    best = min(BASELINES, key=ms.__getitem__)
    row: dict[str, Any] = {
        "m": m, "ms": ms, "best": best, "best_ms": ms[best], "read_ms": ms.pop("read"),
    }  # fmt: skip
    for name in CANDIDATES:
        if name not in samples:
            continue  # no kernel selected for this scheme here
        row[f"{name}_vs_best"] = median_ratio(samples[name], samples[best])
        row[f"{name}_vs_fp32"] = median_ratio(samples[name], samples["fp32"])
        row[f"{name}_vs_floor"] = ms[name] / floor_ms
        row[f"{name}_vs_read"] = median_ratio(samples[name], samples["read"])
    return row


def run_decode(
    shapes: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    repeats: int,
    rotation_bytes: int | None = None,
    cpu_isa: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The decode figures for each ``(N, K)`` in ``shapes`` at each M in ``tokens``.

    ``rotation_bytes``: the bytes each rotation must at least span; None for twice the
    last-level cache (0 for just 2 buffers: a smoke run at tiny sizes). ``cpu_isa``: ISA
    flags to select and build with instead of the probed ones (say ``avx2, fma, f16c``, to
    time the AVX2 build on an AVX-512 CPU); a subset of the CPU's own.
    """
    caps = kp.probe("cpu")
    if cpu_isa is not None:
        caps = attrs.evolve(caps, arch=CpuArch(platform.machine(), cpu_isa))
    llc, llc_source = llc_bytes()
    target = 2 * llc if rotation_bytes is None else rotation_bytes
    bandwidth = measure_bandwidth(min(2**30, max(4 * target, 4 * MIB)), repeats)
    results = [
        _shape(caps, n, k, tokens, repeats, target, bandwidth, seed)
        for seed, (n, k) in enumerate(shapes)
    ]
    return {
        "llc_bytes": llc,
        "llc_source": llc_source,
        "rotation_target_bytes": target,
        **bandwidth,
        "repeats": repeats,
        "activation_dtype": ACTIVATION,
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "schemes": dict(CANDIDATES),
        "shapes": results,
    }
