"""The cases of gpu_check.py that need no GPU of their own, or run one in a subprocess: the
machine record, selection on the probed device and on device profiles, ``pytest
tests/gpu``, and a compute-sanitizer memcheck pass over the cupy kernels."""

from __future__ import annotations

import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernelpick as kp
from benchmarks.gpu_common import Context, Skip
from kernelpick.kernels import cupy_usable

__all__ = ["machine_case", "memcheck_case", "pytest_case", "sanitizer", "selection_case"]

TAIL_LINES = 30
MAX_FAILURES = 50


def _tail(text: str | bytes | None, lines: int = TAIL_LINES) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").splitlines()[-lines:]


def _cupy() -> Any:
    return importlib.import_module("cupy")  # untyped, and absent on some machines


def _torch_cuda(query: Callable[[Any], object]) -> Callable[[], object]:
    """``query(torch)`` on device 0, or the reason it cannot be asked."""

    def read() -> object:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        return query(torch)

    return read


def _properties(torch: Any) -> Any:
    return torch.cuda.get_device_properties(0)


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True, cwd=cwd)
    return done.stdout.strip()


def sanitizer() -> str | None:
    """compute-sanitizer on PATH, or in the usual CUDA toolkit places."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for place in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"), reverse=True):
        if place.is_file():
            return str(place)
    return None


def machine_case(ctx: Context) -> dict[str, Any]:
    """Versions and the device, each field read on its own: one that cannot be read is
    recorded as the error it raised."""
    import torch

    fields: dict[str, Callable[[], object]] = {
        "python": lambda: sys.version.split()[0],
        "platform": platform.platform,
        "kernelpick": lambda: kp.__version__,
        "git_commit": lambda: _run(["git", "rev-parse", "HEAD"], ctx.root),
        "torch": lambda: torch.__version__,
        "torch_cuda": lambda: torch.version.cuda,
        "cudnn": torch.backends.cudnn.version,
        "cuda_available": torch.cuda.is_available,
        "gpu_name": _torch_cuda(lambda t: t.cuda.get_device_name(0)),
        "capability": _torch_cuda(lambda t: ".".join(map(str, t.cuda.get_device_capability(0)))),
        "sm_count": _torch_cuda(lambda t: _properties(t).multi_processor_count),
        "l2_bytes": _torch_cuda(lambda t: _properties(t).L2_cache_size),
        "memory_bytes": _torch_cuda(lambda t: _properties(t).total_memory),
        "cupy": lambda: _cupy().__version__,
        "cupy_runtime": lambda: _cupy().cuda.runtime.runtimeGetVersion(),
        "nvrtc": lambda: list(_cupy().cuda.nvrtc.getVersion()),
        "driver": lambda: _cupy().cuda.runtime.driverGetVersion(),
        "nvidia_smi": lambda: _run(
            [
                "nvidia-smi",
                "--format=csv",
                "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
            ]
        ),
        "cupy_usable": cupy_usable,
        "probe": lambda: kp.probe().render(),
        "probe_libraries": lambda: sorted(kp.probe().libraries),
        "probe_features": lambda: sorted(kp.probe().features),
        "compute_sanitizer": sanitizer,
        "env": lambda: {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("KERNELPICK_", "CUDA_", "PYTORCH_", "CUPY_"))
        },
    }
    record: dict[str, Any] = {}
    for name, read in fields.items():
        try:
            record[name] = read()
        except Exception as error:  # recorded, not fatal
            record[name] = {"error": f"{type(error).__name__}: {error}"}
    return record


def selection_case(ctx: Context, *, device: str, n: int, k: int) -> dict[str, Any]:
    """What ``kp.choose`` picks, unforced, for every scheme at decode and prefill
    ``min_tokens``, on the probed device (``device="probed"``) or a device profile."""
    caps = kp.probe() if device == "probed" else kp.device_profile(device)
    rows = []
    for scheme in kp.Scheme:
        for min_tokens in (1, 17):
            config = kp.quant_config(scheme, weight_shape=(n, k), min_tokens=min_tokens)
            decision = kp.choose(caps, config)
            rows.append(
                {
                    "scheme": scheme.value,
                    "min_tokens": min_tokens,
                    "selected": decision.kernel if isinstance(decision, kp.Selected) else None,
                    "degraded": isinstance(decision, kp.Selected) and decision.degraded,
                    "rejections": {
                        v.kernel: [r.render() for r in v.reasons]
                        for v in decision.trace
                        if not v.ok
                    },
                }
            )
    return {"device": caps.render(), "n": n, "k": k, "choices": rows}


def _junit(path: Path) -> dict[str, Any]:
    """Counts and failing test ids (with short messages) from pytest's JUnit XML."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failing: list[dict[str, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        counts[{"failure": "failed", "error": "errors"}.get(outcome.tag, "skipped")] += 1
        if outcome.tag != "skipped" and len(failing) < MAX_FAILURES:
            failing.append({"id": test, "message": (outcome.get("message") or "")[:300]})
    return {**counts, "failing": failing}


def pytest_case(ctx: Context, *, timeout_s: float) -> dict[str, Any]:
    """``pytest tests/gpu`` in a subprocess; its JUnit XML goes to the out dir."""
    junit = ctx.out_dir / "pytest_gpu.xml"
    junit.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={junit}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ctx.root), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    record: dict[str, Any] = {"command": " ".join(cmd[1:]), "timeout_s": timeout_s}
    try:
        done = subprocess.run(
            cmd, cwd=ctx.root, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as timeout:
        record.update(
            status="error",
            error=f"timed out after {timeout_s} s",
            output_tail=_tail(timeout.stdout),
        )
        return record
    record.update(returncode=done.returncode, output_tail=_tail(done.stdout + done.stderr, 12))
    try:
        record.update(_junit(junit))
    except (OSError, ET.ParseError) as error:  # the counts are lost, the output tail is not
        record["junit_error"] = f"{type(error).__name__}: {error}"
    # 0: all passed (skips included); 1: some failed; anything else: pytest itself failed.
    record["status"] = {0: "ok", 1: "failed"}.get(done.returncode, "error")
    return record


# Launches each cupy kernel family once on small odd shapes (tails, misaligned rows, two
# GEMV passes), directly and through the kernels that call them; each launch in its own try.
MEMCHECK_SNIPPET = r"""
import torch
import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import bind, quantize_canonical

dev = torch.device("cuda", 0)
caps = kp.probe()

def run(label, fn):
    try:
        fn()
        torch.cuda.synchronize()
        print("LAUNCH OK", label, flush=True)
    except Exception as error:
        print("LAUNCH FAILED", label, type(error).__name__, str(error)[:200], flush=True)

from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
for fp8 in (Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols in ((3, 17), (5, 1000), (2, 24), (1, 1)):
            x = torch.randn(rows, cols + 1, device=dev).to(dtype)
            run(f"quant {fp8.value} {dtype} {rows}x{cols}",
                lambda: quantize_per_token_cupy(x[:, :cols].contiguous(), fp8))
            run(f"quant {fp8.value} {dtype} {rows}x{cols} offset view",
                lambda: quantize_per_token_cupy(x[:, 1:], fp8))

from kernelpick.kernels._cupy_gemv import w8a16_gemv_cupy
for xd in (torch.bfloat16, torch.float16):
    for od in (torch.bfloat16, torch.float16, torch.float32):
        for m, n, k in ((1, 5, 13), (3, 33, 12), (9, 7, 32), (16, 4, 48)):
            for bias in (False, True):
                x = torch.randn(m, k, device=dev).to(xd)
                w = torch.randn(n, k, device=dev).clamp(-4, 4).to(torch.float8_e4m3fn)
                s = torch.rand(n, 1, device=dev) + 0.5
                b = torch.randn(n, device=dev).to(xd) if bias else None
                run(f"gemv {xd} -> {od} m={m} n={n} k={k} bias={bias}",
                    lambda: w8a16_gemv_cupy(x, w, s, b, od))

for kernel, scheme, (m, n, k) in (
    ("cuda_w8a16_cupy", "fp8_weight_only", (3, 33, 100)),
    ("cuda_rowwise_scaled_mm", "fp8_per_channel", (5, 48, 272)),
    ("cuda_block_scaled_mm", "fp8_block", (3, 256, 384)),
):
    config = kp.quant_config(scheme, weight_shape=(n, k))
    decision = kp.choose(caps, config, kp.Policy(force=kernel))
    if not isinstance(decision, kp.Selected):
        print("LAUNCH REJECTED", kernel, flush=True)
        continue
    impl = bind(decision, config, caps, dev)
    bundle = impl.prepare_weights(*quantize_canonical(torch.randn(n, k, device=dev), config))
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    run(f"{kernel} m={m} n={n} k={k}", lambda: impl.apply(x, bundle))
"""


def memcheck_case(ctx: Context, *, timeout_s: float) -> dict[str, Any]:
    """The cupy kernels under ``compute-sanitizer --tool memcheck``; torch's caching
    allocator is off there, so an access past a tensor's end is past an allocation."""
    tool = sanitizer()
    if tool is None:
        raise Skip("compute-sanitizer is neither on PATH nor under /usr/local/cuda*/bin")
    log = ctx.out_dir / "memcheck.txt"
    cmd = [
        tool,
        "--tool",
        "memcheck",
        "--leak-check",
        "no",
        "--print-limit",
        "50",
        sys.executable,
        "-c",
        MEMCHECK_SNIPPET,
    ]
    env = {
        **os.environ,
        "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ctx.root), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    record: dict[str, Any] = {"tool": tool, "timeout_s": timeout_s, "log": log.name}
    try:
        done = subprocess.run(
            cmd, cwd=ctx.root, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as timeout:
        out = timeout.stdout.decode(errors="replace") if isinstance(timeout.stdout, bytes) else ""
        log.write_text(out[-2_000_000:])
        record.update(
            status="error",
            error=f"timed out after {timeout_s} s",
            launches_ok=out.count("LAUNCH OK"),
            output_tail=_tail(out),
        )
        return record
    out = done.stdout + done.stderr
    log.write_text(out[-2_000_000:])
    summary = re.search(r"ERROR SUMMARY: (\d+) error", out)
    errors = int(summary.group(1)) if summary else None
    failed = [line for line in out.splitlines() if line.startswith("LAUNCH FAILED")]
    record.update(
        returncode=done.returncode,
        errors=errors,
        launches_ok=out.count("LAUNCH OK"),
        launches_failed=failed[:MAX_FAILURES],
        output_tail=_tail(out),
        status="ok" if errors == 0 and not failed and done.returncode == 0 else "failed",
    )
    return record
