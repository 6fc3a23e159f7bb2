"""The GPU cases of gpu_check.py: each CUDA kernel's error and time, block FP8 at small M,
the benchmark figures and the GEMV's crossover with dequantize + cuBLAS (the fused
quantizers' cases are in gpu_quant_cases.py).

Each returns its record (a dict; ``status`` defaults to ok), or raises. The runner skips
those that need CUDA or cupy where there is none. The cupy modules, which change often,
are imported inside the cases that call them, so a renamed function fails those only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
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
from kernelpick.kernels import (
    bind,
    dequantize_int,
    dequantize_weight,
    quantize_canonical,
    quantize_int,
)

__all__ = ["gemv_crossover_case", "kernel_case"]

# Relative error allowed against the fp32 reference of the same quantized operands: four
# units of the coarsest type the kernel computes or writes in (GPU GEMMs sum in their own
# order, and the activation quantizers may differ by a rounding tie).
_UNIT = {"float32": 2.5e-4, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def _canonical(
    w: torch.Tensor, config: kp.QuantConfig
) -> Callable[[Any, torch.Tensor | None], tuple[Any, torch.Tensor]]:
    """How to prepare a fresh bundle of ``w``'s canonical tensors (FP8, or an integer
    weight-only layer's packed words), and the fp32 weight they mean."""
    if config.weight.dtype.is_integer and config.activation is None:
        packed, scale, zero = quantize_int(w, config)
        meant = dequantize_int(packed, scale, zero, config)

        def integer(impl: Any, input_scale: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
            zp = None if zero is None else zero.clone()
            return impl.prepare_weights(packed.clone(), scale.clone(), zero_point=zp), meant

        return integer
    weight, fp8_scale = quantize_canonical(w, config)
    dequantized = dequantize_weight(weight, fp8_scale, config).float()

    def fp8(impl: Any, input_scale: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
        bundle = impl.prepare_weights(weight.clone(), fp8_scale.clone(), input_scale)
        return bundle, dequantized

    return fp8


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
    prepare = _canonical(w, config)
    bundle, dequantized = prepare(impl, input_scale)
    out = impl.apply(x, bundle, b)
    weight_only = verdict.kind is kp.KernelKind.W8A16
    x_ref = (
        x.float() if weight_only else activation_reference(x, config, caps.fp8_format, input_scale)
    )
    reference = x_ref @ dequantized.t()
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
        prepare(impl, input_scale)[0] for _ in range(copies(_bundle_bytes(bundle)) - 1)
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
