"""Weight-only (W8A16): dequantize the FP8 weight, then a matmul in the activation's dtype.

Activations are not quantized. For a config with a per-tensor activation scale this is the
degraded W8A16 fallback (design §1, behaviour 2): the selector marks it so.
"""

from __future__ import annotations

import attrs
import torch

from kernelpick.kernels.base import KernelBase, WeightBundle

__all__ = ["DequantMatmul"]


@attrs.frozen
class DequantMatmul(KernelBase):
    """Dequantize ``[N, K]`` to the input dtype and run ``F.linear`` (cuBLAS / hipBLASLt)."""

    def _layout(self, fp8_weight: torch.Tensor) -> torch.Tensor:
        return fp8_weight  # F.linear reads [N, K] row-major as it is

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        # FP8 values are exact in bf16/fp16/fp32, so the cast loses nothing; the scale
        # product rounds once, in the compute dtype.
        weight = bundle.weight.to(x.dtype) * bundle.scale.to(x.dtype)
        out = torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))
        return out.to(self.out_dtype)
