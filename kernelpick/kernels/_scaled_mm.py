"""The ``torch._scaled_mm`` family: row-wise, tensor-wise and channel-wise unfused.

The math is shared by CPU, CUDA and ROCm; what differs comes in through the kernel's
fields: the FP8 flavour from the device, the alignment from the catalog row's
``Alignment`` rule, and whether the op takes the bias from the launch row.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import KernelKind
from kernelpick.kernels._base import KernelBase, WeightBundle

__all__ = [
    "ChannelwiseUnfused",
    "RowwiseScaledMM",
    "TensorwiseScaledMM",
    "apply_scales",
    "scaled_mm",
]


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fuse_bias: bool,
) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b) + bias`` in ``out_dtype``, on ``torch._scaled_mm``.

    ``b`` is the ``[K, N]`` column-major weight view. With ``fuse_bias`` the op adds the
    bias itself; otherwise (a library that refuses it for this output dtype) it is added in
    fp32 after the op.
    """
    fused = bias is not None and fuse_bias
    out = torch._scaled_mm(
        a,
        b,
        scale_a=scale_a,
        scale_b=scale_b,
        bias=bias.to(out_dtype) if fused and bias is not None else None,
        out_dtype=out_dtype,
    )
    if bias is not None and not fused:
        out = (out.float() + bias.float()).to(out_dtype)
    return out


def apply_scales(
    acc: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """An fp32 ``[M, N]`` of unscaled sums, in place: times the activation scale (``[M, 1]``
    or 0-dim) and the weight scale (``[N, 1]`` or 0-dim), plus the bias, in ``out_dtype``."""
    acc *= x_scale
    acc *= w_scale if w_scale.dim() == 0 else w_scale.view(1, -1)
    if bias is not None:
        acc += bias.float()
    return acc.to(out_dtype)


def _rows(scale: torch.Tensor, m: int) -> torch.Tensor:
    """An activation scale as ``_scaled_mm``'s row-wise ``[M, 1]`` (a stride-0 view is refused)."""
    return scale.expand(m, 1).contiguous() if scale.dim() == 0 else scale


def _columns(scale: torch.Tensor, n: int) -> torch.Tensor:
    """A weight scale (``[N, 1]`` or 0-dim) as ``_scaled_mm``'s row-wise ``[1, N]``."""
    return scale.expand(1, n).contiguous() if scale.dim() == 0 else scale.view(1, n)


@attrs.frozen
class RowwiseScaledMM(KernelBase):
    """Per-token or per-tensor activations x per-channel or per-tensor weights, in one op."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        scale_a = _rows(x_scale, xq.shape[0])
        scale_b = _columns(bundle.scale, self.config.n)
        return scaled_mm(xq, bundle.weight, scale_a, scale_b, bias, self.out_dtype, self.fuse_bias)


@attrs.frozen
class TensorwiseScaledMM(KernelBase):
    """Per-tensor activation and weight scales: the op's scalar-scale path."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        return scaled_mm(
            xq, bundle.weight, x_scale, bundle.scale, bias, self.out_dtype, self.fuse_bias
        )


@attrs.frozen
class ChannelwiseUnfused(KernelBase):
    """A unit-scale ``_scaled_mm`` to fp32, then both scales and the bias outside the op.

    Serves what the row-wise op cannot, such as an fp16 output on ROCm (hipBLASLt row-wise
    is bf16 only), at the cost of an fp32 ``[M, N]`` intermediate.
    """

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        one = torch.ones((), dtype=torch.float32, device=xq.device)
        acc = torch._scaled_mm(xq, bundle.weight, scale_a=one, scale_b=one, out_dtype=torch.float32)
        return apply_scales(acc, x_scale, bundle.scale, bias, self.out_dtype)
