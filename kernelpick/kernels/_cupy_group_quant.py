"""The fused dynamic 1x128 group FP8 quantizer (block FP8 activations): CUDA C source per
specialization, launch geometry (pure helpers), and the torch-facing op.

One pass over the input: each element is read once into registers, the group's amax is
reduced across 16 lanes, and the bytes and the group's scale are written, where torch ops
make about four full-size fp32 temporaries (issue 26, item 9). The scales are written
outer-dim-major (strides ``(1, M)``), the layout cuBLASLt's 1x128 operand reads.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._cupy_quant import QUANT_INPUTS, quant_preamble, quant_vec
from kernelpick.kernels._cupy_runtime import HALF_DTYPES, Grid, cuda_device, launch
from kernelpick.kernels._quantize import scale_floor
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "GROUP",
    "GROUP_LANES",
    "GroupQuantSpec",
    "group_quant_launch",
    "group_quant_specializations",
    "quantize_groups_cupy",
    "render_quant_groups",
]

GROUP = 128  # elements per group along K
GROUP_LANES = 16  # threads per group, 8 elements each
_MAX_THREADS = 256
_MAX_GRID_Y = 65535


@attrs.frozen
class GroupQuantSpec:
    """One specialization of the 1x128 group quantizer."""

    in_dtype: Dtype
    fp8: Dtype
    vec: int  # 8: one 16-byte load per thread (16-bit input); 1: scalar, bounds-checked

    @property
    def name(self) -> str:
        return f"kp_quant_groups_{self.in_dtype.value}_{self.fp8.value}_v{self.vec}"


def render_quant_groups(spec: GroupQuantSpec) -> str:
    """Dynamic 1x128 group quantization: 16 lanes per group, 8 elements per lane.

    The formula of ``kernels._quantize.quantize(x, (1, 128), fp8)``, byte for byte, with
    the per-token quantizer's helpers: amax by ``kp_nanmax`` (shuffled across the group's
    16 lanes), scale = ``kp_row_scale(amax)``, every quotient from ``kp_recip(scale)`` by
    ``kp_div_by_scale``, clamped and rounded by ``kp_quant2``. The last group of a row may
    be shorter (K % 128); its missing elements count as zeros, which leave the amax as it
    is. Scale ``g`` of row ``m`` is stored at ``scales[g * rows + m]``.
    """
    preamble, load = quant_preamble(spec.in_dtype, spec.fp8, spec.vec)
    return f"""{preamble}
/* grid (rows, ceil(groups / groups per block)); block: 16 lanes per group. A lane past
   the last group stays in the shuffles (they name all 32 lanes) but loads and stores
   nothing. No element loop: the 8 elements of a lane are unrolled and read once. */
extern "C" __global__ void {spec.name}(
    const in_t* __restrict__ x, u8* __restrict__ q, float* __restrict__ scales,
    int rows, int cols, int groups, long long x_row_stride)
{{
    const int row = blockIdx.x, lane = threadIdx.x & 15;
    const int g = blockIdx.y * (blockDim.x >> 4) + (threadIdx.x >> 4);
    const bool live = g < groups;
    const in_t* xr = x + (long long)row * x_row_stride;
    u8* qr = q + (long long)row * cols;
    float v[8];
    float amax = 0.0f;
#if KP_VEC == 8
    const int col = g * 128 + lane * 8;
    const bool in = live && col < cols;            /* cols % 8 == 0: all 8 or none */
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (in) packed = *reinterpret_cast<const uint4*>(xr + col);
    const u16* h = reinterpret_cast<const u16*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) {{
        v[j] = {load}(h[j]);
        amax = kp_nanmax(amax, fabsf(v[j]));
    }}
#else
    const int col = g * 128 + lane;                /* lane + 16 j: coalesced */
#pragma unroll
    for (int j = 0; j < 8; ++j) {{
        v[j] = live && col + 16 * j < cols ? {load}(xr[col + 16 * j]) : 0.0f;
        amax = kp_nanmax(amax, fabsf(v[j]));
    }}
#endif
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1)
        amax = kp_nanmax(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    const float scale = kp_row_scale(amax);
    if (live && lane == 0) scales[(long long)g * rows + row] = scale;
    const float r = kp_recip(scale), s = scale;
#if KP_VEC == 8
    if (in) {{
        u32 out[2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
            out[j] = (u32)kp_quant2(kp_div_by_scale(v[4 * j], r, s),
                                    kp_div_by_scale(v[4 * j + 1], r, s))
                     | ((u32)kp_quant2(kp_div_by_scale(v[4 * j + 2], r, s),
                                       kp_div_by_scale(v[4 * j + 3], r, s)) << 16);
        *reinterpret_cast<uint2*>(qr + col) = make_uint2(out[0], out[1]);
    }}
#else
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (live && col + 16 * j < cols)
            qr[col + 16 * j] = (u8)kp_quant2(kp_div_by_scale(v[j], r, s), 0.0f);
#endif
}}
"""


def group_quant_specializations() -> tuple[GroupQuantSpec, ...]:
    """Every specialization ``quantize_groups_cupy`` can launch."""
    return tuple(GroupQuantSpec(*inputs) for inputs in QUANT_INPUTS)


_group_source = functools.lru_cache(maxsize=64)(render_quant_groups)


def group_quant_launch(rows: int, cols: int) -> Grid:
    """Grid ``(rows, blocks per row)``; 16 threads per group, whole warps, at most 256."""
    groups = -(-cols // GROUP)
    threads = min(_MAX_THREADS, -(-groups * GROUP_LANES // 32) * 32)
    per_block = threads // GROUP_LANES
    return Grid((rows, -(-groups // per_block), 1), (threads, 1, 1))


def quantize_groups_cupy(
    x: torch.Tensor, fp8: Dtype, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (FP8 ``[M, K]``, fp32 scales ``[M, ceil(K/128)]``), as
    ``quantize(x, (1, 128), fp8)`` computes them; the scales have strides ``(1, M)``."""
    if group != GROUP:
        raise InvalidValueError("group", group, f"{GROUP} (the fused quantizer's group size)")
    check_tensor("x", x, dtypes=(*HALF_DTYPES, torch.float32), shape=(None, None))
    device = cuda_device("x", x)
    if x.stride(1) != 1:
        raise reject("x", x, "rows stored contiguously (stride 1 along K)")
    rows, cols = x.shape
    groups = -(-cols // GROUP)
    if groups > _MAX_GRID_Y * (_MAX_THREADS // GROUP_LANES):
        raise reject("x", x, f"K at most {_MAX_GRID_Y * _MAX_THREADS * 8} for the fused quantizer")
    q = torch.empty((rows, cols), dtype=torch_dtype(fp8), device=device)
    scales = torch.empty_strided((rows, groups), (1, rows), dtype=torch.float32, device=device)
    if rows == 0 or cols == 0:
        return q, scales.fill_(scale_floor(fp8))
    geometry = group_quant_launch(rows, cols)
    vec = quant_vec(x.dtype, cols, x.stride(0), x.data_ptr())
    spec = GroupQuantSpec(Dtype.parse(x.dtype), fp8, vec)
    args = (x, q, scales, np.int32(rows), np.int32(cols), np.int32(groups), np.int64(x.stride(0)))
    launch(spec.name, _group_source(spec), geometry, args, device)
    return q, scales
