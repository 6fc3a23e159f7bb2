"""What every kernel shares: the weight bundle, device traits and input checks.

A kernel is bound to one catalog row, one layer's QuantConfig and one device, and works
through two calls: ``prepare_weights`` derives its bundle from the layer's canonical tensors
(``quantize_weights`` from a high-precision weight), and ``apply`` runs a forward with it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import attrs
import torch

from kernelpick.core._dtypes import HIGH_PRECISION, Dtype
from kernelpick.core._errors import KernelInputError
from kernelpick.core._quant import GroupShape, QuantConfig
from kernelpick.core._specs import KernelSpec
from kernelpick.kernels._canonical import CANONICAL_FP8, quantize_weight
from kernelpick.kernels._cupy_ops import quantize_per_token_cupy
from kernelpick.kernels._fnuz import as_fnuz
from kernelpick.kernels._quantize import (
    quantize_per_tensor,
    quantize_per_token,
    quantize_static,
)
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = ["Kernel", "KernelBase", "RowMajorKernel", "WeightBundle"]

_FLOATS = tuple(torch_dtype(d) for d in sorted(HIGH_PRECISION, key=lambda d: d.value))
_F32 = (torch.float32,)
_CANONICAL = (torch_dtype(CANONICAL_FP8),)


class WeightBundle(NamedTuple):
    """A layer's weights as its kernel reads them, derived from the canonical tensors.

    ``weight`` is FP8 in the kernel's layout and the device's flavour (a ``[K, N]``
    column-major view for ``_scaled_mm``; e4m3fnuz on gfx94x); ``scale`` is fp32, ``[N, 1]``
    per channel, 0-dim per tensor, or one per block; ``input_scale`` is the static activation
    scale (0-dim), if any. A NamedTuple rather than an attrs class, because it is built on the
    hot path and ``torch.compile`` traces a NamedTuple without a graph break.
    """

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None


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
    ) -> WeightBundle: ...

    def quantize_weights(
        self, weight: torch.Tensor, input_scale: torch.Tensor | None = None
    ) -> WeightBundle: ...

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...


def _one_value(name: str, scale: torch.Tensor) -> torch.Tensor:
    if scale.numel() != 1:
        raise reject(name, scale, "one per-tensor value")
    return scale.reshape(())


@attrs.frozen
class KernelBase:
    """Shared checks, layout and activation quantization; subclasses supply ``_matmul`` (and
    ``_arrange`` where the weight is not read as a ``[K, N]`` column-major view).

    The math is the same on every device; what differs comes in as fields. ``spec`` is the
    catalog row (its id, and the alignment its requirements state). ``fp8_format`` is the
    device's e4m3 flavour (e4m3fnuz on gfx94x). ``fused_bias`` lists the output dtypes for
    which ``torch._scaled_mm`` takes the bias itself; for the others the bias is added after
    the op. ``fused_quant`` quantizes per-token activations with the cupy kernel (one pass
    per row) instead of torch ops.
    """

    spec: KernelSpec
    config: QuantConfig
    device: torch.device
    fp8_format: Dtype
    fused_bias: frozenset[Dtype] = HIGH_PRECISION
    fused_quant: bool = False

    @property
    def kernel_id(self) -> str:
        return self.spec.id

    @property
    def fp8(self) -> torch.dtype:
        return torch_dtype(self.fp8_format)

    @property
    def out_dtype(self) -> torch.dtype:
        return torch_dtype(self.config.out_dtype)

    @property
    def fuse_bias(self) -> bool:
        """Whether the device's GEMM takes the bias in-op for this layer's output dtype."""
        return self.config.out_dtype in self.fused_bias

    def _arrange(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.t()

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define _matmul")

    def prepare_weights(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
    ) -> WeightBundle:
        """Check a layer's canonical tensors (see ``kernels.canonical``) and derive the
        kernel's bundle from them: views, with no copy of the weight, so it is cheap enough
        to derive on every call and can never go stale."""
        n, k = self.config.weight_shape
        check_tensor("weight", weight, dtypes=_CANONICAL, shape=(n, k), device=self.device)
        if not weight.is_contiguous():
            raise reject("weight", weight, "a contiguous row-major [N, K] tensor")
        align = self.spec.alignment
        if align is not None and (n % align or k % align):
            raise reject("weight", weight, f"N and K multiples of {align} for {self.kernel_id}")
        scale = self._weight_scale(weight_scale)
        static = self._input_scale(input_scale)
        if self.fp8_format is Dtype.FLOAT8_E4M3FNUZ:
            weight, scale, static = as_fnuz(weight, scale, static)
        return WeightBundle(self._arrange(weight), scale, static)

    def quantize_weights(
        self, weight: torch.Tensor, input_scale: torch.Tensor | None = None
    ) -> WeightBundle:
        """A high-precision ``weight [N, K]`` quantized to the canonical layout for this
        layer's config, then prepared as ``prepare_weights`` does. The bundle holds the only
        reference to the FP8 weight: keep the bundle, not ``weight``."""
        shape = self.config.weight_shape
        check_tensor("weight", weight, dtypes=_FLOATS, shape=shape, device=self.device)
        fp8, scale = quantize_weight(weight, self.config)
        return self.prepare_weights(fp8, scale, input_scale)

    def _weight_scale(self, scale: torch.Tensor) -> torch.Tensor:
        shape = self.config.weight_scale_shape
        check_tensor("weight_scale", scale, dtypes=_F32, device=self.device)
        if shape == (1,):
            return _one_value("weight_scale", scale)
        if tuple(scale.shape) != shape:
            raise reject("weight_scale", scale, f"shape {list(shape)}")
        return scale

    def _input_scale(self, input_scale: torch.Tensor | None) -> torch.Tensor | None:
        act = self.config.activation
        static = act is not None and act.scale.static
        if input_scale is None:
            if static:
                expected = "a per-tensor fp32 scale: this config's activation scale is static"
                raise KernelInputError("input_scale", (), "None", "-", expected)
            return None
        if not static:
            expected = "None: this config computes activation scales per call"
            raise reject("input_scale", input_scale, expected)
        check_tensor("input_scale", input_scale, dtypes=_F32, device=self.device)
        return _one_value("input_scale", input_scale)

    def quantize_input(
        self, x: torch.Tensor, bundle: WeightBundle
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The activation in FP8 and its fp32 scale: ``[M, 1]`` per token, 0-dim per tensor."""
        act = self.config.activation
        fp8 = self.fp8_format
        if act is None:
            raise NotImplementedError(f"{self.kernel_id} quantizes no activations")
        if act.scale.static:
            if bundle.input_scale is None:
                expected = "a bundle from prepare_weights, holding the static input_scale"
                raise KernelInputError("bundle.input_scale", (), "None", "-", expected)
            return quantize_static(x, bundle.input_scale, fp8), bundle.input_scale
        if act.scale.group == GroupShape.PER_TOKEN:
            if self.fused_quant:
                return quantize_per_token_cupy(x if x.stride(-1) == 1 else x.contiguous(), fp8)
            return quantize_per_token(x, fp8)
        return quantize_per_tensor(x, fp8)

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., K]`` -> ``[..., N]`` in the config's output dtype."""
        n, k = self.config.weight_shape
        device = bundle.weight.device
        # A bundle whose tensors were cast (say by a model-wide .half()) must not run.
        check_tensor("bundle.weight", bundle.weight, dtypes=(self.fp8,))
        check_tensor("bundle.scale", bundle.scale, dtypes=_F32)
        check_tensor("x", x, dtypes=(torch_dtype(self.config.input_dtype),), device=device)
        if x.dim() == 0 or x.shape[-1] != k:
            raise reject("x", x, f"last dimension K={k}")
        if bias is not None:
            check_tensor("bias", bias, dtypes=_FLOATS, shape=(n,), device=device)
        lead = x.shape[:-1]
        rows = x.reshape(-1, k)
        if rows.shape[0] == 0:  # an empty batch: GEMM libraries refuse M=0
            return torch.empty((*lead, n), dtype=self.out_dtype, device=device)
        return self._matmul(rows, bundle, bias).view(*lead, n)


@attrs.frozen
class RowMajorKernel(KernelBase):
    """A kernel that reads the weight ``[N, K]`` as it is stored (dequantizing families)."""

    def _arrange(self, weight: torch.Tensor) -> torch.Tensor:
        return weight
