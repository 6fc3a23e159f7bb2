"""What a bound kernel hands out and takes back: the weight bundle, and the ``Kernel``
protocol an engine programs against (``KernelBase`` in ``_base`` implements it)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

__all__ = ["Kernel", "WeightBundle"]


class WeightBundle(NamedTuple):
    """A layer's weights as its kernel reads them, prepared from the canonical tensors.

    ``weight`` is FP8 (or int8) in the kernel's layout and the device's flavour (a
    ``[K, N]`` column-major view for ``_scaled_mm``; e4m3fnuz on gfx94x); ``scale`` is fp32
    ``[N, 1]`` per channel, 0-dim per tensor, one per block, or E8M0 for MXFP8, arranged as
    the kernel's GEMM reads it (a copy where it must be: padded blocks, MX's blocked tiles,
    doubled for e4m3fnuz); ``input_scale`` is the static activation
    scale (0-dim), if any. An integer weight-only family (``kernels._wna16``) holds its own
    packing in ``weight`` and ``scale``, an asymmetric weight's ``zero_point`` where its
    op reads them apart, and, for an act-order weight, ``perm``: the column order each
    call reads ``x`` in. A NamedTuple rather than an attrs class, because it is built on the
    hot path and ``torch.compile`` traces a NamedTuple without a graph break.
    """

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None
    zero_point: torch.Tensor | None = None
    perm: torch.Tensor | None = None


class Kernel(Protocol):
    """A launchable kernel, bound to one layer's config and one device."""

    @property
    def kernel_id(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    def prepare_weights(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        *,
        zero_point: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
    ) -> WeightBundle: ...

    def quantize_weights(
        self, weight: torch.Tensor, input_scale: torch.Tensor | None = None
    ) -> WeightBundle: ...

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def run(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        zero_point: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
