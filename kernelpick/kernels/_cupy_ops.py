"""The cupy kernels as torch-facing functions: check inputs, pick a specialization and a
launch geometry (pure helpers), launch on torch's stream.

- ``quantize_per_token_cupy``: dynamic per-token FP8 in one kernel (amax, scale, clamp,
  cast per row), where torch ops take several passes over memory.
- ``w8a16_gemv_cupy``: the W8A16 product for small M, reading each FP8 weight once and
  never materializing a 16-bit copy.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kernelpick.core import Dtype
from kernelpick.kernels._cupy_runtime import Grid, launch
from kernelpick.kernels._cupy_source import (
    GemvSpec,
    QuantSpec,
    render_gemv,
    render_quant_per_token,
)
from kernelpick.kernels._quantize import scale_floor
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "GEMV_MAX_M",
    "gemv_launch",
    "gemv_vec",
    "quant_launch",
    "quant_vec",
    "quantize_per_token_cupy",
    "w8a16_gemv_cupy",
]

# Up to 16 rows the GEMV reads the FP8 weight at most twice (two passes of 8 rows), which
# beats dequantizing it to 16 bits and calling cuBLAS; past that the GEMM wins.
GEMV_MAX_M = 16
GEMV_M_TILE = 8
GEMV_WARPS = 4
QUANT_MAX_THREADS = 256

_quant_source = functools.lru_cache(maxsize=64)(render_quant_per_token)
_gemv_source = functools.lru_cache(maxsize=64)(render_gemv)
_HALF = (torch.bfloat16, torch.float16)


def quant_vec(dtype: torch.dtype, cols: int, row_stride: int, address: int) -> int:
    """8 elements per load (16 bytes of a 16-bit input) when rows allow it, else 1."""
    aligned = cols % 8 == 0 and row_stride % 8 == 0 and address % 16 == 0
    return 8 if dtype in _HALF and aligned else 1


def quant_launch(rows: int, cols: int, vec: int) -> Grid:
    """One block per row; enough warps to cover the row once, at most 256 threads."""
    loads = -(-cols // vec)
    threads = min(QUANT_MAX_THREADS, max(32, -(-loads // 32) * 32))
    return Grid((rows, 1, 1), (threads, 1, 1))


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


def _cuda(name: str, tensor: torch.Tensor) -> torch.device:
    if tensor.device.type != "cuda":
        raise reject(name, tensor, "a CUDA tensor (the cupy kernels run on NVIDIA GPUs)")
    return tensor.device


def quantize_per_token_cupy(x: torch.Tensor, fp8: Dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (FP8 ``[M, K]``, fp32 scales ``[M, 1]``), as ``quantize_per_token``."""
    check_tensor("x", x, dtypes=(*_HALF, torch.float32), shape=(None, None))
    device = _cuda("x", x)
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
    check_tensor("x", x, dtypes=_HALF, shape=(None, None))
    device = _cuda("x", x)
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
