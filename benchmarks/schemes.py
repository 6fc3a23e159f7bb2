"""Block FP8 and int8 layers on the CPU against the best high-precision linear.

``decode.py`` times the per-channel FP8 schemes; this module times the others on the same
method, with its helpers: every callable rotates through weights totalling at least twice
the last-level cache, timing is paired (all callables back to back in each repeat, the
order rotating) and each figure is the median of per-repeat ratios.

- Baselines: ``F.linear`` in fp32, bf16 and fp16; "best" is the fastest at that M.
- Candidates, each the kernel ``kp.choose`` selects on ``kp.probe("cpu")`` (its id is
  recorded), bound with ``kp.bind`` and run with ``apply``, bf16 in and out:
  ``block`` (``fp8_block``: 1 x 128 dynamic activation groups, 128 x 128 weight blocks),
  ``block_w8a16`` (128 x 128 weight blocks, weight-only), ``int8`` (``int8_per_channel``:
  per-token int8 activations, per-channel int8 weights) and, for comparison in the same
  repeats, ``ptpc`` (``fp8_per_channel``).
"""

from __future__ import annotations

import gc
import platform
import statistics
from collections.abc import Sequence
from typing import Any

import attrs
import torch

import kernelpick as kp
from benchmarks.decode import (
    BASELINES,
    BUFFER_BUDGET,
    MIB,
    Timed,
    apply_call,
    flat,
    linear_call,
    llc_bytes,
    median_ratio,
    nbytes,
    paired,
    rotation_count,
)
from kernelpick.core import CpuArch, Dtype, GroupShape, QuantKey, ScaleSpec
from kernelpick.kernels import CpuFp8Gemm, KernelBase

__all__ = ["CANDIDATES", "SCHEME_TOKENS", "render_schemes", "run_schemes"]

# Candidate name -> the scheme it times (``block_w8a16`` is not a named scheme: weight-only
# with block scales, see _config).
CANDIDATES: dict[str, str] = {
    "block": "fp8_block",
    "block_w8a16": "fp8 128x128 blocks, weight-only",
    "int8": "int8_per_channel",
    "ptpc": "fp8_per_channel",
}
SCHEME_TOKENS = (1, 16, 256)
ACTIVATION = "bfloat16"


def _config(name: str, n: int, k: int) -> kp.QuantConfig:
    if name == "block_w8a16":
        weight = QuantKey(Dtype.FLOAT8_E4M3FN, ScaleSpec(GroupShape.block(128), static=True))
        return kp.QuantConfig(weight, None, (n, k), ACTIVATION, ACTIVATION)
    return kp.quant_config(CANDIDATES[name], weight_shape=(n, k), out_dtype=ACTIVATION)


@attrs.frozen
class _Candidate:
    name: str
    kernel: KernelBase | None
    decision: str  # the kernel id, or why none was selected
    degraded: bool


def _candidate(name: str, caps: kp.DeviceCaps, n: int, k: int) -> _Candidate:
    config = _config(name, n, k)
    decision = kp.choose(caps, config)
    if isinstance(decision, kp.Rejected):
        reasons = "; ".join(str(reason) for reason in decision.reasons)
        return _Candidate(name, None, f"rejected: {reasons}", False)
    return _Candidate(name, kp.bind(decision, config, caps), decision.kernel, decision.degraded)


def _shape(
    caps: kp.DeviceCaps, n: int, k: int, tokens: Sequence[int], repeats: int, target: int,
    seed: int,
) -> dict[str, Any]:  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    candidates = [_candidate(name, caps, n, k) for name in CANDIDATES]
    cap = BUFFER_BUDGET // (len(BASELINES) + len(CANDIDATES))
    counts = {
        name: rotation_count(n * k * dtype.itemsize, target, cap)
        for name, dtype in BASELINES.items()
    }
    quantized = rotation_count(n * k, target, cap)  # one byte per weight, FP8 or int8
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
    del sources
    gc.collect()
    rotation = {
        name: {"buffers": len(items), "bytes": sum(nbytes(flat(item)) for item in items)}
        for name, items in weights.items()
    }
    rows = []
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
            paired(timed, repeats)
            rows.append(_row(m, {t.name: t.samples for t in timed}))
    del weights
    gc.collect()
    return {
        "n": n,
        "k": k,
        "kernels": {c.name: c.decision for c in candidates},
        "builds": {c.name: c.kernel.level for c in candidates if isinstance(c.kernel, CpuFp8Gemm)},
        "degraded": {c.name: c.degraded for c in candidates},
        "rotation": rotation,
        "rows": rows,
    }


def _row(m: int, samples: dict[str, list[float]]) -> dict[str, Any]:
    """One M: absolute medians (ms), the best baseline, and the paired ratios."""
    ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
    best = min(BASELINES, key=ms.__getitem__)
    row: dict[str, Any] = {"m": m, "ms": ms, "best": best, "best_ms": ms[best]}
    for name in CANDIDATES:
        if name in samples:  # else no kernel was selected for it here
            row[f"{name}_vs_best"] = median_ratio(samples[name], samples[best])
            row[f"{name}_vs_fp32"] = median_ratio(samples[name], samples["fp32"])
    return row


def run_schemes(
    shapes: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    repeats: int,
    rotation_bytes: int | None = None,
    cpu_isa: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The figures for each ``(N, K)`` in ``shapes`` at each M in ``tokens``; the arguments
    are ``run_decode``'s (``rotation_bytes`` None: twice the last-level cache)."""
    caps = kp.probe("cpu")
    if cpu_isa is not None:
        caps = attrs.evolve(caps, arch=CpuArch(platform.machine(), cpu_isa))
    llc, llc_source = llc_bytes()
    target = 2 * llc if rotation_bytes is None else rotation_bytes
    return {
        "llc_bytes": llc,
        "llc_source": llc_source,
        "rotation_target_bytes": target,
        "repeats": repeats,
        "activation_dtype": ACTIVATION,
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "schemes": dict(CANDIDATES),
        "shapes": [
            _shape(caps, n, k, tokens, repeats, target, seed) for seed, (n, k) in enumerate(shapes)
        ],
    }


def render_schemes(schemes: dict[str, Any]) -> list[str]:
    """The report's lines for ``run_schemes``' record."""
    lines = [
        "",
        f"other schemes (times: medians of {schemes['repeats']} paired repeats; ratios: medians"
        f" of per-repeat ratios); weights rotate through >= "
        f"{schemes['rotation_target_bytes'] / MIB:.0f} MiB per callable",
    ]
    lines += [f"  {name}: {what}, bf16 in and out" for name, what in schemes["schemes"].items()]
    for shape in schemes["shapes"]:
        builds = shape.get("builds", {})
        ran = ", ".join(
            f"{name}: {kernel}{f' [{builds[name]}]' if name in builds else ''}"
            f"{' (DEGRADED)' if shape['degraded'].get(name) else ''}"
            for name, kernel in shape["kernels"].items()
        )
        names = [name for name in CANDIDATES if name in shape["rows"][0]["ms"]]
        lines += ["", f"schemes, N={shape['n']} K={shape['k']}  ({ran})"]
        lines.append(
            f"  {'M':>5} {'best':>5} {'best ms':>8} "
            + " ".join(f"{name + ' ms':>15} {name + '/best':>16}" for name in names)
        )
        for row in shape["rows"]:
            cells = " ".join(
                f"{row['ms'][name]:>15.3f} {row[f'{name}_vs_best']:>16.2f}" for name in names
            )
            lines.append(f"  {row['m']:>5} {row['best']:>5} {row['best_ms']:>8.3f} {cells}")
    return lines
