"""Block-scaled FP8 on ``torch.nn.functional.scaled_mm``: DeepSeek-style 128-blocks and MXFP8.

Both families quantize activations per call in ``(1, g)`` groups along K (``g`` = 128, or
32 with E8M0 scales) and hand cuBLASLt the scales in the layout it reads, which is not the
canonical one:

- block FP8 (SM 9.0): activation scales ``[M, ceil(K/128)]`` outer-dim-major (strides
  ``(1, M)``); weight scales ``[L4, ceil(N/128)]`` with strides ``(1, L4)``, where
  ``L4 = round_up(ceil(K/128), 4)``: the K-blocks of each row padded to 16 bytes
  (cuBLAS "scaling factors layouts"; pytorch#166752 found that without the padding the
  answers are silently wrong when ``ceil(K/128) % 4 != 0``);
- MXFP8 (SM 10.x, 12.x): E8M0 scales of both operands in the 128x4-tiled, 32x16
  interleaved layout cuBLAS names for block scaling (``SWIZZLE_32_4_4``), padded to whole
  tiles with zero bytes.

The v2 API (``scaled_mm``) is used rather than ``torch._scaled_mm`` because it takes the
recipe and swizzle explicitly: v1 infers them from shapes and strides, and its 128x128
stride check has changed between torch versions. The weight's scales are arranged in
``prepare_weights`` (once per bundle, a small copy), so the bundle's scale is the arranged
tensor and the layout each family declares, which ``apply`` checks bundles against, says so.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch
import torch.nn.functional as F

from kernelpick.core import KernelKind
from kernelpick.kernels._base import KernelBase, WeightBundle
from kernelpick.kernels._canonical import canonical_scale_dtype

__all__ = [
    "BlockScaledMM",
    "MxScaledMM",
    "block_activation_scales",
    "block_weight_scales",
    "mx_blocked_scales",
    "mx_blocked_size",
]

# cuBLAS's tile of block-scaling factors: 128 rows (of M or N) by 4 scales along K.
_TILE_ROWS, _TILE_COLS = 128, 4


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def block_activation_scales(scale: torch.Tensor) -> torch.Tensor:
    """Row-major ``[M, ceil(K/128)]`` fp32 activation scales as cuBLASLt's 1x128 operand
    reads them: the same shape and values, outer-dim-major (strides ``(1, M)``).

    Written into explicit strides: ``t().contiguous().t()`` keeps a one-row scale's strides
    ``(ceil(K/128), 1)`` (a size-1 dimension counts as contiguous either way), which torch's
    fake-tensor check of ``scaled_mm`` refuses. Scales already in that layout (the fused
    cupy quantizer writes them so) are returned as they are, without a copy."""
    if scale.stride() == (1, scale.shape[0]):
        return scale
    out = torch.empty_strided(
        scale.shape, (1, scale.shape[0]), dtype=scale.dtype, device=scale.device
    )
    return out.copy_(scale)


def block_weight_scales(scale: torch.Tensor) -> torch.Tensor:
    """Canonical ``[ceil(N/128), ceil(K/128)]`` weight block scales as cuBLASLt's 128x128
    operand reads them: ``[L4, ceil(N/128)]`` with strides ``(1, L4)``, the K-blocks padded
    with zeros to ``L4 = round_up(ceil(K/128), 4)`` (16 bytes). A view when no padding is due."""
    blocks_k = scale.shape[1]
    padded = _round_up(blocks_k, _TILE_COLS)
    if padded != blocks_k:
        scale = F.pad(scale, (0, padded - blocks_k))
    return scale.t()


def mx_blocked_size(rows: int, k: int) -> int:
    """How many E8M0 scales the blocked layout of ``rows`` rows and K = ``k`` holds."""
    return _round_up(rows, _TILE_ROWS) * _round_up(-(-k // 32), _TILE_COLS)


def mx_blocked_scales(scale: torch.Tensor) -> torch.Tensor:
    """``[R, C]`` E8M0 scales (one per 32 elements along K) in cuBLAS's blocked layout, flat.

    Padded with zero bytes to whole 128x4 tiles, tiles in row-major order; inside a tile the
    scale of row ``r`` and column ``c`` sits at ``(r % 32) * 16 + (r // 32) * 4 + c``.
    """
    # Work on the bytes: torch has no padding or copy kernels for float8_e8m0fnu.
    bits = scale.view(torch.uint8)
    rows, cols = bits.shape
    height, width = _round_up(rows, _TILE_ROWS), _round_up(cols, _TILE_COLS)
    if (height, width) != (rows, cols):
        bits = F.pad(bits, (0, width - cols, 0, height - rows))
    # Row index = tile * 128 + quarter * 32 + lane; column = tile * 4 + c.
    tiles = bits.reshape(height // 128, 4, 32, width // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1).view(scale.dtype)


@attrs.frozen
class _ArrangedScales(KernelBase):
    """A ``scaled_mm`` family whose bundle holds the weight scales arranged for its GEMM.

    ``_arrange_scales`` maps the canonical ``[rows, cols]`` scale grid to that layout, on
    tensors of any device, the meta device included: the layout ``apply`` checks bundles
    against is derived by the same function, once, on a meta grid.
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        shape, strides, _ = self._bundle_form
        dtype = canonical_scale_dtype(self.config)
        grid = torch.empty(self._grid, dtype=dtype, device="meta")
        arranged = tuple(self._arrange_scales(grid).shape)
        object.__setattr__(self, "_bundle_form", (shape, strides, arranged))

    @property
    def _grid(self) -> tuple[int, int]:
        """The canonical scale as a 2-D grid: one per-tensor value is ``[1, 1]``."""
        shape = self.config.weight_scale_shape
        return (shape[0], shape[1]) if len(shape) == 2 else (1, 1)

    def _arrange_scales(self, grid: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define _arrange_scales")

    def prepare_weights(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        *,
        zero_point: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
    ) -> WeightBundle:
        """``KernelBase.prepare_weights``, then the weight scales arranged for the GEMM: a copy
        of the scales only (1/4096 of the weight's bytes for 128-blocks, 1/32 for MX)."""
        bundle = super().prepare_weights(
            weight, weight_scale, input_scale, zero_point=zero_point, g_idx=g_idx
        )
        return bundle._replace(scale=self._arrange_scales(bundle.scale.reshape(self._grid)))

    def _finish(self, out: torch.Tensor, bias: torch.Tensor | None, fused: bool) -> torch.Tensor:
        if bias is not None and not fused:
            out = (out.float() + bias.float()).to(self.out_dtype)
        return out


@attrs.frozen
class BlockScaledMM(_ArrangedScales):
    """1x128 dynamic FP8 activation groups x 128x128 FP8 weight blocks, fp32 scales."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _arrange_scales(self, grid: torch.Tensor) -> torch.Tensor:
        return block_weight_scales(grid)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        fused = bias is not None and self.fuse_bias
        out = F.scaled_mm(
            xq,
            bundle.weight,
            block_activation_scales(x_scale),
            F.ScalingType.BlockWise1x128,
            bundle.scale,
            F.ScalingType.BlockWise128x128,
            bias=bias.to(self.out_dtype) if fused and bias is not None else None,
            output_dtype=self.out_dtype,
        )
        return self._finish(out, bias, fused)


@attrs.frozen
class MxScaledMM(_ArrangedScales):
    """MXFP8: e4m3 operands with one E8M0 scale per 32 elements along K; the activation's
    are computed and arranged per call, the weight's arranged in ``prepare_weights``."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _arrange_scales(self, grid: torch.Tensor) -> torch.Tensor:
        return mx_blocked_scales(grid)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        # The quantizer's E8M0 scales are powers of two held in fp32: the cast is exact.
        scale_a = mx_blocked_scales(x_scale.to(torch.float8_e8m0fnu))
        fused = bias is not None and self.fuse_bias
        swizzle = F.SwizzleType.SWIZZLE_32_4_4
        out = F.scaled_mm(
            xq,
            bundle.weight,
            scale_a,
            F.ScalingType.BlockWise1x32,
            bundle.scale,
            F.ScalingType.BlockWise1x32,
            swizzle_a=swizzle,
            swizzle_b=swizzle,
            bias=bias.to(self.out_dtype) if fused and bias is not None else None,
            output_dtype=self.out_dtype,
        )
        return self._finish(out, bias, fused)
