"""The fused dynamic per-token FP8 quantizer: CUDA C source per specialization, launch
geometry (pure helpers), and the torch-facing op.

One kernel does amax, scale, clamp and cast per row, where torch ops take several passes
over memory.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._cupy_codecs import LOAD, render_fp8_encode, storage_type
from kernelpick.kernels._cupy_runtime import HALF_DTYPES, Grid, cuda_device, launch
from kernelpick.kernels._quantize import scale_floor
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "QUANT_INPUTS",
    "QUANT_MAX_THREADS",
    "QuantSpec",
    "quant_launch",
    "quant_preamble",
    "quant_specializations",
    "quant_vec",
    "quantize_per_token_cupy",
    "render_quant_per_token",
]

QUANT_MAX_THREADS = 256


@attrs.frozen
class QuantSpec:
    """One specialization of the per-token quantizer."""

    in_dtype: Dtype
    fp8: Dtype
    vec: int  # elements per load: 8 (16-byte loads of 16-bit input) or 1

    @property
    def name(self) -> str:
        return f"kp_quant_per_token_{self.in_dtype.value}_{self.fp8.value}_v{self.vec}"


def quant_preamble(in_dtype: Dtype, fp8: Dtype, vec: int) -> tuple[str, str]:
    """What every fused quantizer's source starts with (the encode helpers, ``KP_VEC`` and
    the element type ``in_t``), and the name of its element load; ``vec`` 8 (16-byte
    loads) needs a 16-bit input."""
    storage = storage_type(in_dtype, "quantizer input dtype")
    if vec not in (1, 8) or (vec == 8 and storage != "u16"):
        raise InvalidValueError("vec", vec, "8 (16-bit input) or 1")
    preamble = f"{render_fp8_encode(fp8)}\n#define KP_VEC {vec}\ntypedef {storage} in_t;\n"
    return preamble, LOAD[in_dtype]


def render_quant_per_token(spec: QuantSpec) -> str:
    """Dynamic per-token quantization, one block per row: amax, scale, clamp, cast.

    The formula of ``kernels._quantize`` (docs/design.md#quantization-numerics), byte for
    byte: scale = max(amax / fp8_max, scale_floor(fp8)) with one IEEE division per row,
    each element's exact quotient from the row's reciprocal (``kp_div_by_scale``), clamped
    to the FP8 range and rounded to nearest even. As in torch, a NaN in a row makes the
    row's scale and every byte NaN, and an infinite amax an infinite scale.
    """
    preamble, load = quant_preamble(spec.in_dtype, spec.fp8, spec.vec)
    return f"""{preamble}
__device__ __forceinline__ float kp_warp_max(float v) {{
    for (int offset = 16; offset > 0; offset >>= 1)
        v = kp_nanmax(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}}

/* The element loops are "#pragma unroll 1": one iteration is one step of KP_VEC elements,
   which the static SASS count (benchmarks/gpu_static.py) relies on. */
extern "C" __global__ void {spec.name}(
    const in_t* __restrict__ x, u8* __restrict__ q, float* __restrict__ scales,
    int rows, int cols, long long x_row_stride)
{{
    __shared__ float warp_max[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const in_t* xr = x + (long long)row * x_row_stride;
    u8* qr = q + (long long)row * cols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float amax = 0.0f;
#if KP_VEC == 8
    const int vecs = cols / 8;
#pragma unroll 1
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {{
        uint4 packed = reinterpret_cast<const uint4*>(xr)[i];
        const u16* h = reinterpret_cast<const u16*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; ++j) amax = kp_nanmax(amax, fabsf({load}(h[j])));
    }}
#else
#pragma unroll 1
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        amax = kp_nanmax(amax, fabsf({load}(xr[i])));
#endif
    amax = kp_warp_max(amax);
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    if (warp == 0) {{
        amax = lane < (int)(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
        amax = kp_warp_max(amax);
        if (lane == 0) warp_max[0] = amax;
    }}
    __syncthreads();
    const float scale = kp_row_scale(warp_max[0]);
    if (threadIdx.x == 0) scales[row] = scale;
    const float r = kp_recip(scale), s = scale;
#if KP_VEC == 8
#pragma unroll 1
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) {{
        uint4 packed = reinterpret_cast<const uint4*>(xr)[i];
        const u16* h = reinterpret_cast<const u16*>(&packed);
        u32 out[2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
            out[j] = (u32)kp_quant2(kp_div_by_scale({load}(h[4 * j]), r, s),
                                    kp_div_by_scale({load}(h[4 * j + 1]), r, s))
                     | ((u32)kp_quant2(kp_div_by_scale({load}(h[4 * j + 2]), r, s),
                                       kp_div_by_scale({load}(h[4 * j + 3]), r, s)) << 16);
        reinterpret_cast<uint2*>(qr)[i] = make_uint2(out[0], out[1]);
    }}
#else
#pragma unroll 1
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        qr[i] = (u8)kp_quant2(kp_div_by_scale({load}(xr[i]), r, s), 0.0f);
#endif
}}
"""


# The (input dtype, format, vec) every fused quantizer is built for: 16-byte loads of
# 16-bit input where rows allow them (``quant_vec``), scalar loads otherwise.
QUANT_INPUTS: tuple[tuple[Dtype, Dtype, int], ...] = tuple(
    (dtype, fp8, vec)
    for fp8 in (Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ)
    for dtype, vec in ((Dtype.BFLOAT16, 8), (Dtype.BFLOAT16, 1), (Dtype.FLOAT16, 8),
                       (Dtype.FLOAT16, 1), (Dtype.FLOAT32, 1))
)  # fmt: skip


def quant_specializations() -> tuple[QuantSpec, ...]:
    """Every specialization ``quantize_per_token_cupy`` can launch."""
    return tuple(QuantSpec(*inputs) for inputs in QUANT_INPUTS)


_quant_source = functools.lru_cache(maxsize=64)(render_quant_per_token)


def quant_vec(dtype: torch.dtype, cols: int, row_stride: int, address: int) -> int:
    """8 elements per load (16 bytes of a 16-bit input) when rows allow it, else 1: for
    every fused quantizer (per token, per group)."""
    aligned = cols % 8 == 0 and row_stride % 8 == 0 and address % 16 == 0
    return 8 if dtype in HALF_DTYPES and aligned else 1


def quant_launch(rows: int, cols: int, vec: int) -> Grid:
    """One block per row; enough warps to cover the row once, at most 256 threads."""
    loads = -(-cols // vec)
    threads = min(QUANT_MAX_THREADS, max(32, -(-loads // 32) * 32))
    return Grid((rows, 1, 1), (threads, 1, 1))


def quantize_per_token_cupy(x: torch.Tensor, fp8: Dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (FP8 ``[M, K]``, fp32 scales ``[M, 1]``), as ``quantize_per_token``."""
    check_tensor("x", x, dtypes=(*HALF_DTYPES, torch.float32), shape=(None, None))
    device = cuda_device("x", x)
    if x.stride(1) != 1:
        raise reject("x", x, "rows stored contiguously (stride 1 along K)")
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch_dtype(fp8), device=device)
    scales = torch.empty((rows, 1), dtype=torch.float32, device=device)
    if rows == 0 or cols == 0:
        return q, scales.fill_(scale_floor(fp8))
    vec = quant_vec(x.dtype, cols, x.stride(0), x.data_ptr())
    spec = QuantSpec(Dtype.parse(x.dtype), fp8, vec)
    args = (x, q, scales, np.int32(rows), np.int32(cols), np.int64(x.stride(0)))
    launch(spec.name, _quant_source(spec), quant_launch(rows, cols, vec), args, device)
    return q, scales
