"""The fused quantizers' GPU cases of gpu_check.py: their bytes and scales against the torch
quantizers (on the GPU, and torch on the GPU against the CPU), and their bandwidth over a
device-to-device copy's.

The cupy modules, which change often, are imported inside the cases that call them, so a
renamed function fails those only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import kernelpick as kp
from benchmarks.gpu_common import Context, copies, cuda_device, time_paired
from kernelpick.core import Dtype

__all__ = ["group_quant_case", "quant_agreement_case", "quant_bandwidth_case"]

Quantizer = Callable[[torch.Tensor, Dtype], tuple[torch.Tensor, torch.Tensor]]
KINDS = ("random", "zero_row", "outlier", "nan_row")


def _agreement_input(kind: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(rows, cols, device=cuda_device()) * 3
    if kind == "zero_row":
        x[1] = 0
    elif kind == "outlier":
        x[1, cols // 2] = 1e4
    elif kind == "nan_row":
        x[1, cols // 3] = float("nan")
    return x.to(dtype)


def _differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Scales that differ, NaN against NaN aside."""
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int((~((a == b) | both_nan)).sum())


def _differ_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """FP8 bytes that differ, NaN against NaN aside (its sign bit may differ)."""
    both_nan = torch.isnan(a.float().cpu()) & torch.isnan(b.float().cpu())
    return int(((a.view(torch.uint8).cpu() != b.view(torch.uint8).cpu()) & ~both_nan).sum())


def _bandwidth(
    ctx: Context, rows: int, cols: int, fused: Quantizer, unfused: Quantizer, scales: int
) -> dict[str, Any]:
    """Both quantizers' GB/s (bf16 in; FP8 and ``scales`` fp32 scales out) and a copy's, on
    inputs rotated past the L2 cache, timed in the same run."""
    fp8 = kp.probe().fp8_format
    inputs = [
        torch.randn(rows, cols, device=cuda_device()).to(torch.bfloat16)
        for _ in range(copies(2 * rows * cols))
    ]
    target = torch.empty_like(inputs[0])
    times = time_paired(
        {
            "fused": [functools.partial(fused, x, fp8) for x in inputs],
            "unfused": [functools.partial(unfused, x, fp8) for x in inputs],
            "copy": [functools.partial(target.copy_, x) for x in inputs],
        },
        ctx.deadline,
    )
    moved = rows * cols * (2 + 1) + scales * 4  # read bf16, write FP8 and the scales
    copied = 2 * rows * cols * 2
    gbps = {name: (copied if name == "copy" else moved) / t.ms / 1e6 for name, t in times.items()}
    return {"gbps": gbps, "timing": {name: t.record() for name, t in times.items()}}


def quant_bandwidth_case(ctx: Context, *, rows: int, cols: int) -> dict[str, Any]:
    """The fused per-token quantizer's bandwidth over a copy's, and the torch quantizer's."""
    from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
    from kernelpick.kernels._quantize import quantize_per_token

    record = _bandwidth(ctx, rows, cols, quantize_per_token_cupy, quantize_per_token, rows)
    gbps = record["gbps"]
    figures = {
        "gpu_quant_bw_fraction": gbps["fused"] / gbps["copy"],
        "gpu_quant_unfused_bw_fraction": gbps["unfused"] / gbps["copy"],
        "gpu_quant_gbps": gbps["fused"],
        "gpu_copy_gbps": gbps["copy"],
    }
    return {"rows": rows, "cols": cols, **record, "figures": figures}


def _agreement(fused: Quantizer, unfused: Quantizer, shapes: tuple[tuple[int, int], ...],
               cpu: bool) -> dict[str, Any]:  # fmt: skip
    """Fused against unfused on the GPU (and, with ``cpu``, torch on the GPU against the
    CPU): differing bytes and scales per dtype, shape and kind of input."""
    fp8 = kp.probe().fp8_format
    checks: list[dict[str, Any]] = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols in shapes:
            for kind in KINDS:
                check: dict[str, Any] = {"dtype": str(dtype)[6:], "shape": [rows, cols]}
                check["kind"] = kind
                try:  # one input failing keeps the others
                    x = _agreement_input(kind, rows, cols, dtype)
                    q, scale = fused(x, fp8)
                    q_ref, scale_ref = unfused(x, fp8)
                    check["bytes"] = _differ_bytes(q, q_ref)
                    check["scales"] = _differ(scale, scale_ref)
                    check["nan_scales"] = [int(torch.isnan(s).sum()) for s in (scale, scale_ref)]
                    if cpu:
                        q_cpu, scale_cpu = unfused(x.cpu(), fp8)
                        check["torch_gpu_vs_cpu_bytes"] = _differ_bytes(q_ref, q_cpu)
                        check["torch_gpu_vs_cpu_scales"] = _differ(scale_ref.cpu(), scale_cpu)
                except Exception as error:
                    check["error"] = f"{type(error).__name__}: {error}"
                checks.append(check)
    counts = ("bytes", "scales", "torch_gpu_vs_cpu_bytes", "torch_gpu_vs_cpu_scales")
    totals = {c: sum(check.get(c, 0) for check in checks) for c in counts}
    agree = not any(totals.values()) and not any("error" in check for check in checks)
    return {"fp8": fp8.value, "checks": checks, "totals": totals,
            "status": "ok" if agree else "failed"}  # fmt: skip


def quant_agreement_case(ctx: Context) -> dict[str, Any]:
    """The fused per-token quantizer against torch's on the GPU, and torch's on the GPU
    against the CPU, on random, zero, outlier and NaN rows."""
    from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
    from kernelpick.kernels._quantize import quantize_per_token

    shapes = ((64, 4096), (33, 1000))
    return _agreement(quantize_per_token_cupy, quantize_per_token, shapes, cpu=True)


def group_quant_case(ctx: Context, *, rows: int, cols: int) -> dict[str, Any]:
    """The fused 1x128 group quantizer against ``quantize(x, (1, 128), fp8)`` (K = 4224 and
    200 have a short last group), then both one's bandwidth over a copy's."""
    from kernelpick.kernels._cupy_group_quant import quantize_groups_cupy
    from kernelpick.kernels._quantize import quantize

    def unfused(x: torch.Tensor, fp8: Dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(x, (1, 128), fp8)

    record = _agreement(quantize_groups_cupy, unfused, ((64, 4224), (17, 200)), cpu=False)
    timed = _bandwidth(ctx, rows, cols, quantize_groups_cupy, unfused, rows * -(-cols // 128))
    gbps = timed["gbps"]
    figures = {
        "gpu_group_quant_bw_fraction": gbps["fused"] / gbps["copy"],
        "gpu_group_quant_unfused_bw_fraction": gbps["unfused"] / gbps["copy"],
    }
    return {**record, **timed, "figures": figures}
