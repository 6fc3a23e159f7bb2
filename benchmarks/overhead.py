"""Per-call overhead of a converted layer, and the decision's cost, for an A/B of two trees.

    .venv/bin/python benchmarks/overhead.py                         # this tree: JSON
    .venv/bin/python benchmarks/overhead.py --ab OLD_TREE NEW_TREE  # both, alternately

One run times a converted 256 x 256 ``nn.Linear`` (bias, fp32 and bf16 activations) at
M = 1 for each scheme, on the kernel the CPU is selected for, beside a plain ``nn.Linear``,
and ``kp.choose`` on three profiles, uncached (``kp.clear_cache()`` before each call) and
cached. At this size the kernel's arithmetic is small, so the layer's figure is mostly what
kernelpick adds around it. ``--ab`` runs each tree in its own process (``PYTHONPATH``),
old and new alternately, and prints new / old of the medians of the per-round medians.
It uses only names kernelpick has had since its layer steps (``quantize_model``, ``probe``,
``Policy``, ``choose``, ``clear_cache``, ``device_profile``, ``quant_config``), so an
earlier tree runs it too.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["main", "measure"]

SCHEMES = ("fp8_per_channel", "fp8_per_tensor", "int8_per_channel", "fp8_block")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROFILES = ("h100", "a100", "cpu")
ROUNDS = 20
CALLS = 2000  # calls in one timed block, at most
MIN_CALLS = 50
BLOCK_SECONDS = 0.1
DECISION_CALLS = 200  # each one after a clear_cache(), per profile and config
CPU_FLAGS = ("avx512_bf16", "avx512_vnni", "amx_int8")


def _layers() -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """A call of each layer at M = 1 (the plain linears and every scheme's converted one),
    and the kernel each converted layer runs."""
    import kernelpick as kp
    from kernelpick.integration import quantize_model

    caps = kp.probe()
    calls: dict[str, Callable[[], object]] = {}
    kernels: dict[str, str] = {}
    for tag, dtype in DTYPES.items():
        x = torch.randn(1, 256, dtype=dtype)
        plain = torch.nn.Linear(256, 256).to(dtype)
        calls[f"linear_{tag}_us"] = functools.partial(plain, x)
        for scheme in SCHEMES:
            model = torch.nn.Sequential(torch.nn.Linear(256, 256)).to(dtype)
            report = quantize_model(model, scheme, caps=caps, policy=kp.Policy())
            kernels[f"{scheme}_{tag}"] = report.layers[0].kernel
            calls[f"{scheme}_{tag}_us"] = functools.partial(model[0], x)
    return calls, kernels


def _layer_figures(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median µs per call: ``ROUNDS`` rounds, each timing a block of calls of every layer
    back to back, starting one further along each round (drift reaches all alike); and
    each converted layer's median per-round ratio to the plain linear of its dtype, which
    cancels much of what a busy machine does to the absolute figures."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    blocks: dict[str, int] = {}
    names = list(calls)
    with torch.inference_mode():
        for name, call in calls.items():  # warm-up: a first call may build the CPU kernel
            for _ in range(10):
                call()
            start = time.perf_counter_ns()
            call()
            seconds = (time.perf_counter_ns() - start) / 1e9
            # At most BLOCK_SECONDS a block: a slow layer does not own the run's length.
            blocks[name] = max(MIN_CALLS, min(CALLS, int(BLOCK_SECONDS / max(seconds, 1e-9))))
        for r in range(ROUNDS):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                call, count = calls[name], blocks[name]
                start = time.perf_counter_ns()
                for _ in range(count):
                    call()
                samples[name].append((time.perf_counter_ns() - start) / count / 1e3)
    figures = {name: statistics.median(times) for name, times in samples.items()}
    for name, times in samples.items():
        if not name.startswith("linear_"):
            plain = samples[f"linear_{name.removesuffix('_us').rsplit('_', 1)[1]}_us"]
            ratios = (a / b for a, b in zip(times, plain, strict=True))
            figures[name.replace("_us", "_vs_linear")] = statistics.median(ratios)
    return figures


def _decision_figures() -> dict[str, float]:
    """Median µs of ``kp.choose`` over every scheme's 4096 x 4096 config, per profile."""
    import kernelpick as kp

    configs = [kp.quant_config(s, weight_shape=(4096, 4096)) for s in SCHEMES]
    figures: dict[str, float] = {}
    for name in PROFILES:
        caps = kp.device_profile(name)
        uncached: list[float] = []
        for _ in range(DECISION_CALLS):
            for config in configs:
                kp.clear_cache()
                start = time.perf_counter_ns()
                kp.choose(caps, config)
                uncached.append((time.perf_counter_ns() - start) / 1e3)
        cached: list[float] = []
        for _ in range(ROUNDS):
            start = time.perf_counter_ns()
            for _ in range(CALLS // len(configs)):
                for config in configs:
                    kp.choose(caps, config)
            cached.append((time.perf_counter_ns() - start) / CALLS / 1e3)
        figures[f"choose_uncached_{name}_us"] = statistics.median(uncached)
        figures[f"choose_cached_{name}_us"] = statistics.median(cached)
    return figures


def measure(threads: int) -> dict[str, Any]:
    """Every figure of the tree ``kernelpick`` imports from, with where it came from."""
    import kernelpick as kp

    torch.set_num_threads(threads)
    calls, kernels = _layers()
    figures = {**_layer_figures(calls), **_decision_figures()}
    return {"kernelpick": kp.__file__, "threads": threads, "kernels": kernels, "figures": figures}


def cpu_model() -> str:
    """The CPU's model name and which of ``CPU_FLAGS`` it has (from /proc/cpuinfo)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    return f"{model}; " + ", ".join(f"{f}: {'yes' if f in flags else 'no'}" for f in CPU_FLAGS)


def _run_tree(tree: Path, threads: int) -> dict[str, Any]:
    """``measure`` in a fresh process importing ``kernelpick`` from ``tree`` alone: ``-P``
    and a neutral working directory keep this file's tree and the editable install out."""
    tree = tree.resolve()  # the child runs elsewhere
    venv_bin = str(Path(sys.executable).parent)  # ninja, for a first build of a CPU kernel
    env = {**os.environ, "PYTHONPATH": str(tree), "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--threads", str(threads)]
    done = subprocess.run(
        command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True
    )
    record: dict[str, Any] = json.loads(done.stdout)
    if not Path(record["kernelpick"]).resolve().is_relative_to(tree):
        raise SystemExit(f"{tree}: the run imported kernelpick from {record['kernelpick']}")
    return record


def ab(old: Path, new: Path, rounds: int, threads: int) -> dict[str, Any]:
    """Both trees, alternately, ``rounds`` times each; then each figure's median per tree
    and new / old."""
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for _ in range(rounds):
        for side, tree in (("old", old), ("new", new)):
            runs[side].append(_run_tree(tree, threads))
    keys = list(runs["new"][0]["figures"])
    medians = {
        side: {key: statistics.median(r["figures"][key] for r in records) for key in keys}
        for side, records in runs.items()
    }
    ratios = {k: medians["new"][k] / medians["old"][k] for k in medians["new"]}
    kernels = {side: records[0]["kernels"] for side, records in runs.items()}
    return {"cpu": cpu_model(), "threads": threads, "rounds": rounds, "kernels": kernels,
            "medians": medians, "new_over_old": ratios, "runs": runs}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    """The A/B as a Markdown table: each figure's old and new (µs, or a ratio to the plain
    linear), new / old, and the kernel."""
    old, new = result["medians"]["old"], result["medians"]["new"]
    kernels = result["kernels"]["new"]
    lines = [
        f"CPU: {result['cpu']}; torch threads: {result['threads']}; rounds: {result['rounds']}",
        "",
        "| figure | old | new | new / old | kernel |",
        "|---|---|---|---|---|",
    ]
    for key, ratio in result["new_over_old"].items():
        kernel = kernels.get(key.removesuffix("_us").removesuffix("_vs_linear"), "")
        digits = 2 if key.endswith("_us") else 3
        lines.append(
            f"| {key} | {old[key]:.{digits}f} | {new[key]:.{digits}f} | {ratio:.3f} | {kernel} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """One tree's figures as JSON, or (``--ab OLD NEW``) the A/B table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ab", nargs=2, type=Path, metavar=("OLD", "NEW"), default=None)
    parser.add_argument("--rounds", type=int, default=5, help="processes per tree (--ab)")
    # One thread by default: a second one's wake-up on a shared 2-core VM is noise that
    # dwarfs the host-side cost being compared.
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", type=Path, default=None, help="--ab: also write it all here")
    args = parser.parse_args(argv)
    if args.ab is None:
        print(json.dumps(measure(args.threads), indent=2))
        return 0
    result = ab(args.ab[0], args.ab[1], max(1, args.rounds), args.threads)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
