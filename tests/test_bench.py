"""The benchmark harness runs (a smoke test at tiny sizes; timing is not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from kernelpick.bench import TARGETS, SuiteConfig, render, run_suite
from kernelpick.bench._memory import peak_extra_rss, resident_bytes

ROOT = Path(__file__).resolve().parents[1]
CPU_KEYS = {
    "dict_lookup_ns", "choose_cached_ns", "choose_uncached_ns", "plan_model_ns",
    "cpu_ptpc_vs_fp32_linear", "cpu_ptpc_vs_bf16_linear", "quantize_vs_clone",
    "quantize_gbps", "weight_bytes_ratio", "peak_extra_memory_ratio", "machine",
}  # fmt: skip


def test_the_suite_reports_every_cpu_key_at_tiny_sizes() -> None:
    results = run_suite(SuiteConfig.tiny())
    assert set(results) >= CPU_KEYS
    assert results["plan_model_decisions"] == 2 * 7
    assert results["cpu_ptpc_kernel"] == "cpu_rowwise_scaled_mm"
    assert 0.45 < results["weight_bytes_ratio"] < 0.6  # FP8 bytes + scales over bf16 bytes
    assert {"cpu", "torch", "torch_threads"} <= set(results["machine"])
    text = render(results)
    for target in TARGETS:
        assert target.figure in text
    assert "not measured here" in text  # the GPU figures come from gpu_check.py


def test_benchmarks_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--tiny", "--json", str(out)],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert set(json.loads(out.read_text())) >= CPU_KEYS
    assert "choose_cached_ns/dict_lookup_ns" in result.stdout


def test_targets_judge_ratios_in_the_right_direction() -> None:
    at_most = next(t for t in TARGETS if t.figure == "cpu_ptpc_vs_fp32_linear")
    at_least = next(t for t in TARGETS if t.figure == "quantize_vs_clone")
    derived = next(t for t in TARGETS if t.figure == "choose_cached_ns/dict_lookup_ns")
    assert at_most.met({"cpu_ptpc_vs_fp32_linear": 1.7}) is True
    assert at_most.met({"cpu_ptpc_vs_fp32_linear": 1.9}) is False
    assert at_least.met({"quantize_vs_clone": 0.3}) is True
    assert at_least.met({"quantize_vs_clone": 0.2}) is False
    assert derived.met({"choose_cached_ns": 300.0, "dict_lookup_ns": 10.0}) is False
    assert derived.met({"choose_cached_ns": 150.0, "dict_lookup_ns": 10.0}) is True
    assert derived.met({}) is None


def test_the_memory_sampler_sees_a_temporary_allocation() -> None:
    if resident_bytes() == 0:
        return  # no /proc here: nothing to sample

    def allocate() -> int:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, then freed
        time.sleep(0.05)  # held long enough for the 0.5 ms sampler to see it
        return int(block[0])

    value, extra = peak_extra_rss(allocate)
    assert value == 1
    assert extra >= 32 * 2**20
