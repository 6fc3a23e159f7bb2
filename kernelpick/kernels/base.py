"""What every kernel shares: the weight bundle, device traits and input checks.

A kernel is bound to one layer's QuantConfig and one device's traits, and works through
two calls: ``prepare_weights`` once after loading, ``apply`` every forward.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import attrs
import torch

from kernelpick.core.dtypes import HIGH_PRECISION, Dtype
from kernelpick.core.errors import KernelInputError
from kernelpick.core.quant import GroupShape, QuantConfig
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype
from kernelpick.kernels.cupy_ops import quantize_per_token_cupy
from kernelpick.kernels.quantize import (
    dequantize,
    quantize_per_tensor,
    quantize_per_token,
    quantize_static,
)

__all__ = ["Kernel", "KernelBase", "RowMajorKernel", "Traits", "WeightBundle", "weight_group"]

_FLOATS = tuple(torch_dtype(d) for d in sorted(HIGH_PRECISION, key=lambda d: d.value))
_F32 = (torch.float32,)


@attrs.frozen
class Traits:
    """The device-specific part of a kernel; the math is the same everywhere.

    ``fp8`` is the device's e4m3 flavour (e4m3fnuz on gfx94x). ``alignment`` is the multiple
    that K and N must be for the GEMM library (None: any shape). ``fused_bias`` lists the
    output dtypes for which ``torch._scaled_mm`` takes the bias itself; for the others the
    bias is added after the op (cuBLASLt refuses a bias with an fp32 output).
    ``fused_quant`` quantizes per-token activations with the cupy kernel (one pass per row)
    instead of torch ops; the CUDA launchers set it when the device's cupy is usable.
    """

    fp8: Dtype
    alignment: int | None = None
    fused_bias: frozenset[Dtype] = HIGH_PRECISION
    fused_quant: bool = False


class WeightBundle(NamedTuple):
    """A layer's weight as a kernel wants it.

    ``weight`` is FP8 in the kernel's layout (a ``[K, N]`` column-major view for
    ``_scaled_mm``); ``scale`` is fp32, ``[N, 1]`` per channel, 0-dim per tensor, or one per
    group ``[ceil(N/gn), ceil(K/gk)]``; ``input_scale`` is the static activation scale, if any.
    A NamedTuple rather than an attrs class, because it is built on the hot path and
    ``torch.compile`` traces a NamedTuple without a graph break.
    """

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None


class Kernel(Protocol):
    """A launchable kernel, bound to one layer's config and one device."""

    @property
    def kernel_id(self) -> str: ...

    def prepare_weights(
        self,
        fp8_weight: torch.Tensor,
        scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
    ) -> WeightBundle: ...

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...


def weight_group(config: QuantConfig) -> tuple[int, int]:
    """The weight's scale group over its stored ``[N, K]`` layout.

    Configs describe the weight as the GEMM's ``[K, N]`` operand, so the extents swap:
    per-channel ``(-1, 1)`` becomes one scale per row of ``[N, K]``, ``(1, -1)``.
    """
    group = config.weight.scale.group
    return (group.cols, group.rows)


@attrs.frozen
class KernelBase:
    """Shared checks and activation quantization; subclasses supply ``_matmul`` (and
    ``_layout`` where the weight is not read as a ``[K, N]`` column-major view)."""

    kernel_id: str
    config: QuantConfig
    traits: Traits
    device: torch.device

    @property
    def fp8(self) -> torch.dtype:
        return torch_dtype(self.traits.fp8)

    @property
    def out_dtype(self) -> torch.dtype:
        return torch_dtype(self.config.out_dtype)

    @property
    def fuse_bias(self) -> bool:
        """Whether the device's GEMM takes the bias in-op for this layer's output dtype."""
        return self.config.out_dtype in self.traits.fused_bias

    def _layout(self, fp8_weight: torch.Tensor) -> torch.Tensor:
        return fp8_weight.t()

    def _stored(self, weight: torch.Tensor) -> torch.Tensor:
        """The inverse of ``_layout``: the bundle's weight as ``[N, K]``."""
        return weight.t()

    def dequantized_weight(self, bundle: WeightBundle) -> torch.Tensor:
        """The fp32 ``[N, K]`` weight a bundle encodes: for references and debugging."""
        return dequantize(self._stored(bundle.weight), bundle.scale, weight_group(self.config))

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define _matmul")

    def prepare_weights(
        self,
        fp8_weight: torch.Tensor,
        scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
    ) -> WeightBundle:
        """Check a quantized weight ``[N, K]`` and its scales, and lay them out."""
        n, k = self.config.weight_shape
        check_tensor("fp8_weight", fp8_weight, dtypes=(self.fp8,), shape=(n, k), device=self.device)
        align = self.traits.alignment
        if align is not None and (n % align or k % align):
            expected = f"N and K multiples of {align} for {self.kernel_id}"
            raise reject("fp8_weight", fp8_weight, expected)
        return WeightBundle(
            self._layout(fp8_weight),
            self._weight_scale(scale, fp8_weight.device),
            self._input_scale(input_scale, fp8_weight.device),
        )

    def _weight_scale(self, scale: torch.Tensor, device: torch.device) -> torch.Tensor:
        n, k = self.config.weight_shape
        rows, cols = weight_group(self.config)
        check_tensor("weight scale", scale, dtypes=_F32, device=device)
        if (rows, cols) == (-1, -1):
            if scale.numel() != 1:
                raise reject("weight scale", scale, "one per-tensor value")
            return scale.reshape(())
        if (rows, cols) == (1, -1):
            if scale.dim() > 2 or scale.numel() != n or scale.shape[0] != n:
                raise reject("weight scale", scale, f"one per output channel: [{n}, 1] or [{n}]")
            return scale.reshape(n, 1).contiguous()
        grid = (-(-n // (n if rows == -1 else rows)), -(-k // (k if cols == -1 else cols)))
        return check_tensor("weight scale", scale, shape=grid)

    def _input_scale(
        self, input_scale: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor | None:
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
        check_tensor("input_scale", input_scale, dtypes=_F32, device=device)
        if input_scale.numel() != 1:
            raise reject("input_scale", input_scale, "one per-tensor value")
        return input_scale.reshape(())

    def quantize_input(
        self, x: torch.Tensor, bundle: WeightBundle
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The activation in FP8 and its fp32 scale: ``[M, 1]`` per token, 0-dim per tensor."""
        act = self.config.activation
        fp8 = self.traits.fp8
        if act is None:
            raise NotImplementedError(f"{self.kernel_id} quantizes no activations")
        if act.scale.static:
            if bundle.input_scale is None:
                expected = "a bundle from prepare_weights, holding the static input_scale"
                raise KernelInputError("bundle.input_scale", (), "None", "-", expected)
            return quantize_static(x, bundle.input_scale, fp8), bundle.input_scale
        if act.scale.group == GroupShape.PER_TOKEN:
            if self.traits.fused_quant:
                return quantize_per_token_cupy(x if x.stride(-1) == 1 else x.contiguous(), fp8)
            return quantize_per_token(x, fp8)
        return quantize_per_tensor(x, fp8)

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., K]`` -> ``[..., N]`` in the config's output dtype."""
        n, k = self.config.weight_shape
        device = bundle.weight.device
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

    def _layout(self, fp8_weight: torch.Tensor) -> torch.Tensor:
        return fp8_weight

    def _stored(self, weight: torch.Tensor) -> torch.Tensor:
        return weight
