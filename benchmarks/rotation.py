"""What the CPU benchmarks share: weights rotated past the cache, paired timing, and the
candidates (kernels kernelpick selects) timed against ``F.linear`` baselines.

Every callable rotates through several weights whose total is at least a target (twice the
last-level cache), one weight a call, so each call reads its weight from DRAM. Within one
repeat every callable is timed back to back, the order rotating from repeat to repeat.
"""

from __future__ import annotations

import functools
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import torch

import kernelpick as kp
from kernelpick.integration import quantize_model
from kernelpick.kernels import CpuFp8Gemm, KernelBase, WeightBundle

__all__ = [
    "BASELINES",
    "BUFFER_BUDGET",
    "INT8PACK",
    "Candidate",
    "Peer",
    "Timed",
    "apply_call",
    "candidate",
    "flat",
    "layer_peer",
    "linear_call",
    "median_ratio",
    "nbytes",
    "paired",
    "ratio_row",
    "rotated_weights",
    "rotation_count",
    "shape_record",
    "time_tokens",
]

# All rotation buffers of one shape together (baselines and candidates), at most: a set
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


def rotation_count(bytes_each: int, target: int, cap: int) -> int:
    """Buffers in one rotation: at least ``target`` bytes in all, at most ``cap`` (never
    fewer than 2, never more than ``MAX_BUFFERS``)."""
    wanted = max(2, math.ceil(target / bytes_each))
    return max(2, min(wanted, cap // bytes_each, MAX_BUFFERS))


def nbytes(values: Sequence[object]) -> int:
    """Bytes of every tensor in ``values`` (a weight, or a bundle's tensors), and of an
    item another library holds, which states its own (``nbytes``)."""
    return sum(
        v.untyped_storage().nbytes() if isinstance(v, torch.Tensor) else getattr(v, "nbytes", 0)
        for v in values
    )


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
class Peer:
    """A callable timed beside the candidates in the same repeats, which kernelpick does not
    select: another library's op, or a candidate's layer as a user gets it (``layer_peer``).
    ``make(source, dtype)`` turns one bf16 source weight into its
    rotation item for activations of ``dtype``, ``call(x, item)`` runs it on them."""

    name: str
    make: Callable[[torch.Tensor, torch.dtype], Any]
    call: Callable[[torch.Tensor, Any], object]


def _int8pack_weight(source: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # Symmetric per-channel int8, the layout torch._weight_int8pack_mm reads: [N, K] int8
    # and [N] scales in the activations' dtype.
    scale = (source.float().abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    weight = (source.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return weight, scale.to(dtype)


def layer_peer(name: str, scheme: str, caps: kp.DeviceCaps) -> Peer:
    """``name``'s layer as a user gets it: an ``nn.Linear`` of the source weight (fp32,
    no bias) converted by ``quantize_model`` for ``scheme`` on ``caps``, then cast to the
    activations' dtype as a bf16 model is (fp32 stays as it is), and called as a module.
    Timed beside ``kernel.apply`` on the same bytes, it shows what the layer adds per call
    (selection, preparation, copies, casts)."""

    def make(source: torch.Tensor, dtype: torch.dtype) -> torch.nn.Module:
        n, k = source.shape
        linear = torch.nn.Linear(k, n, bias=False)
        with torch.no_grad():
            linear.weight.copy_(source.float())
        model = torch.nn.Sequential(linear)
        quantize_model(model, scheme, caps=caps, progress=False)
        return model.to(dtype)

    return Peer(f"{name}_module", make, lambda x, model: model(x))


# torch's own int8 weight-only CPU GEMM, the peer a torch user would reach for first.
INT8PACK = Peer(
    "int8pack",
    _int8pack_weight,
    lambda x, item: torch._weight_int8pack_mm(x, item[0], item[1]),
)


@attrs.frozen
class Candidate:
    """One timed layer: the kernel kernelpick selected for its config (None: rejected)."""

    name: str
    kernel: KernelBase | None
    decision: str  # the kernel id, or why none was selected
    degraded: bool


def candidate(
    name: str, config: kp.QuantConfig, caps: kp.DeviceCaps, policy: kp.Policy | None = None
) -> Candidate:
    """``config``'s choice on ``caps`` (under ``policy``), bound, or the rejection's reasons."""
    decision = kp.choose(caps, config, policy or kp.Policy())
    if isinstance(decision, kp.Rejected):
        reasons = "; ".join(str(reason) for reason in decision.reasons)
        return Candidate(name, None, f"rejected: {reasons}", False)
    return Candidate(name, kp.bind(decision, config, caps), decision.kernel, decision.degraded)


def median_ratio(top: Sequence[float], bottom: Sequence[float]) -> float:
    return statistics.median(a / b for a, b in zip(top, bottom, strict=True))


def ratio_row(m: int, samples: dict[str, list[float]], candidates: Iterable[str]) -> dict[str, Any]:
    """One M: absolute medians (ms), the best baseline, and each candidate's paired ratios
    to it and to fp32 (a candidate missing from ``samples`` had no kernel selected here)."""
    ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
    best = min(BASELINES, key=ms.__getitem__)
    row: dict[str, Any] = {"m": m, "ms": ms, "best": best, "best_ms": ms[best]}
    for name in candidates:
        if name in samples:
            row[f"{name}_vs_best"] = median_ratio(samples[name], samples[best])
            row[f"{name}_vs_fp32"] = median_ratio(samples[name], samples["fp32"])
    return row


def flat(item: object) -> Sequence[object]:
    """The tensors of one rotation item: a bundle's, or the item itself."""
    return tuple(item) if isinstance(item, WeightBundle) else (item,)


def linear_call(x: torch.Tensor) -> Callable[[torch.Tensor], object]:
    """``F.linear`` of ``x`` with the weight it is handed (a baseline's rotation item)."""
    return lambda weight: torch.nn.functional.linear(x, weight)


def apply_call(kernel: KernelBase, x: torch.Tensor) -> Callable[[WeightBundle], object]:
    """``kernel.apply`` of ``x`` with the bundle it is handed (a candidate's rotation item)."""
    return lambda bundle: kernel.apply(x, bundle)


def rotated_weights(
    n: int, k: int, candidates: Sequence[Candidate], target: int, generator: torch.Generator,
    peers: Sequence[Peer] = (), activation: torch.dtype = torch.bfloat16,
) -> tuple[dict[str, list[Any]], int]:  # fmt: skip
    """Each baseline's weights in its dtype, each candidate's bundles and each peer's
    items (for ``activation``), every rotation at least ``target`` bytes (within
    ``BUFFER_BUDGET`` for the shape), from the same random bf16 weights; and how many
    one-byte (FP8 or int8) weights each candidate (and peer) rotates."""
    cap = BUFFER_BUDGET // (len(BASELINES) + len(candidates) + len(peers))
    counts = {
        name: rotation_count(n * k * dtype.itemsize, target, cap)
        for name, dtype in BASELINES.items()
    }
    # Bytes per quantized weight: one (FP8, int8), or half where a candidate packs int4.
    bits = min((c.kernel.config.weight.dtype.bits for c in candidates if c.kernel), default=8)
    quantized = rotation_count(n * k * bits // 8, target, cap)
    sources = [
        (torch.randn(n, k, generator=generator) / k**0.5).to(torch.bfloat16)
        for _ in range(max(quantized, *counts.values()))
    ]
    weights: dict[str, list[Any]] = {
        name: [source.to(dtype, copy=True) for source in sources[: counts[name]]]
        for name, dtype in BASELINES.items()
    }
    for c in candidates:
        if c.kernel is not None:
            weights[c.name] = [c.kernel.quantize_weights(s) for s in sources[:quantized]]
    for peer in peers:
        weights[peer.name] = [peer.make(s, activation) for s in sources[:quantized]]
    del sources
    gc.collect()
    return weights, quantized


def time_tokens(
    tokens: Sequence[int],
    k: int,
    generator: torch.Generator,
    candidates: Sequence[Candidate],
    weights: dict[str, list[Any]],
    repeats: int,
    extra: Sequence[Timed] = (),
    peers: Sequence[Peer] = (),
    activation: torch.dtype = torch.bfloat16,
) -> dict[int, dict[str, list[float]]]:
    """Per M, every callable's samples: the baselines, the candidates and the peers (on
    ``activation``s) and ``extra``, paired. ``extra``'s samples start afresh at each M."""
    samples: dict[int, dict[str, list[float]]] = {}
    with torch.inference_mode():
        for m in tokens:
            x = torch.randn(m, k, generator=generator)
            timed = [
                Timed(name, linear_call(x.to(dtype)), weights[name])
                for name, dtype in BASELINES.items()
            ]
            x_act = x.to(activation)
            timed += [
                Timed(c.name, apply_call(c.kernel, x_act), weights[c.name])
                for c in candidates
                if c.kernel is not None
            ]
            timed += [
                Timed(p.name, functools.partial(p.call, x_act), weights[p.name]) for p in peers
            ]
            timed += [Timed(t.name, t.call, t.items) for t in extra]
            paired(timed, repeats)
            samples[m] = {t.name: t.samples for t in timed}
    return samples


def shape_record(
    n: int, k: int, candidates: Sequence[Candidate], weights: dict[str, list[Any]]
) -> dict[str, Any]:
    """What a shape's record says of its candidates and rotations, rows aside."""
    return {
        "n": n,
        "k": k,
        "kernels": {c.name: c.decision for c in candidates},
        # The compiled CPU kernels' ISA build (_cpu_build.ISA_LEVELS), where one ran.
        "builds": {c.name: c.kernel.level for c in candidates if isinstance(c.kernel, CpuFp8Gemm)},
        "degraded": {c.name: c.degraded for c in candidates},
        "rotation": {
            name: {"buffers": len(items), "bytes": sum(nbytes(flat(item)) for item in items)}
            for name, items in weights.items()
        },
    }
