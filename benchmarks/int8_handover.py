"""Where ``cpu_int8_gemm`` hands its product to ``torch._int_mm``: the compiled op alone, per
ISA build, against ``_int_mm`` on the same bytes and fp32 ``F.linear``, at each M.

The hand-over point (``kernelpick.kernels._cpu_gemm.int_mm_from_tokens``) is read from
these ratios: the op runs below it, ``_int_mm`` from it on. The op is called as its custom
op (``kernelpick::fp8_gemm_<level>``), so no hand-over hides it; ``_int_mm`` is the bound
``cpu_int8_int_mm`` kernel. Method as the other CPU figures (``rotation.py``): weights
rotated past the last-level cache, paired repeats, medians of per-repeat ratios, bf16 in
and out. It runs only on a CPU with an int8 dot product (VNNI or AMX), where ``_int_mm``
sums right.

    python -m benchmarks.int8_handover [--shape 4096x4096] [--tokens 16,64,256] [--threads 2]
        [--levels avx512_vnni,avx512]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

import kernelpick as kp
from benchmarks.decode import layer_config, llc_bytes
from benchmarks.rotation import (
    Candidate,
    Timed,
    apply_call,
    linear_call,
    median_ratio,
    paired,
    rotated_weights,
)
from kernelpick.core import INT8_DOT_ISA, CpuArch
from kernelpick.kernels import WeightBundle
from kernelpick.kernels._cpu_build import ISA_LEVELS, levels_within, op_name

__all__ = ["HANDOVER_TOKENS", "int8_levels", "render_handover", "run_handover"]

HANDOVER_TOKENS = (1, 4, 16, 32, 48, 64, 96, 128, 192, 256, 512)
_SCHEME = "int8_per_channel"


def int8_levels(caps: kp.DeviceCaps) -> list[str]:
    """The ISA builds ``caps``' CPU can run, best first."""
    return levels_within(caps.arch.isa if isinstance(caps.arch, CpuArch) else ())


def _op_call(level: str, x: torch.Tensor) -> Callable[[WeightBundle], object]:
    op = getattr(torch.ops.kernelpick, op_name(level))

    def call(bundle: WeightBundle) -> object:
        return op(x, bundle.weight, bundle.scale, None, True, x.dtype, 0, 0, None)

    return call


def run_handover(
    n: int, k: int, tokens: Sequence[int] = HANDOVER_TOKENS, repeats: int = 7,
    levels: Sequence[str] | None = None, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Per M, each build's op time over ``_int_mm``'s and over fp32 ``F.linear``'s, and the
    medians (ms). ``levels``: the builds to time (default: every one this CPU runs)."""
    host = kp.probe("cpu")
    isa = host.arch.isa if isinstance(host.arch, CpuArch) else frozenset()
    if not isa & INT8_DOT_ISA.flags:
        raise SystemExit(f"torch._int_mm sums right only with {INT8_DOT_ISA.render()}")
    levels = list(levels) if levels is not None else int8_levels(host)
    config = layer_config(_SCHEME, n, k, "bfloat16")
    kernel = kp.bind("cpu_int8_int_mm", config, host)
    int_mm = Candidate("int_mm", kernel, "cpu_int8_int_mm", degraded=False)
    for level in levels:  # binding builds (or loads) the level and registers its op
        kp.bind(
            "cpu_int8_gemm",
            config,
            attrs.evolve(host, arch=CpuArch("x86_64", ISA_LEVELS[level][0])),
        )
    generator = torch.Generator().manual_seed(seed)
    weights, _ = rotated_weights(n, k, [int_mm], 2 * llc_bytes()[0], generator)
    # The op reads the canonical bytes every int8 family prepares: _int_mm's bundles serve.
    ops_items = [WeightBundle(b.weight.t(), b.scale, None) for b in weights["int_mm"]]
    rows = []
    with torch.inference_mode():
        for m in tokens:
            x = torch.randn(m, k, generator=generator).to(torch.bfloat16)
            timed = [
                Timed("fp32", linear_call(x.float()), weights["fp32"]),
                Timed("int_mm", apply_call(kernel, x), weights["int_mm"]),
                *(Timed(level, _op_call(level, x), ops_items) for level in levels),
            ]
            paired(timed, repeats)
            samples = {t.name: t.samples for t in timed}
            ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
            row: dict[str, Any] = {"m": m, "ms": ms}
            for level in levels:
                row[f"{level}_vs_int_mm"] = median_ratio(samples[level], samples["int_mm"])
                row[f"{level}_vs_fp32"] = median_ratio(samples[level], samples["fp32"])
            rows.append(row)
    return {"n": n, "k": k, "levels": levels, "threads": torch.get_num_threads(), "rows": rows}


def render_handover(record: dict[str, Any]) -> list[str]:
    """The record as a markdown table: each build's op over ``_int_mm`` (and fp32) per M."""
    levels = record["levels"]
    head = " | ".join(f"{level} / int_mm (/ fp32)" for level in levels)
    lines = [
        f"N = {record['n']}, K = {record['k']}, {record['threads']} threads",
        f"| M | {head} |",
        "|---|" + "---|" * len(levels),
    ]
    for row in record["rows"]:
        cells = " | ".join(
            f"{row[f'{level}_vs_int_mm']:.2f} ({row[f'{level}_vs_fp32']:.2f})" for level in levels
        )
        lines.append(f"| {row['m']} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", default="4096x4096", help="N x K (default 4096x4096)")
    parser.add_argument("--tokens", default=",".join(map(str, HANDOVER_TOKENS)))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--levels", default=None, help="builds to time (default: every one)")
    args = parser.parse_args(argv)
    try:
        n, k = (int(v) for v in args.shape.lower().split("x"))
        tokens = [int(v) for v in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--shape takes N x K (say 4096x4096), --tokens a list of integers: {args}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    levels = args.levels.split(",") if args.levels else None
    if levels is not None and not set(levels) <= set(int8_levels(kp.probe("cpu"))):
        parser.error(f"--levels: this CPU runs {', '.join(int8_levels(kp.probe('cpu')))}")
    print("\n".join(render_handover(run_handover(n, k, tokens, args.repeats, levels))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
