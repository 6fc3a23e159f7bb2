"""The W8A16 GEMV for small M: CUDA C source per specialization, launch geometry (pure
helpers), and the torch-facing op. It reads each FP8 weight once per pass and never
materializes a 16-bit copy.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._cupy_codecs import LOAD, STORE, render_codecs, storage_type
from kernelpick.kernels._cupy_runtime import HALF_DTYPES, Grid, cuda_device, launch
from kernelpick.kernels._torch import check_tensor, reject

__all__ = [
    "GEMV_MAX_M",
    "GEMV_M_TILE",
    "GEMV_WARPS",
    "GemvSpec",
    "gemv_launch",
    "gemv_specializations",
    "gemv_vec",
    "render_gemv",
    "w8a16_gemv_cupy",
]

# Up to 16 rows the GEMV reads the FP8 weight at most twice (two passes of 8 rows), which
# beats dequantizing it to 16 bits and calling cuBLAS; past that the GEMM wins.
GEMV_MAX_M = 16
GEMV_M_TILE = 8
GEMV_WARPS = 4


@attrs.frozen
class GemvSpec:
    """One specialization of the W8A16 GEMV: types, weight bytes per load, rows per pass."""

    in_dtype: Dtype
    out_dtype: Dtype
    fp8: Dtype
    vec: int  # FP8 weights per lane per step: 16 (one 16-byte load), 4 or 1
    m_tile: int  # activation rows served by one pass over the weight
    warps: int  # output channels per block, one warp each

    @property
    def name(self) -> str:
        return (
            f"kp_w8a16_gemv_{self.in_dtype.value}_{self.out_dtype.value}_{self.fp8.value}"
            f"_v{self.vec}_m{self.m_tile}"
        )


def render_gemv(spec: GemvSpec) -> str:
    """``y[m, n] = scale[n] * sum_k x[m, k] * fp8(w[n, k]) (+ bias[n])``, one warp per n.

    The FP8 weight is read once per ``m_tile`` rows and never materialized in 16 bits.
    """
    storage = storage_type(spec.in_dtype, "W8A16 input dtype")
    out_storage = storage_type(spec.out_dtype, "W8A16 output dtype")
    if storage != "u16":
        raise InvalidValueError("W8A16 input dtype", spec.in_dtype.value, "bfloat16 or float16")
    if spec.vec not in (1, 4, 16) or not 1 <= spec.m_tile <= 16 or not 1 <= spec.warps <= 32:
        raise InvalidValueError("GEMV spec", spec, "vec 1/4/16, m_tile 1..16, warps 1..32")
    load, store = LOAD[spec.in_dtype], STORE[spec.out_dtype]
    # Activations load as wide as the weights (16 bf16 are two 16-byte loads) into vector
    # registers, then read as 16-bit lanes: a u16 array cast to uint4* would be misaligned.
    x_load = {
        16: "            uint4 xv[2];\n"
        "            xv[0] = reinterpret_cast<const uint4*>(xr)[0];\n"
        "            xv[1] = reinterpret_cast<const uint4*>(xr)[1];",
        4: "            uint2 xv[1];\n            xv[0] = reinterpret_cast<const uint2*>(xr)[0];",
        1: "            in_t xv[1];\n            xv[0] = xr[0];",
    }[spec.vec]
    weight_load = {
        16: "uint4 wp = *reinterpret_cast<const uint4*>(wr + k);",
        4: "u32 wp = *reinterpret_cast<const u32*>(wr + k);",
        1: "u8 wp = wr[k];",
    }[spec.vec]
    return f"""{render_codecs(spec.fp8)}
#define KP_VEC {spec.vec}
#define KP_M_TILE {spec.m_tile}
#define KP_WARPS {spec.warps}
typedef u16 in_t;
typedef {out_storage} out_t;

extern "C" __global__ void {spec.name}(
    const in_t* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ scale,
    int scale_per_channel, const float* __restrict__ bias, int has_bias,
    out_t* __restrict__ y, int M, int N, int K)
{{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x * KP_WARPS + warp;
    const int m0 = blockIdx.y * KP_M_TILE;
    if (n >= N) return;
    const u8* wr = w + (long long)n * K;
    float acc[KP_M_TILE];
    for (int t = 0; t < KP_M_TILE; ++t) acc[t] = 0.0f;
    for (int k = lane * KP_VEC; k < K; k += 32 * KP_VEC) {{
        {weight_load}
        const u8* wb = reinterpret_cast<const u8*>(&wp);
        float wf[KP_VEC];
        for (int j = 0; j < KP_VEC; ++j) wf[j] = kp_fp8_to_f32(wb[j]);
        for (int t = 0; t < KP_M_TILE; ++t) {{
            if (m0 + t >= M) break;
            const in_t* xr = x + (long long)(m0 + t) * K + k;
{x_load}
            const in_t* xh = reinterpret_cast<const in_t*>(xv);
            float sum = 0.0f;
            for (int j = 0; j < KP_VEC; ++j) sum += {load}(xh[j]) * wf[j];
            acc[t] += sum;
        }}
    }}
    const float s = scale[scale_per_channel ? n : 0];
    const float b = has_bias ? bias[n] : 0.0f;
    for (int t = 0; t < KP_M_TILE; ++t) {{
        float v = acc[t];
        for (int offset = 16; offset > 0; offset >>= 1)
            v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
        if (lane == 0 && m0 + t < M) y[(long long)(m0 + t) * N + n] = {store}(v * s + b);
    }}
}}
"""


def gemv_specializations() -> tuple[GemvSpec, ...]:
    """Every specialization ``w8a16_gemv_cupy`` can launch."""
    return tuple(
        GemvSpec(x, out, fp8, vec, GEMV_M_TILE, GEMV_WARPS)
        for fp8 in (Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ)
        for x in (Dtype.BFLOAT16, Dtype.FLOAT16)
        for out in (Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32)
        for vec in (16, 4, 1)
    )


_gemv_source = functools.lru_cache(maxsize=64)(render_gemv)


def gemv_vec(k: int, x_address: int, w_address: int) -> int:
    """FP8 weights per lane per step: 16 (16-byte loads), 4, or 1 for any K."""
    if k % 16 == 0 and x_address % 16 == 0 and w_address % 16 == 0:
        return 16
    if k % 4 == 0 and x_address % 8 == 0 and w_address % 4 == 0:
        return 4
    return 1


def gemv_launch(m: int, n: int, m_tile: int = GEMV_M_TILE, warps: int = GEMV_WARPS) -> Grid:
    """A warp per output channel, ``warps`` channels a block, ``m_tile`` rows a pass."""
    return Grid((-(-n // warps), -(-m // m_tile), 1), (32 * warps, 1, 1))


def w8a16_gemv_cupy(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x [M, K] @ (weight [N, K] * scale).T + bias`` with FP8 weights decoded in-kernel.

    ``scale`` is fp32, one per output channel (``[N, 1]``/``[N]``) or one value.
    """
    check_tensor("x", x, dtypes=HALF_DTYPES, shape=(None, None))
    device = cuda_device("x", x)
    m, k = x.shape
    check_tensor(
        "weight", weight, dtypes=(torch.float8_e4m3fn, torch.float8_e4m3fnuz),
        shape=(None, k), device=device,
    )  # fmt: skip
    n = weight.shape[0]
    check_tensor("weight scale", scale, dtypes=(torch.float32,), device=device)
    if scale.numel() not in (1, n):
        raise reject("weight scale", scale, f"one value, or one per output channel ({n})")
    if not x.is_contiguous() or not weight.is_contiguous():
        bad = ("x", x) if not x.is_contiguous() else ("weight", weight)
        raise reject(*bad, "a contiguous tensor")
    if bias is not None:
        check_tensor("bias", bias, shape=(n,), device=device)
        bias = bias.to(torch.float32).contiguous()
    y = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return y
    vec = gemv_vec(k, x.data_ptr(), weight.data_ptr())
    fp8 = Dtype.parse(weight.dtype)
    spec = GemvSpec(Dtype.parse(x.dtype), Dtype.parse(out_dtype), fp8, vec, GEMV_M_TILE, GEMV_WARPS)
    args = (
        x, weight, scale.contiguous(), np.int32(scale.numel() == n),
        bias, np.int32(bias is not None), y, np.int32(m), np.int32(n), np.int32(k),
    )  # fmt: skip
    launch(spec.name, _gemv_source(spec), gemv_launch(m, n), args, device)
    return y
