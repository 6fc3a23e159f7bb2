"""Weight-only (W8A16): dequantize the FP8 weight, then a matmul in the activation's dtype.

Activations are not quantized. For a config with a per-tensor activation scale this is the
degraded W8A16 fallback used on GPUs without FP8 tensor cores: the selector marks it so.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core._specs import KernelKind
from kernelpick.kernels._base import RowMajorKernel, WeightBundle
from kernelpick.kernels._cupy_ops import GEMV_MAX_M, w8a16_gemv_cupy

__all__ = ["CupyGemvW8A16", "DequantMatmul"]


@attrs.frozen
class DequantMatmul(RowMajorKernel):
    """Dequantize ``[N, K]`` to the input dtype and run ``F.linear`` (cuBLAS / hipBLASLt)."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A16

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        # FP8 values are exact in bf16/fp16/fp32, so the cast loses nothing; the scale
        # product rounds once, in the compute dtype.
        weight = bundle.weight.to(x.dtype) * bundle.scale.to(x.dtype)
        out = torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))
        return out.to(self.out_dtype)


@attrs.frozen
class CupyGemvW8A16(DequantMatmul):
    """The cupy FP8 GEMV for small M (decode), which reads the FP8 weight once and never
    builds a 16-bit copy; past ``GEMV_MAX_M`` rows, dequantize and call cuBLAS."""

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.shape[0] > GEMV_MAX_M:
            return super()._matmul(x, bundle, bias)
        return w8a16_gemv_cupy(x.contiguous(), bundle.weight, bundle.scale, bias, self.out_dtype)
