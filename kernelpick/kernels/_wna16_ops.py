"""The integer weight-only families on torch's own ops.

- ``Int4PackMM``: the tinygemm int4 GEMM (CPU, CUDA, ROCm), ``(q - 8) * scale + zero``
  per group, a zero point folded into ``zero = -scale * z``.
- ``Int8PackMM``: torch's CPU ``_weight_int8pack_mm``, per-channel symmetric int8.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import Dtype
from kernelpick.kernels._bundle import WeightBundle
from kernelpick.kernels._torch import torch_dtype
from kernelpick.kernels._wna16 import IntWeightOnly

__all__ = ["Int4PackMM", "Int8PackMM"]

# Where torch's CPU _weight_int8pack_mm reads with aligned vector loads (bf16 on AVX-512:
# a misaligned row faults, measured on torch 2.13): a fresh tensor is 64-byte aligned.
_ALIGN_BYTES = 64


@attrs.frozen
class Int4PackMM(IntWeightOnly):
    """torch's tinygemm int4 GEMM: ``_weight_int4pack_mm_for_cpu`` on a CPU, and
    ``_weight_int4pack_mm`` on CUDA and ROCm (bf16 only there, its catalog rows say so).

    The weight is packed at prepare for this machine (the CPU packing differs by ISA,
    measured on torch 2.13), with ``scales_and_zeros [K/g, N, 2]`` in the input's dtype.
    """

    FORMATS: ClassVar[frozenset[Dtype]] = frozenset({Dtype.INT4})

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        n, k = self.config.weight_shape
        groups = -(-k // self.config.weight_block[1])
        packed: tuple[torch.dtype, tuple[int, ...]]
        if self.device.type == "cpu":
            packed = (torch.uint8, (n, k // 2))
        else:  # int4mm.cu: [ceil(N/8), K/(16 * tiles), 32, tiles/2]
            tiles = self._inner_k_tiles()
            packed = (torch.int32, (-(-n // 8), k // (16 * tiles), 32, tiles // 2))
        return packed, (self._dtype, (groups, n, 2))

    @property
    def _dtype(self) -> torch.dtype:
        return torch_dtype(self.config.input_dtype)

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        order: torch.Tensor | None,
    ) -> WeightBundle:
        unsigned = q.to(torch.int32) + 8
        # (u - 8) * s + offset == s * (q - z) with u = q + 8: offset = -s * z.
        # |offset| <= 8 * scale, so it fits wherever the scale does.
        offset = torch.zeros_like(scale) if zero is None else -scale * zero.to(torch.float32)
        pairs = torch.stack((self._scale_as(scale, self._dtype), offset.to(self._dtype)), dim=-1)
        scales_and_zeros = pairs.transpose(0, 1).contiguous()
        if self.device.type == "cpu":
            packed = torch._convert_weight_to_int4pack_for_cpu(unsigned.contiguous(), 2)
        else:
            # CUDA/ROCm take [N, K/2] bytes, the even column in the high nibble
            # (aten/src/ATen/native/cuda/int4mm.cu), and K tiles of 16 x inner_k_tiles.
            u8 = unsigned.to(torch.uint8)
            packed = torch._convert_weight_to_int4pack(
                ((u8[:, ::2] << 4) | u8[:, 1::2]).contiguous(), self._inner_k_tiles()
            )
        return WeightBundle(packed, scales_and_zeros, None, None, order)

    def _inner_k_tiles(self) -> int:
        k = self.config.k
        return next(tiles for tiles in (8, 4, 2) if k % (16 * tiles) == 0)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        group = self.config.weight_block[1]
        rows = self._columns(x, bundle).contiguous()
        if self.device.type == "cpu":
            out = torch._weight_int4pack_mm_for_cpu(rows, bundle.weight, group, bundle.scale)
        else:
            out = torch._weight_int4pack_mm(rows, bundle.weight, group, bundle.scale)
        return self._finish(out, bias)


@attrs.frozen
class Int8PackMM(IntWeightOnly):
    """torch's CPU ``_weight_int8pack_mm``: per-channel symmetric int8, scales in the
    input's dtype. Its bf16 path steps K by 16 with aligned loads and no tail (measured on
    torch 2.13: a K off that step faults or reads past the row), so its row asks K % 16
    and each call hands it a 64-byte-aligned activation."""

    FORMATS: ClassVar[frozenset[Dtype]] = frozenset({Dtype.INT8})
    READS_ZERO_POINTS: ClassVar[bool] = False
    READS_ACT_ORDER: ClassVar[bool] = False

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        return (torch.int8, self.config.weight_shape), (self._dtype, (self.config.n,))

    @property
    def _dtype(self) -> torch.dtype:
        return torch_dtype(self.config.input_dtype)

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        order: torch.Tensor | None,
    ) -> WeightBundle:
        return WeightBundle(q.contiguous(), self._scale_as(scale.reshape(-1), self._dtype))

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        rows = x.contiguous()
        if rows.data_ptr() % _ALIGN_BYTES:
            rows = rows.clone()
        out = torch._weight_int8pack_mm(rows, bundle.weight, bundle.scale)
        return self._finish(out, bias)
