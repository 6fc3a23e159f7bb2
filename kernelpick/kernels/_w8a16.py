"""Weight-only (W8A16): dequantize the FP8 weight, then a matmul in the activation's dtype.

Activations are not quantized. For a config with a per-tensor activation scale this is the
degraded W8A16 fallback used on GPUs without FP8 tensor cores: the selector marks it so.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import GroupShape, KernelKind
from kernelpick.kernels._base import RowMajorKernel, WeightBundle
from kernelpick.kernels._cupy_gemv import GEMV_MAX_M, w8a16_gemv_cupy
from kernelpick.kernels._quantize import expand_scales

__all__ = ["CupyGemvW8A16", "DequantMatmul"]

# Scales that broadcast over the stored [N, K] weight as they are: 0-dim, or [N, 1].
_BROADCAST = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_CHANNEL})


@attrs.frozen
class DequantMatmul(RowMajorKernel):
    """Dequantize ``[N, K]`` to the input dtype and run ``F.linear`` (cuBLAS / hipBLASLt).

    Any grouping of the weight's scales: per tensor and per channel broadcast as they are;
    blocks (``128 x 128``) and MX groups (``1 x 32`` of the stored weight, E8M0 scales) are
    expanded to the weight's shape first.
    """

    KIND: ClassVar[KernelKind] = KernelKind.W8A16

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        weight = self._dequantized(bundle, x.dtype)
        out = torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))
        return out.to(self.out_dtype)

    def _dequantized(self, bundle: WeightBundle, dtype: torch.dtype) -> torch.Tensor:
        # fp16 tops out at 65504 and bottoms out at 2^-24: a scale (an E8M0 one spans
        # 2^-127..2^127; a checkpoint's per-channel one may be 1e-6) need not fit, so fp16
        # layers scale in fp32 and round once. bf16 has fp32's exponent range.
        work = torch.float32 if dtype == torch.float16 else dtype
        scale = bundle.scale.to(work)
        if self.config.weight.scale.group not in _BROADCAST:
            # Blocks and MX groups: one scale per weight element; a per-tensor (0-dim) or
            # per-channel ([N, 1]) scale broadcasts as it is, whatever its dtype.
            shape = (bundle.weight.shape[0], bundle.weight.shape[1])
            scale = expand_scales(scale, self.config.weight_block, shape)
        # FP8 values are exact in bf16/fp16/fp32, so the cast loses nothing.
        return (bundle.weight.to(work) * scale).to(dtype)


@attrs.frozen
class CupyGemvW8A16(DequantMatmul):
    """The cupy FP8 GEMV for small M (decode), which reads the FP8 weight once and never
    builds a 16-bit copy; past ``GEMV_MAX_M`` rows, dequantize and call cuBLAS. Per-tensor
    and per-channel scales only (its catalog row says so)."""

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.shape[0] > GEMV_MAX_M:
            return super()._matmul(x, bundle, bias)
        return w8a16_gemv_cupy(x.contiguous(), bundle.weight, bundle.scale, bias, self.out_dtype)
