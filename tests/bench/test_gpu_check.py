"""benchmarks/gpu_check.py, the one script of GPU checks, run here on the CPU: its plan, and
that its JSON survives a case that raises, a process that ends mid-run and a lost CUDA
context. The subprocesses hide any GPU (CUDA_VISIBLE_DEVICES=""), so the CUDA cases are
skipped on every machine and the checks take seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp
from benchmarks import gpu_check
from benchmarks.gpu_plan import BLOCK_FP8_TOKENS, FIGURES, GEMV_SHAPES, KERNELS, VARIANTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
CPU_CASES = ("machine", "selection/probed", "selection/h100", "selection/h200")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The script as the GPU machine runs it, from the tree, without a GPU."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OUT", None)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), *args],
        capture_output=True, text=True, check=False, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    return result, doc


def _records(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["cases"]}


def test_gpu_check_prints_its_plan_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    names = [line.split()[1] for line in lines if line[:5].strip().rstrip(".").isdigit()]
    assert len(names) == len(set(names))
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert kernel in KERNELS, kernel  # else the plan has a case that only raises
        for variant in VARIANTS:
            assert f"kernel/{kernel}/{KERNELS[kernel][0]}/{variant}" in names
    for m in BLOCK_FP8_TOKENS:
        assert f"block_fp8/m{m}" in names
    for n, k in GEMV_SHAPES:
        assert f"gemv_crossover/{n}x{k}" in names
    for figure in FIGURES:
        assert f"figure/{figure}" in names
    # The correctness checks come before the timing sweep.
    assert names[:5] == [*CPU_CASES, "pytest"]
    assert names.index("quant_agreement") < names.index("figure/gpu_ptpc_vs_bf16_8192")
    assert names[-1] == "memcheck"  # the slowest, where the tool exists at all


@pytest.mark.slow  # 1-8 s: gpu_check.py in fresh processes
def test_a_case_that_raises_loses_none_of_the_others(tmp_path: Path) -> None:
    result, doc = _run(tmp_path, "--fail-case", "selection/h100")
    assert result.returncode == 1, result.stderr
    assert doc["finished"]
    assert doc["restarts"] == 0
    records = _records(doc)
    failed = records["selection/h100"]
    assert failed["status"] == "error", failed
    assert failed["error"]["type"] == "RuntimeError"
    assert "injected failure (--fail-case selection/h100)" in failed["error"]["message"]
    assert any("RuntimeError" in line for line in failed["error"]["traceback"])
    for name in ("machine", "selection/probed", "selection/h200", "pytest"):
        assert records[name]["status"] == "ok", records[name]
    assert doc["machine"]["torch"] == torch.__version__
    assert doc["machine"]["cuda_available"] is False
    pytest_run = records["pytest"]["result"]
    assert pytest_run["skipped"] > 0
    assert pytest_run["failed"] == pytest_run["errors"] == 0
    assert (tmp_path / "pytest_gpu.xml").exists()
    probed = records["selection/probed"]["result"]["choices"]
    assert {c["scheme"] for c in probed} == {s.value for s in kp.Scheme}
    h200 = records["selection/h200"]["result"]["choices"]
    chosen = {(c["scheme"], c["min_tokens"]): c["selected"] for c in h200}
    assert chosen["fp8_per_channel", 1] == "cuda_rowwise_scaled_mm"
    gpu_cases = [r for r in doc["cases"] if "cuda" in r["needs"]]
    assert len(gpu_cases) > 50
    for record in gpu_cases:
        assert record["status"] == "skipped", record
        assert "no NVIDIA GPU" in record["reason"]
    assert {r["status"] for r in doc["cases"]} == {"ok", "error", "skipped"}


@pytest.mark.slow  # 1-8 s: gpu_check.py in fresh processes
def test_the_json_holds_every_finished_case_when_the_process_ends(tmp_path: Path) -> None:
    result, doc = _run(tmp_path, "--skip-pytest", "--fail-case", "selection/h200:exit")
    assert result.returncode == 3, result.stderr
    records = _records(doc)
    assert not doc["finished"]
    for name in ("machine", "selection/probed", "selection/h100"):
        assert records[name]["status"] == "ok", records[name]
    assert records["selection/h200"]["status"] == "running"  # where it ended
    assert records["pytest"]["status"] == "pending"
    assert records["kernel/cuda_w8a16_cupy/fp8_weight_only/m1"]["status"] == "pending"


@pytest.mark.slow  # 1-8 s: gpu_check.py in fresh processes
def test_a_lost_cuda_context_restarts_the_run_and_keeps_the_records(tmp_path: Path) -> None:
    only = "selection,block_fp8/m300"
    result, doc = _run(tmp_path, "--only", only, "--fail-case", "selection/h100:lost")
    assert result.returncode == 1, result.stderr
    assert "left CUDA unusable; restarting" in result.stdout
    assert doc["finished"]
    assert doc["restarts"] == 1
    records = _records(doc)
    assert list(records) == [*CPU_CASES, "block_fp8/m300"]
    assert records["selection/h100"]["status"] == "error"
    assert records["selection/h100"]["cuda_context_lost"] is True
    # The cases after it ran in the new process; the ones before it were not run again.
    assert records["selection/h200"]["status"] == "ok"
    assert records["selection/h200"]["process"] == 1
    assert records["machine"]["process"] == records["selection/probed"]["process"] == 0
    assert records["block_fp8/m300"]["status"] == "skipped"


@pytest.mark.slow  # 1-8 s: gpu_check.py in fresh processes
def test_cases_past_the_budget_are_skipped_and_said_so(tmp_path: Path) -> None:
    _, doc = _run(tmp_path, "--only", "selection/probed", "--budget", "0")
    records = _records(doc)
    assert records["machine"]["status"] == "ok"
    assert "over the run's time budget" in records["selection/probed"]["reason"]


def test_a_misspelt_fail_case_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no case is named 'selection/h1000'"):
        gpu_check.main(["--out", str(tmp_path), "--fail-case", "selection/h1000:exit"])
    assert not (tmp_path / "gpu_check.json").exists()


# The schemes that quantize activations (the weight-only ones have none to compare).
_WEIGHT_ONLY = {"fp8_weight_only", "int4_weight_only", "int8_weight_only"}


@pytest.mark.parametrize("scheme", [s.value for s in kp.Scheme if s.value not in _WEIGHT_ONLY])
def test_the_reference_quantizes_activations_as_the_reference_kernel(scheme: str) -> None:
    """gpu_common's fp32 reference, which judges every GPU kernel's error, agrees row by row
    with cpu_dequant_reference (the numerics every kernel is tested against)."""
    from benchmarks.gpu_common import activation_reference
    from kernelpick.kernels import bind, dequantize_weight, quantize_canonical

    caps = kp.probe("cpu")
    config = kp.quant_config(
        scheme, weight_shape=(256, 384), out_dtype="float32", input_dtype="bfloat16"
    )
    decision = kp.choose(caps, config, kp.Policy(force="cpu_dequant_reference"))
    assert isinstance(decision, kp.Selected)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 384, generator=generator) * 3
    x[1] = 0  # the scale floor, and no division by zero
    x[2, 7] = 1e3  # an outlier: per-token and per-group scales differ from per-tensor
    x[3] *= 1e-9  # below the scale floor
    x = x.to(torch.bfloat16)
    w = torch.randn(256, 384, generator=generator) / 20
    static = config.activation is not None and config.activation.scale.static
    input_scale = (x.float().abs().amax() / 448).reshape(()) if static else None
    kernel = bind(decision, config, caps, "cpu")
    weight, scale = quantize_canonical(w, config)
    got = kernel.apply(x, kernel.prepare_weights(weight, scale, input_scale))
    activation = activation_reference(x, config, caps.fp8_format, input_scale)
    want = activation @ dequantize_weight(weight, scale, config).float().t()
    row_error = (got - want).norm(dim=1) / want.norm(dim=1).clamp(min=1e-30)
    assert float(row_error.max()) <= 1e-6
