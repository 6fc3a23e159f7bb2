"""The benchmark harness in benchmarks/ runs (a smoke test at tiny sizes; timing is not
judged here). ``benchmarks`` imports as a package because pytest puts the repository root,
the parent of the ``tests`` package, on the path."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch

import kernelpick as kp
from benchmarks.decode import BASELINES, CANDIDATES, llc_bytes, measure_bandwidth, run_decode
from benchmarks.ggml_peer import GGML_ENV, ggml_peer
from benchmarks.memory import peak_extra_rss, resident_bytes
from benchmarks.report import DECODE_TARGETS, TARGETS, render
from benchmarks.schemes import CANDIDATES as SCHEMES
from benchmarks.schemes import render_schemes, run_schemes
from benchmarks.suite import SuiteConfig, run_suite
from kernelpick.core import CpuArch
from tests.support.cpu_levels import LEVELS, NEEDS_A_LEVEL, NEEDS_INT8_DOT

ROOT = Path(__file__).resolve().parents[2]
CPU_KEYS = {
    "dict_lookup_ns", "choose_cached_ns", "choose_uncached_ns", "plan_model_ns", "decode",
    "quantize_vs_clone", "quantize_gbps", "weight_bytes_ratio", "peak_extra_memory_ratio",
    "machine", "schemes",
}  # fmt: skip
DECODE_KEYS = {
    "llc_bytes", "llc_source", "rotation_target_bytes", "bandwidth_gbps", "bandwidth_op",
    "bandwidth_by_op_gbps", "bandwidth_bytes", "repeats", "activation_dtype", "torch_threads",
    "schemes", "shapes",
}  # fmt: skip
ROW_FIGURES = {
    f"{name}_vs_{base}" for name in ("ptpc", "w8a16") for base in ("best", "fp32", "floor", "read")
}


def _selected(scheme: str, n: int, k: int) -> str:
    """The kernel kernelpick selects on this CPU for a bf16 layer: whatever it is today."""
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype="bfloat16")
    decision = kp.choose(kp.probe("cpu"), config)
    assert isinstance(decision, kp.Selected)
    return decision.kernel


@pytest.mark.slow  # 25-110 s: the whole suite, its kernels and its subprocesses
def test_the_suite_reports_every_cpu_key_at_tiny_sizes() -> None:
    results = run_suite(SuiteConfig.tiny())
    assert set(results) >= CPU_KEYS
    assert results["plan_model_decisions"] == 2 * 7
    assert 0.45 < results["weight_bytes_ratio"] < 0.6  # FP8 bytes + scales over bf16 bytes
    assert {"cpu", "isa", "torch", "torch_threads", "torch_cpu_capability"} <= set(
        results["machine"]
    )
    # Every timed ratio names a baseline of this run, and the bf16 one says whether this CPU
    # has bf16 arithmetic, without which "vs bf16" compares against a different kind of GEMM.
    baselines = results["baselines"]
    assert set(baselines) == {
        "dict_lookup_ns", "decode_best", "decode_fp32", "decode_floor_ms", "clone_gbps"
    }  # fmt: skip
    best = baselines["decode_best"]
    assert ("native bf16" in best) is results["cpu_bf16_native"]
    assert "N=64 K=64" in best
    text = render(results)
    for target in TARGETS:
        assert target.figure in text
        assert target.names_baseline(results) in text
    for decode_target in DECODE_TARGETS:
        assert f"{decode_target.figure} M={decode_target.m}, 64x64" in text
    assert f"/  {best}" in text  # the decode rows name the run's baseline
    assert "not measured here" in text  # the GPU figures come from gpu_check.py


def test_the_decode_figures_cover_every_m_and_name_the_kernels_that_ran() -> None:
    config = SuiteConfig.tiny()
    decode = run_decode(
        config.decode_shapes, config.decode_tokens, config.decode_repeats, config.rotation_bytes
    )
    assert set(decode) >= DECODE_KEYS
    assert decode["bandwidth_gbps"] > 0
    assert decode["schemes"] == CANDIDATES
    (shape,) = decode["shapes"]
    assert (shape["n"], shape["k"]) == (64, 64)
    # Kernel-agnostic: whatever kp.choose selects for a bf16 layer is what ran.
    assert shape["kernels"] == {
        name: _selected(scheme, 64, 64) for name, scheme in CANDIDATES.items()
    }
    modules = {f"{name}_module" for name in CANDIDATES}
    assert set(shape["rotation"]) == {*BASELINES, *CANDIDATES, "read", "int8pack", *modules}
    assert all(r["buffers"] >= 2 for r in shape["rotation"].values())
    assert shape["floor_gbps"] == max(decode["bandwidth_gbps"], shape["read_gbps"])
    assert shape["floor_ms"] == pytest.approx(64 * 64 / (shape["floor_gbps"] * 1e9) * 1e3)
    assert [row["m"] for row in shape["rows"]] == list(config.decode_tokens)
    for row in shape["rows"]:
        assert set(row["ms"]) == set(BASELINES) | set(CANDIDATES) | {"int8pack"} | modules
        # Each layer as quantize_model makes it, called as a module, against its own
        # kernel.apply on the same bytes in the same repeats.
        assert all(row[f"{name}_module_vs_apply"] > 0 for name in CANDIDATES)
        # The peer in the same repeats: a paired ratio, and its own against the best.
        assert row["ptpc_vs_int8pack"] > 0
        assert row["int8pack_vs_best"] > 0
        assert row["best"] in BASELINES
        assert row["best_ms"] == min(row["ms"][name] for name in BASELINES)
        assert row["read_ms"] > 0
        assert set(row) >= ROW_FIGURES
        assert all(row[figure] > 0 for figure in ROW_FIGURES)


def test_the_scheme_figures_cover_every_m_and_name_the_kernels_that_ran() -> None:
    # Harness only, at tiny sizes: block FP8, weight-only block FP8, int8 and PTPC beside
    # the F.linear baselines, each ratio over a baseline of the same repeats.
    record = run_schemes(((64, 64),), (1, 4), 1, 0)
    assert record["schemes"] == SCHEMES
    (shape,) = record["shapes"]
    # Kernel-agnostic: whatever kp.choose selects for a bf16 layer is what ran.
    for name in ("block", "int8", "ptpc"):
        assert shape["kernels"][name] == _selected(SCHEMES[name], 64, 64)
    timed = {name for name, kernel in shape["kernels"].items() if not kernel.startswith("rej")}
    assert {"block", "int8", "ptpc"} <= timed
    assert [row["m"] for row in shape["rows"]] == [1, 4]
    for row in shape["rows"]:
        assert set(row["ms"]) == set(BASELINES) | timed
        assert row["best_ms"] == min(row["ms"][name] for name in BASELINES)
        assert all(row[f"{name}_vs_best"] > 0 and row[f"{name}_vs_fp32"] > 0 for name in timed)
    text = "\n".join(render_schemes(record))
    assert "schemes, N=64 K=64" in text
    assert all(f"{name}/best" in text for name in timed)


@pytest.mark.slow  # 14-23 s: builds or loads the AVX2 level, then times it
def test_the_decode_figures_can_time_the_avx2_build_on_any_x86_cpu() -> None:
    # The ISA given replaces the probed one for selection and the build: what a CPU with
    # only AVX2 would run, timed here.
    avx2 = ("avx2", "f16c", "fma")
    decode = run_decode(((64, 64),), (1,), 1, 0, cpu_isa=avx2)
    assert decode["cpu_isa"] == list(avx2)
    caps = attrs.evolve(kp.probe("cpu"), arch=CpuArch("x86_64", avx2))
    config = kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
    decision = kp.choose(caps, config)
    assert isinstance(decision, kp.Selected)
    assert decode["shapes"][0]["kernels"]["ptpc"] == decision.kernel
    assert decode["shapes"][0]["builds"] == {"ptpc": "avx2", "w8a16": "avx2"}


def test_fp32_activations_time_fp32_layers_and_feed_the_peer_fp32() -> None:
    # A model quantized from fp32 keeps fp32 activations: the candidates are bound for fp32
    # in and out (what quantize_model gives such a model), and the peer takes fp32 scales.
    decode = run_decode(((64, 64),), (1, 4), 1, 0, activation="float32")
    schemes = run_schemes(((64, 64),), (1,), 1, 0, activation="float32")
    assert decode["activation_dtype"] == schemes["activation_dtype"] == "float32"
    config = kp.quant_config(
        "fp8_per_channel", weight_shape=(64, 64), input_dtype="float32", out_dtype="float32"
    )
    decision = kp.choose(kp.probe("cpu"), config)
    assert isinstance(decision, kp.Selected)
    assert decode["shapes"][0]["kernels"]["ptpc"] == decision.kernel
    assert all(row["ptpc_vs_int8pack"] > 0 for row in decode["shapes"][0]["rows"])
    assert "float32 in and out" in "\n".join(render_schemes(schemes))
    with pytest.raises(ValueError, match="bfloat16, float32"):
        run_decode(((64, 64),), (1,), 1, 0, activation="float16")


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--activation", "float16"]])
def test_bad_threads_or_activation_are_refused_before_anything_runs(argv: list[str]) -> None:
    from benchmarks.run import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--tiny", *argv])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("flags", ["", ",", "avx2,no_such_flag", "avx512bf16"])
def test_cpu_isa_flags_this_cpu_lacks_are_refused_before_anything_runs(flags: str) -> None:
    # A misspelled flag ("avx512bf16" for avx512_bf16) would silently time another build.
    from benchmarks.run import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--tiny", "--cpu-isa", flags])
    assert exit_info.value.code == 2


def test_the_rotation_spans_the_cache_and_the_bandwidth_is_read_from_memory() -> None:
    llc, source = llc_bytes()
    assert llc > 0
    assert source
    # Small buffers: this only checks the measurement runs and reports in GB/s.
    bandwidth = measure_bandwidth(4 * 2**20, repeats=1)
    assert bandwidth["bandwidth_op"] in bandwidth["bandwidth_by_op_gbps"]
    assert bandwidth["bandwidth_gbps"] == max(bandwidth["bandwidth_by_op_gbps"].values())
    assert bandwidth["bandwidth_bytes"] == 4 * 2**20


def test_llc_falls_back_where_sysfs_says_nothing(tmp_path: Path) -> None:
    index = tmp_path / "index3"
    index.mkdir()
    assert llc_bytes(tmp_path)[0] == 64 * 2**20
    (index / "level").write_text("3\n")
    (index / "type").write_text("Unified\n")
    (index / "size").write_text("32768K\n")
    assert llc_bytes(tmp_path) == (32 * 2**20, f"{tmp_path}/index*/size (level 3)")


@pytest.mark.slow  # 5-125 s: benchmarks/run.py --tiny in a fresh process
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
    assert record["schema_version"] == 2
    assert "choose_cached_ns/dict_lookup_ns" in result.stdout


def test_targets_judge_ratios_in_the_right_direction() -> None:
    at_most = next(t for t in TARGETS if t.figure == "weight_bytes_ratio")
    at_least = next(t for t in TARGETS if t.figure == "quantize_vs_clone")
    derived = next(t for t in TARGETS if t.figure == "choose_cached_ns/dict_lookup_ns")
    assert at_most.met({"weight_bytes_ratio": 0.5}) is True
    assert at_most.met({"weight_bytes_ratio": 0.6}) is False
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


def test_the_decode_targets_are_this_rounds_and_judge_each_m() -> None:
    bounds = {(t.figure, t.m): t.bound for t in DECODE_TARGETS}
    assert bounds == {
        ("ptpc_vs_best", 1): 0.5, ("ptpc_vs_best", 4): 0.6, ("ptpc_vs_best", 16): 0.6,
        ("ptpc_vs_best", 256): 1.2, ("ptpc_vs_best", 2048): 1.2, ("w8a16_vs_best", 1): 0.5,
        **{("ptpc_vs_int8pack", m): 1.0 for m in (1, 4, 16, 64, 256, 2048)},
    }  # fmt: skip
    m1 = next(t for t in DECODE_TARGETS if (t.figure, t.m) == ("ptpc_vs_best", 1))
    shape = {"rows": [{"m": 1, "ptpc_vs_best": 0.45}, {"m": 4, "ptpc_vs_best": 0.9}]}
    assert m1.met(shape) is True
    assert m1.met({"rows": [{"m": 1, "ptpc_vs_best": 0.55}]}) is False
    assert m1.met({"rows": [{"m": 4, "ptpc_vs_best": 0.1}]}) is None  # M=1 not measured


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


@pytest.mark.slow  # 2-4 s: eager, Inductor and the compiled kernel, timed
def test_the_build_route_figures_run(capsys: pytest.CaptureFixture[str]) -> None:
    # The harness only: docs/kernels.md's route figures come from the full run.
    from benchmarks.build_route import main

    assert main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert "M=1" in out
    assert "inductor_ms" in out


@NEEDS_A_LEVEL
@NEEDS_INT8_DOT
def test_the_int8_handover_figures_time_every_build_against_int_mm() -> None:
    from benchmarks.int8_handover import int8_levels, render_handover, run_handover

    record = run_handover(32, 192, (1, 5), repeats=1, levels=LEVELS[-1:])
    assert [row["m"] for row in record["rows"]] == [1, 5]
    for row in record["rows"]:
        assert set(row["ms"]) == {"fp32", "int_mm", LEVELS[-1]}
        assert row[f"{LEVELS[-1]}_vs_int_mm"] > 0
    assert int8_levels(kp.probe("cpu")) == LEVELS
    assert "| 5 | " in "\n".join(render_handover(record))


@pytest.mark.slow  # loads a real model (the e2e extra)
def test_the_model_figures_run_on_minilm_and_name_the_kernels_that_ran() -> None:
    # Harness only: one scheme, one repeat, batch 1 and 3, on the real model.
    from benchmarks.models import render_models, run_minilm

    record = run_minilm(("fp8_per_channel",), (1, 3), 1)
    assert [row["batch"] for row in record["rows"]] == [1, 3]
    assert all(row["fp8_per_channel_vs_fp32"] > 0 for row in record["rows"])
    assert set(record["rows"][0]["ms"]) == {"fp32", "fp8_per_channel"}
    # MiniLM's 37 linears (6 layers of q, k, v, o, up, down, and the pooler), each on the
    # kernel kp.choose selects here for it.
    (used,) = record["kernels"].values()
    assert sum(used.values()) == 37
    fp32 = kp.quant_config(
        "fp8_per_channel", weight_shape=(384, 384), input_dtype="float32", out_dtype="float32"
    )
    decision = kp.choose(kp.probe("cpu"), fp32)
    assert isinstance(decision, kp.Selected)
    assert set(used) == {decision.kernel}
    assert "fp8_per_channel/fp32" in "\n".join(render_models(record))


def test_the_q4_0_peer_runs_where_ggml_is_installed_and_says_why_not_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where KERNELPICK_GGML names an install, llama.cpp's Q4_0 is timed in the same repeats
    # as the int4 layers; elsewhere the record and report say what would run it.
    record = run_schemes(((64, 64),), (1,), 1, 0)
    (row,) = record["shapes"][0]["rows"]
    text = "\n".join(render_schemes(record))
    if GGML_ENV in os.environ:
        assert record["peers"]["q4_0"].startswith("llama.cpp ggml Q4_0")
        assert row["q4_0_vs_best"] > 0
        assert "q4_0/best" in text
        monkeypatch.delenv(GGML_ENV)
        record = run_schemes(((64, 64),), (1,), 1, 0)
    assert record["peers"] == {"q4_0": f"not run: set {GGML_ENV} to a ggml install prefix"}
    assert "q4_0" not in record["shapes"][0]["rows"][0]["ms"]
    assert f"q4_0 (peer): not run: set {GGML_ENV}" in "\n".join(render_schemes(record))


def test_a_ggml_prefix_without_its_headers_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GGML_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=r"no include/ggml\.h"):
        ggml_peer(1)
