"""The benchmark harness in benchmarks/ runs (a smoke test at tiny sizes; timing is not
judged here). ``benchmarks`` imports as a package because pytest puts the repository root,
the parent of the ``tests`` package, on the path."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.memory import peak_extra_rss, resident_bytes
from benchmarks.report import TARGETS, render
from benchmarks.suite import SuiteConfig, run_suite

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
    # Every timed ratio names a baseline of this run, and the bf16 one says whether this CPU
    # has bf16 arithmetic, without which "vs bf16" compares against a different kind of GEMM.
    baselines = results["baselines"]
    assert set(baselines) == {
        "dict_lookup_ns", "cpu_fp32_linear_ms", "cpu_bf16_linear_ms", "clone_gbps"
    }  # fmt: skip
    assert all(key in results for key in baselines)
    bf16 = baselines["cpu_bf16_linear_ms"]
    assert ("native bf16" in bf16) is results["cpu_bf16_native"]
    assert "M=8 N=K=64" in bf16
    text = render(results)
    for target in TARGETS:
        assert target.figure in text
        assert target.names_baseline(results) in text
    assert f"/  {bf16}" in text  # the bf16 figure's row names the run's bf16 baseline
    assert "not measured here" in text  # the GPU figures come from gpu_check.py


def test_benchmarks_run_writes_json_from_any_directory(tmp_path: Path) -> None:
    # Run as a script from elsewhere: run.py finds its package, and the memory figure's
    # subprocess finds benchmarks.suite, without the repository root as working directory.
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--tiny", "--json", str(out)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert set(record) >= CPU_KEYS
    assert record["schema_version"] == 1
    assert "choose_cached_ns/dict_lookup_ns" in result.stdout


def test_targets_judge_ratios_in_the_right_direction() -> None:
    at_most = next(t for t in TARGETS if t.figure == "cpu_ptpc_vs_fp32_linear")
    at_least = next(t for t in TARGETS if t.figure == "quantize_vs_clone")
    derived = next(t for t in TARGETS if t.figure == "choose_cached_ns/dict_lookup_ns")
    assert at_most.met({"cpu_ptpc_vs_fp32_linear": 1.7}) is True
    assert at_most.met({"cpu_ptpc_vs_fp32_linear": 1.9}) is False
    assert at_least.met({"quantize_vs_clone": 0.3}) is True
    assert at_least.met({"quantize_vs_clone": 0.2}) is False
    assert derived.met({"choose_cached_ns": 600.0, "dict_lookup_ns": 10.0}) is False
    assert derived.met({"choose_cached_ns": 400.0, "dict_lookup_ns": 10.0}) is True
    assert derived.met({}) is None


def test_the_decision_targets_are_this_rounds() -> None:
    bounds = {t.figure: (t.at_most, t.bound) for t in TARGETS}
    assert bounds["choose_cached_ns/dict_lookup_ns"] == (True, 50)
    assert bounds["choose_uncached_ns/dict_lookup_ns"] == (True, 3000)
    assert bounds["plan_model_ns/dict_lookup_ns"] == (True, 1e5)


def test_the_package_does_not_import_the_suite() -> None:
    # Developer tooling stays out of the wheel, which ships kernelpick/ only: an import of
    # it from the package would fail in every install.
    for path in (ROOT / "kernelpick").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "benchmarks", f"{path} imports {name}"


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
