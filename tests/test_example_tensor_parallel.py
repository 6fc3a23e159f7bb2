"""examples/tensor_parallel.py runs: two gloo ranks on this CPU split a tiny Llama's MLP
block (gate/up column-parallel, down row-parallel) and match the block quantized whole."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernelpick as kp

pytestmark = [
    pytest.mark.slow,  # 10-20 s: two fresh processes, each importing torch and transformers
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None,
        reason="the example builds a transformers Llama (the test extra installs it)",
    ),
]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tensor_parallel.py"
RANKS = (0, 1)
SHARDS = {"gate_proj": "column", "up_proj": "column", "down_proj": "row"}

# How far the sharded block's output may be from the block quantized whole, relative to
# the largest output. The weights are the same bytes (checked below), and gate/up see the
# same activations, so the one difference is down_proj's dynamic activation scales: each
# rank scales its half of a token by that half's amax, the whole block by the token's.
# Either way an element is rounded to e4m3 (3 mantissa bits) with a relative error of at
# most 2^-4, about 3.6% RMS for a uniform error; two independent roundings differ by about
# 5% RMS, and a sum of such errors over random-signed weights keeps that ratio to the sum
# of the values, so the largest difference is about 5% of the largest output (2.5%
# measured here, the halves' finer grids helping). 0.1 is twice the estimate. What this
# bound is for: a missed all-reduce of the outputs, a bias added twice or a rank's part
# taken from the wrong rows is off by O(1). A rank scaling its half of down_proj by its
# own weight amax instead of the all-reduced one would stay accurate, so the equal-bytes
# line catches that.
RELATIVE_BOUND = 0.1


def _run_example() -> tuple[subprocess.CompletedProcess[str], float]:
    # As a user runs it: the compiled CPU kernels' build finds ninja itself (the wheel's).
    start = time.perf_counter()
    finished = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=ROOT, capture_output=True, text=True,
        timeout=240,  # the example itself stops its ranks after 120 s
    )  # fmt: skip
    return finished, time.perf_counter() - start


def test_the_tensor_parallel_example_matches_the_block_quantized_whole() -> None:
    finished, seconds = _run_example()
    print(finished.stdout, f"({seconds:.1f} s)")
    assert finished.returncode == 0, finished.stderr
    out = finished.stdout
    caps = kp.probe("cpu")  # what the example's caps=None probes
    differences = set()
    for rank in RANKS:
        for name, style in SHARDS.items():
            line = re.search(
                rf"^rank {rank}: {name} +{style}-parallel +N=(\d+) K=(\d+) +(\w+)$", out, re.M
            )
            assert line is not None, (rank, name, out)
            n, k, kernel = int(line.group(1)), int(line.group(2)), line.group(3)
            assert (n, k) == (256, 256)  # half of 512 outputs, or half of 512 inputs
            config = kp.quant_config("fp8_per_channel", weight_shape=(n, k), out_dtype="float32")
            decision = kp.choose(caps, config)
            assert isinstance(decision, kp.Selected)
            assert kernel == decision.kernel  # selected from the per-partition shape
        assert f"rank {rank}: FP8 weights and scales equal to the whole block's part" in out
        found = re.search(
            rf"^rank {rank}: output: max abs difference (\S+), relative (\S+) "
            r"\(max \|output\| (\S+)\)$",
            out, re.M,
        )  # fmt: skip
        assert found is not None, (rank, out)
        max_abs, relative, largest = (float(found.group(i)) for i in (1, 2, 3))
        assert largest > 0
        assert 0 <= relative < RELATIVE_BOUND, out
        assert max_abs == pytest.approx(relative * largest, rel=0.01)  # 3 figures printed
        differences.add(found.group(0).removeprefix(f"rank {rank}"))
    assert len(differences) == 1, differences  # the all-reduce gave every rank one output
    assert "Activation scales are each rank's own" in out
