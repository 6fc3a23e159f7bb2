"""The fp32 reference kernels: slow, any shape, and the numerics every kernel is held to.

On a CPU without bf16 matrix units, fp32 is also the fast path: a bf16 matmul there is
about 7x slower (measured on a 2-core AVX2 machine, torch 2.13).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import KernelKind
from kernelpick.kernels._base import RowMajorKernel, WeightBundle
from kernelpick.kernels._quantize import dequantize, quantize

__all__ = ["ReferenceW8A8", "ReferenceW8A16"]


def _finish(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    out = x @ weight.t()
    if bias is not None:
        out += bias.float()
    return out.to(out_dtype)


@attrs.frozen
class ReferenceW8A8(RowMajorKernel):
    """Quantize the activation as the config says (any group shape), dequantize both
    operands to fp32 and multiply."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        act = self.config.activation
        if act is not None and not act.scale.static:
            group = (act.scale.group.rows, act.scale.group.cols)
            xq, x_scale = quantize(x, group, self.activation_format, act.scale.dtype)
            values = dequantize(xq, x_scale, group)
        else:
            xq, x_scale = self.quantize_input(x, bundle)
            values = xq.float() * x_scale
        weight = dequantize(bundle.weight, bundle.scale, self.config.weight_block)
        return _finish(values, weight, bias, self.out_dtype)


@attrs.frozen
class ReferenceW8A16(RowMajorKernel):
    """Dequantize the weight to fp32 and multiply the unquantized activation."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A16

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        weight = dequantize(bundle.weight, bundle.scale, self.config.weight_block)
        return _finish(x.float(), weight, bias, self.out_dtype)
