"""The figures behind docs/kernels.md's choice of build route for the CPU FP8 kernels.

    .venv/bin/python benchmarks/build_route.py            # N = K = 4096, M = 1 and 16
    .venv/bin/python benchmarks/build_route.py --tiny     # a smoke run (CI)

It times, side by side in one run and on the same rotated weights, the weight-only layer
kernelpick selects on this CPU (the compiled kernel where a toolchain is found) against the
alternatives a compiled kernel must beat: the same dequantize-then-``F.linear`` in eager
torch and under ``torch.compile`` (Inductor), with fp16 ``F.linear`` as the reference. Then
it times the build itself: each ISA level's first build into an empty extension directory,
and a cached load, each in a fresh process. Developer tooling, not in the wheel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kernelpick as kp  # noqa: E402
from kernelpick.core import CpuArch  # noqa: E402

__all__ = ["build_seconds", "layer_ms", "main"]

# Imports come before the clock starts: the figure is the build or load, not torch's import.
_BUILD = (
    "import time\nfrom kernelpick.kernels._cpu_build import load_ops\n"
    "start = time.perf_counter()\nload_ops({level!r})\nprint(time.perf_counter() - start)\n"
)


def _median_ms(run: Callable[[int], object], repeats: int) -> float:
    run(0)  # warm-up (and Inductor's compile)
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        run(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def layer_ms(n: int, k: int, m: int, repeats: int, copies: int) -> dict[str, float | str]:
    """Milliseconds per call of each route at ``M = m`` (bf16), weights rotating over ``copies``."""
    caps = kp.probe("cpu")
    config = kp.quant_config("fp8_weight_only", weight_shape=(n, k), out_dtype="bfloat16")
    decision = kp.choose(caps, config)
    if not isinstance(decision, kp.Selected):
        raise SystemExit(decision.render())
    kernel = kp.bind(decision, config, caps)
    bundles = [kernel.quantize_weights(torch.randn(n, k)) for _ in range(copies)]
    halves = [torch.randn(n, k).half() for _ in range(copies)]
    x = torch.randn(m, k).to(torch.bfloat16)

    def dequantize_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, w.to(torch.bfloat16) * s.to(torch.bfloat16))

    inductor = torch.compile(dequantize_linear)
    with torch.inference_mode():
        figures: dict[str, float | str] = {"kernel": decision.kernel}
        figures["kernelpick_ms"] = _median_ms(
            lambda r: kernel.apply(x, bundles[r % copies]), repeats
        )
        figures["inductor_ms"] = _median_ms(
            lambda r: inductor(x, bundles[r % copies].weight, bundles[r % copies].scale), repeats
        )
        figures["eager_ms"] = _median_ms(
            lambda r: dequantize_linear(x, bundles[r % copies].weight, bundles[r % copies].scale),
            repeats,
        )
        figures["fp16_linear_ms"] = _median_ms(
            lambda r: torch.nn.functional.linear(x.half(), halves[r % copies]), repeats
        )
    return figures


def build_seconds(level: str, directory: str) -> float:
    """Seconds for a fresh process to build (empty ``directory``) or load ``level``'s kernel."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": directory}
    code = _BUILD.format(level=level)
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(run.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="small shapes, no build timing")
    args = parser.parse_args(argv)
    n = k = 64 if args.tiny else 4096
    repeats, copies = (2, 2) if args.tiny else (15, 6)
    for m in (1, 16):
        figures = layer_ms(n, k, m, repeats, copies)
        shown = ", ".join(
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in figures.items()
        )
        print(f"N=K={n} M={m} bf16: {shown}")
    if args.tiny:
        return 0
    arch = kp.probe("cpu").arch
    isa = arch.isa if isinstance(arch, CpuArch) else frozenset()
    from kernelpick.kernels._cpu_build import levels_within

    with tempfile.TemporaryDirectory() as directory:
        for level in levels_within(isa):
            first = build_seconds(level, directory)
            cached = build_seconds(level, directory)
            print(f"{level}: first build {first:.1f} s, cached load {cached:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
