"""The GPU cases of gpu_check.py: each CUDA kernel's error and time, block FP8 at small M,
the benchmark figures, the GEMV's crossover with dequantize + cuBLAS, and the fused
quantizer's bandwidth and byte agreement.

Each returns its record (a dict; ``status`` defaults to ok), or raises. The runner skips
those that need CUDA or cupy where there is none. The cupy modules, which change often,
are imported inside the cases that call them, so a renamed function fails those only.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

import kernelpick as kp
from benchmarks.gpu_common import (
    Context,
    Timing,
    activation_reference,
    copies,
    cuda_device,
    paired_ratio,
    relative_error,
    time_paired,
)
from kernelpick.kernels import bind, dequantize_weight, quantize_canonical

__all__ = [
    "gemv_crossover_case",
    "group_quant_case",
    "kernel_case",
    "quant_agreement_case",
    "quant_bandwidth_case",
]

# Relative error allowed against the fp32 reference of the same quantized operands: four
# units of the coarsest type the kernel computes or writes in (GPU GEMMs sum in their own
# order, and the activation quantizers may differ by a rounding tie).
_UNIT = {"float32": 2.5e-4, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def _bundle_bytes(bundle: Any) -> int:
    from benchmarks.rotation import flat, nbytes

    return nbytes(flat(bundle))


def _choice(caps: kp.DeviceCaps, config: kp.QuantConfig, kernel: str | None) -> kp.Decision:
    return kp.choose(caps, config, kp.Policy(force=kernel) if kernel else None)


def kernel_case(
    ctx: Context,
    *,
    kernel: str | None,
    scheme: str,
    m: int,
    n: int,
    k: int,
    in_dtype: str = "bfloat16",
    out_dtype: str = "bfloat16",
    bias: bool = False,
    figure: str | None = None,
) -> dict[str, Any]:
    """``kernel`` (None: the one kp.probe() + kp.choose selects) on one shape: its error
    against the fp32 reference and against the unquantized product, and its time against
    ``F.linear`` in the input dtype, both on rotated weights."""
    caps = kp.probe()
    config = kp.quant_config(
        scheme,
        weight_shape=(n, k),
        out_dtype=out_dtype,
        input_dtype=in_dtype,
        bias=bias,
        min_tokens=m,
    )
    decision = _choice(caps, config, kernel)
    if isinstance(decision, kp.Rejected):
        reasons = [r.render() for r in decision.reasons if kernel is None or r.kernel == kernel]
        return {"status": "rejected", "reasons": reasons}
    verdict = next(v for v in decision.trace if v.kernel == decision.kernel)
    device = cuda_device()
    torch.set_float32_matmul_precision("highest")  # the references: no TF32
    generator = torch.Generator(device=device).manual_seed(m * 7919 + n)
    dtype = getattr(torch, in_dtype)
    x = torch.randn(m, k, device=device, generator=generator).to(dtype)
    w = torch.randn(n, k, device=device, generator=generator) / math.sqrt(k)
    b = torch.randn(n, device=device, generator=generator).to(dtype) if bias else None
    act = config.activation
    static = act is not None and act.scale.static
    input_scale = (x.float().abs().amax() / caps.fp8_format.quant_max) if static else None
    impl = bind(decision, config, caps, device)
    fp8_weight, scale = quantize_canonical(w, config)
    bundle = impl.prepare_weights(fp8_weight, scale, input_scale)
    out = impl.apply(x, bundle, b)
    weight_only = verdict.kind is kp.KernelKind.W8A16
    x_ref = (
        x.float() if weight_only else activation_reference(x, config, caps.fp8_format, input_scale)
    )
    reference = x_ref @ dequantize_weight(fp8_weight, scale, config).float().t()
    exact = x.float() @ w.t()
    if b is not None:
        reference, exact = reference + b.float(), exact + b.float()
    unit = max(_UNIT[out_dtype], _UNIT[in_dtype] if weight_only else 0.0)
    error = relative_error(out, reference)
    record: dict[str, Any] = {
        "kernel": decision.kernel,
        "kind": verdict.kind.value,
        "degraded": decision.degraded,
        "out_dtype_got": str(out.dtype).removeprefix("torch."),
        "out_shape": list(out.shape),
        "error_vs_reference": error,
        "tolerance": 4 * unit,
        "error_vs_unquantized": relative_error(out, exact),
    }
    ok = error <= 4 * unit and out.dtype == getattr(torch, out_dtype) and out.shape == (m, n)
    del out, reference, exact, x_ref
    # The kernel's bundles and the baseline's weights, each ring past the L2 cache.
    bundles = [bundle] + [
        impl.prepare_weights(fp8_weight.clone(), scale.clone(), input_scale)
        for _ in range(copies(_bundle_bytes(bundle)) - 1)
    ]
    baseline = [w.to(dtype) for _ in range(copies(n * k * dtype.itemsize))]
    del w
    times = time_paired(
        {
            "kernel": [functools.partial(impl.apply, x, one, b) for one in bundles],
            "baseline": [functools.partial(F.linear, x, one, b) for one in baseline],
        },
        ctx.deadline,
    )
    vs = paired_ratio(times["kernel"], times["baseline"])
    record.update(
        kernel_ms=times["kernel"].ms,
        baseline_ms=times["baseline"].ms,
        baseline=f"F.linear {in_dtype}",
        vs_baseline=vs,
        timing={name: t.record() for name, t in times.items()},
    )
    if figure is not None:
        record["figures"] = {figure: vs}
    record["status"] = "ok" if ok else "failed"
    return record


def _gemv_point(
    m: int,
    k: int,
    impl: Any,
    rings: dict[str, list[Any]],
    reference: torch.Tensor,
    deadline: float,
) -> dict[str, Any]:
    from kernelpick.kernels._cupy_gemv import w8a16_gemv_cupy

    x = torch.randn(m, k, device=reference.device).to(torch.bfloat16)
    gemv_w, gemv_s = rings["gemv"][0]
    got = w8a16_gemv_cupy(x, gemv_w, gemv_s, None, torch.bfloat16)
    error = relative_error(got, x.float() @ reference.t())
    calls = {
        "gemv": [
            functools.partial(w8a16_gemv_cupy, x, q, s, None, torch.bfloat16)
            for q, s in rings["gemv"]
        ],
        "dequant_linear": [functools.partial(impl.apply, x, one) for one in rings["dequant"]],
        "bf16": [functools.partial(F.linear, x, one) for one in rings["bf16"]],
    }
    times: dict[str, Timing] = time_paired(calls, deadline)
    return {
        "m": m,
        "error_vs_reference": error,
        **{f"{name}_ms": t.ms for name, t in times.items()},
        "gemv_vs_dequant_linear": paired_ratio(times["gemv"], times["dequant_linear"]),
        "gemv_vs_bf16": paired_ratio(times["gemv"], times["bf16"]),
        "methods": sorted({t.method for t in times.values()}),
    }


def gemv_crossover_case(ctx: Context, *, n: int, k: int, ms: tuple[int, ...]) -> dict[str, Any]:
    """``w8a16_gemv_cupy`` against dequantize + ``F.linear`` (``cuda_w8a16_torch``) and a
    bf16 ``F.linear`` at each M: where the GEMV stops winning chooses ``GEMV_MAX_M``."""
    from kernelpick.kernels._cupy_gemv import GEMV_MAX_M

    caps, device = kp.probe(), cuda_device()
    torch.set_float32_matmul_precision("highest")
    config = kp.quant_config("fp8_weight_only", weight_shape=(n, k))
    w = torch.randn(n, k, device=device) / math.sqrt(k)
    fp8_weight, scale = quantize_canonical(w, config)
    impl = bind("cuda_w8a16_torch", config, caps, device)
    quantized = [(fp8_weight, scale)] + [
        (fp8_weight.clone(), scale.clone()) for _ in range(copies(n * k) - 1)
    ]
    rings: dict[str, list[Any]] = {
        "gemv": quantized,
        "dequant": [impl.prepare_weights(q, s) for q, s in quantized],
        "bf16": [w.to(torch.bfloat16) for _ in range(copies(2 * n * k))],
    }
    reference = dequantize_weight(fp8_weight, scale, config).float()
    points: list[dict[str, Any]] = []
    for m in ms:
        try:
            points.append(_gemv_point(m, k, impl, rings, reference, ctx.deadline))
        except Exception as error:  # one M failing keeps the others
            points.append({"m": m, "error": f"{type(error).__name__}: {error}"})
    timed = [p for p in points if "gemv_vs_dequant_linear" in p]
    loses = [p["m"] for p in timed if p["gemv_vs_dequant_linear"] >= 1.0]
    wins_through = max((p["m"] for p in timed if not loses or p["m"] < min(loses)), default=None)
    return {
        "points": points,
        "gemv_max_m_now": GEMV_MAX_M,
        "gemv_wins_through_m": wins_through,
        "dequant_linear_wins_from_m": min(loses, default=None),
        "figures": {f"gpu_gemv_wins_through_m_{n}x{k}": wins_through},
        "status": "ok" if len(timed) == len(points) else "failed",
    }


def quant_bandwidth_case(ctx: Context, *, rows: int, cols: int) -> dict[str, Any]:
    """The fused per-token quantizer's bandwidth (bf16 in, FP8 and fp32 scales out) over a
    device-to-device copy's, and the unfused torch quantizer's, on rotated inputs."""
    from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
    from kernelpick.kernels._quantize import quantize_per_token

    device, fp8 = cuda_device(), kp.probe().fp8_format
    inputs = [
        torch.randn(rows, cols, device=device).to(torch.bfloat16)
        for _ in range(copies(2 * rows * cols))
    ]
    target = torch.empty_like(inputs[0])
    times = time_paired(
        {
            "fused": [functools.partial(quantize_per_token_cupy, x, fp8) for x in inputs],
            "unfused": [functools.partial(quantize_per_token, x, fp8) for x in inputs],
            "copy": [functools.partial(target.copy_, x) for x in inputs],
        },
        ctx.deadline,
    )
    moved = rows * cols * (2 + 1) + rows * 4  # read bf16, write FP8 and the row scales
    copied = 2 * rows * cols * 2
    gbps = {name: (copied if name == "copy" else moved) / t.ms / 1e6 for name, t in times.items()}
    return {
        "rows": rows,
        "cols": cols,
        "gbps": gbps,
        "timing": {name: t.record() for name, t in times.items()},
        "figures": {
            "gpu_quant_bw_fraction": gbps["fused"] / gbps["copy"],
            "gpu_quant_unfused_bw_fraction": gbps["unfused"] / gbps["copy"],
            "gpu_quant_gbps": gbps["fused"],
            "gpu_copy_gbps": gbps["copy"],
        },
    }


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
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int((~((a == b) | both_nan)).sum())


def quant_agreement_case(ctx: Context) -> dict[str, Any]:
    """Fused (cupy) and unfused (torch) per-token quantizers on the GPU, and torch on the
    CPU: differing FP8 bytes and row scales, on random, zero, outlier and NaN rows."""
    from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
    from kernelpick.kernels._quantize import quantize_per_token

    fp8 = kp.probe().fp8_format
    rows_out: list[dict[str, Any]] = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols in ((64, 4096), (33, 1000)):
            for kind in ("random", "zero_row", "outlier", "nan_row"):
                row: dict[str, Any] = {"dtype": str(dtype)[6:], "shape": [rows, cols], "kind": kind}
                try:
                    x = _agreement_input(kind, rows, cols, dtype)
                    fused, fused_scale = quantize_per_token_cupy(x, fp8)
                    torch_q, torch_scale = quantize_per_token(x, fp8)
                    cpu_q, cpu_scale = quantize_per_token(x.cpu(), fp8)
                    row.update(
                        fused_vs_torch_bytes=_differ(
                            fused.view(torch.uint8), torch_q.view(torch.uint8)
                        ),
                        fused_vs_torch_scales=_differ(fused_scale, torch_scale),
                        torch_gpu_vs_cpu_bytes=_differ(
                            torch_q.view(torch.uint8).cpu(), cpu_q.view(torch.uint8)
                        ),
                        torch_gpu_vs_cpu_scales=_differ(torch_scale.cpu(), cpu_scale),
                        fused_nan_rows=int(torch.isnan(fused_scale).sum()),
                        torch_nan_rows=int(torch.isnan(torch_scale).sum()),
                    )
                except Exception as error:  # one input failing keeps the others
                    row["error"] = f"{type(error).__name__}: {error}"
                rows_out.append(row)
    counts = (
        "fused_vs_torch_bytes",
        "fused_vs_torch_scales",
        "torch_gpu_vs_cpu_bytes",
        "torch_gpu_vs_cpu_scales",
    )
    agree = all("error" not in r and not any(r[c] for c in counts) for r in rows_out)
    totals = {c: sum(r.get(c, 0) for r in rows_out) for c in counts}
    return {
        "fp8": fp8.value,
        "rows": rows_out,
        "totals": totals,
        "status": "ok" if agree else "failed",
    }


def _differ_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """FP8 bytes that differ, NaN against NaN aside (its sign bit may differ)."""
    both_nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return int(((a.view(torch.uint8) != b.view(torch.uint8)) & ~both_nan).sum())


def group_quant_case(ctx: Context, *, rows: int, cols: int) -> dict[str, Any]:
    """The fused 1x128 group quantizer against ``quantize(x, (1, 128), fp8)`` on the GPU:
    differing bytes and scales (random, zero, outlier and NaN rows; K = 4224 and 200 have a
    short last group), then both one's bandwidth (bf16 in, FP8 and scales out) over a copy's."""
    from kernelpick.kernels._cupy_group_quant import quantize_groups_cupy
    from kernelpick.kernels._quantize import quantize

    fp8 = kp.probe().fp8_format
    checks: list[dict[str, Any]] = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for shape in ((64, 4224), (17, 200)):
            for kind in ("random", "zero_row", "outlier", "nan_row"):
                x = _agreement_input(kind, *shape, dtype)
                fused, fused_scale = quantize_groups_cupy(x, fp8)
                ref, ref_scale = quantize(x, (1, 128), fp8)
                checks.append(
                    {
                        "dtype": str(dtype)[6:],
                        "shape": list(shape),
                        "kind": kind,
                        "bytes": _differ_bytes(fused, ref),
                        "scales": _differ(fused_scale, ref_scale),
                    }
                )
    device = cuda_device()
    inputs = [
        torch.randn(rows, cols, device=device).to(torch.bfloat16)
        for _ in range(copies(2 * rows * cols))
    ]
    target = torch.empty_like(inputs[0])
    times = time_paired(
        {
            "fused": [functools.partial(quantize_groups_cupy, x, fp8) for x in inputs],
            "unfused": [functools.partial(quantize, x, (1, 128), fp8) for x in inputs],
            "copy": [functools.partial(target.copy_, x) for x in inputs],
        },
        ctx.deadline,
    )
    moved = rows * cols * (2 + 1) + rows * -(-cols // 128) * 4
    gbps = {n: (4 * rows * cols if n == "copy" else moved) / t.ms / 1e6 for n, t in times.items()}
    agree = not any(c["bytes"] or c["scales"] for c in checks)
    return {
        "fp8": fp8.value,
        "checks": checks,
        "gbps": gbps,
        "timing": {name: t.record() for name, t in times.items()},
        "figures": {
            "gpu_group_quant_bw_fraction": gbps["fused"] / gbps["copy"],
            "gpu_group_quant_unfused_bw_fraction": gbps["unfused"] / gbps["copy"],
        },
        "status": "ok" if agree else "failed",
    }
