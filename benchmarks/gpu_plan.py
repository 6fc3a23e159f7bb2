"""What gpu_check.py runs, in order: most important first, so a run cut short loses the
least. The case bodies are in gpu_host.py (no GPU of their own), gpu_cases.py and
gpu_quant_cases.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import kernelpick as kp
from benchmarks import gpu_cases, gpu_host, gpu_quant_cases
from benchmarks.gpu_common import Context

__all__ = ["FIGURES", "KERNELS", "VARIANTS", "Case", "plan"]

# Every CUDA kernel of the catalog and the schemes it serves; the first is swept over
# VARIANTS, the others run once (M = 16).
KERNELS: dict[str, tuple[str, ...]] = {
    "cuda_rowwise_scaled_mm": ("fp8_per_channel",),
    "cuda_block_scaled_mm": ("fp8_block",),
    "cuda_mxfp8_scaled_mm": ("mxfp8",),
    "cuda_tensorwise_scaled_mm": ("fp8_per_tensor", "fp8_per_tensor_static"),
    "cuda_channelwise_unfused": ("fp8_per_channel",),
    "cuda_int8_int_mm": ("int8_per_channel",),
    "cuda_int8_int_mm_padded": ("int8_per_channel",),
    "cuda_w8a16_cupy": ("fp8_weight_only", "fp8_per_tensor"),
    "cuda_w8a16_torch": ("fp8_weight_only", "fp8_per_tensor", "fp8_block", "mxfp8"),
    "cuda_int4pack_mm": ("int4_weight_only",),
    "cuda_wna16_torch": ("int4_weight_only", "int8_weight_only"),
}
_SQUARE = {"n": 8192, "k": 8192}
_FP16 = {"in_dtype": "float16", "out_dtype": "float16"}
# Shapes and dtypes of the sweep; where a kernel's rules turn one down, the case records
# the selector's reasons (status "rejected").
VARIANTS: dict[str, dict[str, Any]] = {
    "m1": {"m": 1, **_SQUARE},
    "m16": {"m": 16, **_SQUARE},
    "m2048": {"m": 2048, **_SQUARE},
    "m17_fp16_bias": {"m": 17, **_SQUARE, **_FP16, "bias": True},
    "m17_fp32": {"m": 17, **_SQUARE, "out_dtype": "float32"},
    "m17_4224_bias": {"m": 17, "n": 4224, "k": 4224, "bias": True},  # 33 blocks of 128
    "m17_4095_bias": {"m": 17, "n": 4095, "k": 4095, "bias": True},  # odd: W8A16 only
}
BLOCK_FP8_TOKENS = (1, 16, 17, 300)  # issue 26 item 5: the 1x128 scales' strides at small M
GEMV_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
GEMV_SHAPES = ((8192, 8192), (14336, 4096), (4096, 14336))
FIGURES = ("gpu_ptpc_vs_bf16_8192", "gpu_quant_bw_fraction", "gpu_w8a16_gemv_vs_bf16")
CASE_LIMIT_S = 30.0  # past it a case cuts its timing replays short
PYTEST_TIMEOUT_S = 180.0
MEMCHECK_TIMEOUT_S = 150.0
_CUDA, _CUPY = ("cuda",), ("cuda", "cupy")


@attrs.frozen
class Case:
    """One check: ``run(ctx, **params)`` returns its record."""

    name: str
    run: Callable[..., dict[str, Any]]
    params: dict[str, Any] = attrs.field(factory=dict, hash=False)
    needs: tuple[str, ...] = ()  # "cuda", "cupy": skipped where missing
    limit_s: float = CASE_LIMIT_S


def _unlisted(ctx: Context, *, kernel: str) -> dict[str, Any]:
    raise LookupError(f"{kernel} is in the catalog but not in gpu_plan.KERNELS: give it a scheme")


def _kernel(name: str, **params: Any) -> Case:
    return Case(name, gpu_cases.kernel_case, params, _CUDA)


def _host() -> list[Case]:
    devices = ("probed", "h100", "h200")
    return [
        Case("machine", gpu_host.machine_case),
        *(Case(f"selection/{d}", gpu_host.selection_case, {"device": d, **_SQUARE})
          for d in devices),
        Case("pytest", gpu_host.pytest_case, {"timeout_s": PYTEST_TIMEOUT_S}),
    ]  # fmt: skip


def _targeted() -> list[Case]:
    """The fused quantizers' bytes, block FP8 at small M, the figures, the GEMV crossover."""
    block = {"kernel": "cuda_block_scaled_mm", "scheme": "fp8_block", "n": 7168, "k": 2304}
    ptpc = {"kernel": None, "scheme": "fp8_per_channel", "m": 8192, **_SQUARE}
    gemv = {"kernel": "cuda_w8a16_cupy", "scheme": "fp8_weight_only", "m": 1, **_SQUARE}
    quant = {"rows": 8192, "cols": 8192}
    return [
        Case("quant_agreement", gpu_quant_cases.quant_agreement_case, needs=_CUPY),
        Case("group_quant", gpu_quant_cases.group_quant_case, quant, _CUPY),
        *(_kernel(f"block_fp8/m{m}", m=m, **block) for m in BLOCK_FP8_TOKENS),
        _kernel(f"figure/{FIGURES[0]}", figure=FIGURES[0], **ptpc),
        Case(f"figure/{FIGURES[1]}", gpu_quant_cases.quant_bandwidth_case, quant, _CUPY),
        _kernel(f"figure/{FIGURES[2]}", figure=FIGURES[2], **gemv),
        *(Case(f"gemv_crossover/{n}x{k}", gpu_cases.gemv_crossover_case,
               {"n": n, "k": k, "ms": GEMV_TOKENS}, _CUPY, 60.0) for n, k in GEMV_SHAPES),
    ]  # fmt: skip


def _sweep() -> list[Case]:
    """Every catalog kernel on every variant (variant by variant, so a cut run has every
    kernel at the first shapes), then its other schemes."""
    ids = kp.default_catalog().ids_for("cuda")
    cases = [Case(f"kernel/{i}", _unlisted, {"kernel": i}) for i in ids if i not in KERNELS]
    listed = [i for i in ids if i in KERNELS]
    runs = [(v, i, KERNELS[i][0]) for v in VARIANTS for i in listed]
    runs += [("m16", i, scheme) for i in listed for scheme in KERNELS[i][1:]]
    for variant, i, scheme in runs:
        params = {"kernel": i, "scheme": scheme, **VARIANTS[variant]}
        cases.append(_kernel(f"kernel/{i}/{scheme}/{variant}", **params))
    return cases


def plan() -> list[Case]:
    """Every case, in the order it runs: memcheck last, as it is the slowest (tens of
    seconds under the sanitizer) and the image may well not have the tool."""
    memcheck = Case("memcheck", gpu_host.memcheck_case, {"timeout_s": MEMCHECK_TIMEOUT_S}, _CUPY)
    return [*_host(), *_targeted(), *_sweep(), memcheck]
