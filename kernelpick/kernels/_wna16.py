"""Integer weight-only families (W4A16, W8A16): int4 or int8 weights, activations as they
come. Each prepares its own layout once from the canonical tensors (``_int_canonical``)
and never stores it: torch's CPU int4 packing differs by ISA, so it cannot be saved.

- ``IntDequantMatmul``: the weight dequantized, then ``F.linear`` (any group, zero points
  and act-order; fp32 where it is the reference).
- ``Int4PackMM`` and ``Int8PackMM`` (``_wna16_ops``): torch's tinygemm int4 op and its
  CPU ``_weight_int8pack_mm``.

Act-order weights are prepared with their columns in group order (``group_order``) and
each call reads ``x`` in that order, as vLLM's Marlin does with ``g_idx_sort_indices``.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import Dtype, InvalidValueError, KernelInputError, KernelKind
from kernelpick.core.rules import ActOrder, GroupSizes, QuantDtypes, WholeGroupsPerPart, ZeroPoints
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._bundle import WeightBundle
from kernelpick.kernels._canonical import check_finite
from kernelpick.kernels._int_canonical import (
    dequantize_values,
    group_order,
    int_range,
    quantize_int,
    unpack_int,
)
from kernelpick.kernels._torch import check_tensor, reject

__all__ = ["IntDequantMatmul", "IntWeightOnly"]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# Where torch's CPU _weight_int8pack_mm reads with aligned vector loads (bf16 on AVX-512:
# a misaligned row faults, measured on torch 2.13): a fresh tensor is 64-byte aligned.
_ALIGN_BYTES = 64


@attrs.frozen
class IntWeightOnly(KernelBase):
    """What the integer families share: the canonical tensors checked, unpacked and put in
    group order once, and the bundle each call is handed checked against what this family
    prepares. Subclasses define ``_pack`` (the prepared weight and scales) and ``_matmul``."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A16
    # What the family reads: its weight formats, and whether it reads zero points and an
    # act-order permutation. Checked when it is built, with the catalog row's layout
    # rules, so a route that skips bind (Launch.kernel, the constructor) cannot hand it a
    # layer it would read as another.
    FORMATS: ClassVar[frozenset[Dtype]] = frozenset({Dtype.INT4, Dtype.INT8})
    READS_ZERO_POINTS: ClassVar[bool] = True
    READS_ACT_ORDER: ClassVar[bool] = True

    def _check_weight_format(self) -> None:
        config = self.config
        weight = config.weight
        refused = [
            rule.check(None, config)  # type: ignore[arg-type]  # layout rules read no caps
            for rule in self.spec.rules
            if isinstance(rule, (QuantDtypes, GroupSizes, ZeroPoints, ActOrder, WholeGroupsPerPart))
        ]
        reasons = [reason.render() for reason in refused if reason is not None]
        if weight.dtype not in self.FORMATS:
            formats = ", ".join(sorted(d.value for d in self.FORMATS))
            reasons.append(f"{type(self).__name__} reads {formats} weights")
        if weight.zero_point is not None and not self.READS_ZERO_POINTS:
            reasons.append(f"{type(self).__name__} reads no zero points")
        if config.act_order and not self.READS_ACT_ORDER:
            reasons.append(f"{type(self).__name__} reads no act-order weight")
        if reasons:
            raise InvalidValueError(
                "config", config.render(), "a layer it can read: " + "; ".join(reasons)
            )

    def prepare_weights(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        *,
        zero_point: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
    ) -> WeightBundle:
        """The bundle from the canonical tensors (see ``kernels._int_canonical``):
        ``weight`` int32 words, ``weight_scale`` fp32 ``[N, G]``, ``zero_point`` int8
        ``[N, G]`` for an asymmetric config and ``g_idx`` ``[K]`` for an act-order one
        (each refused where the config does not call for it). Zero points outside the
        weight's range and a ``g_idx`` that is not whole groups are refused too: both
        would be read as some other weight. Traced by ``torch.compile`` (a layer's
        accepted tensors, prepared in its graph) the value checks are left out: they read
        data, and the layer checked those values when it accepted them."""
        config = self.config
        n, k = config.weight_shape
        fmt = config.weight.dtype
        words = -(-k * fmt.bits // 32)
        check_tensor("weight", weight, dtypes=(torch.int32,), shape=(n, words), device=self.device)
        if input_scale is not None:
            raise reject("input_scale", input_scale, "None: a weight-only layer has none")
        shape = config.weight_scale_shape
        check_tensor("weight_scale", weight_scale, dtypes=(torch.float32,), shape=shape)
        if not torch.compiler.is_compiling():
            check_finite("weight_scale", weight_scale)
            if bool((weight_scale <= 0).any()):
                raise reject("weight_scale", weight_scale, "positive scales")
        zero = self._zero_point(zero_point)
        order = self._order(g_idx)
        q = unpack_int(weight.contiguous(), fmt.bits, k)
        if order is not None:
            q = q[:, order]
        return self._pack(q, weight_scale.contiguous(), zero, order)

    def _zero_point(self, zero_point: torch.Tensor | None) -> torch.Tensor | None:
        wanted = self.config.weight.zero_point
        if wanted is None:
            if zero_point is not None:
                raise reject("zero_point", zero_point, "None: the config is symmetric")
            return None
        if zero_point is None:
            raise KernelInputError(
                "zero_point", (), "None", "-", "a tensor: the config is asymmetric"
            )
        shape = self.config.weight_scale_shape
        check_tensor("zero_point", zero_point, dtypes=(torch.int8,), shape=shape)
        low, high = int_range(wanted)
        outside = (zero_point < low) | (zero_point > high)
        if not torch.compiler.is_compiling() and bool(outside.any()):
            raise reject("zero_point", zero_point, f"values in {low}..{high} ({wanted})")
        return zero_point.contiguous()

    def _order(self, g_idx: torch.Tensor | None) -> torch.Tensor | None:
        if not self.config.act_order:
            if g_idx is not None:
                raise reject("g_idx", g_idx, "None: the config is not act-order")
            return None
        if g_idx is None:
            raise KernelInputError("g_idx", (), "None", "-", "a tensor: the config is act-order")
        checked = not torch.compiler.is_compiling()
        return group_order(g_idx.to(self.device), self.config, check=checked)

    def quantize_weights(
        self, weight: torch.Tensor, input_scale: torch.Tensor | None = None
    ) -> WeightBundle:
        """A float ``weight [N, K]`` quantized round-to-nearest to the canonical tensors
        (in group order: the quantizer writes no act-order), then prepared."""
        check_tensor("weight", weight, dtypes=_FLOATS, shape=self.config.weight_shape)
        if self.config.act_order:
            raise reject(
                "weight", weight, "a checkpoint's g_idx: round-to-nearest has no act-order"
            )
        with torch.no_grad():
            detached = weight.detach().to(self.device)
            check_finite("weight", detached)
            packed, scale, zero = quantize_int(detached, self.config)
        return self.prepare_weights(packed, scale, input_scale, zero_point=zero)

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., K]`` -> ``[..., N]`` in the config's output dtype."""
        self._check_bundle(bundle)
        return self._apply(x, bundle, bias)

    def _check_bundle(self, bundle: WeightBundle) -> None:
        # A bundle of another family, or one a model-wide cast reached, must not run.
        weight, scale = self._form()
        for name, tensor, (dtype, shape) in (
            ("bundle.weight", bundle.weight, weight),
            ("bundle.scale", bundle.scale, scale),
        ):
            if tensor.dtype != dtype or (shape is not None and tuple(tensor.shape) != shape):
                raise reject(name, tensor, f"{dtype} {shape}, as {self.kernel_id} prepares it")
        if (
            self.READS_ZERO_POINTS
            and self._keeps_zero_points
            and ((bundle.zero_point is None) != (self.config.weight.zero_point is None))
        ):
            expected = (
                "a bundle this kernel prepared (zero points exactly where the config has them)"
            )
            raise KernelInputError(
                "bundle.zero_point", (), str(bundle.zero_point is not None), "-", expected
            )
        if (bundle.perm is None) == self.config.act_order:
            expected = "a bundle this kernel prepared (its perm, act-order's column order)"
            raise KernelInputError("bundle.perm", (), str(bundle.perm is not None), "-", expected)

    # Whether the bundle holds the zero points apart (else they are folded into its scales).
    _keeps_zero_points: ClassVar[bool] = False

    def _columns(self, x: torch.Tensor, bundle: WeightBundle) -> torch.Tensor:
        return x if bundle.perm is None else x.index_select(-1, bundle.perm)

    def _finish(self, out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.to(self.out_dtype)

    def _scale_as(self, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # A torch op reading scales in x's dtype: an fp32 scale under fp16's smallest
        # normal, or past its largest, would flush, lose digits or overflow and scale a
        # whole group wrong, silently.
        cast = scale.to(dtype)
        info = torch.finfo(dtype)
        if bool(((scale < info.tiny) | (scale > info.max / 8)).any()):
            expected = (
                f"scales {dtype} holds with their offsets ({info.tiny:.2g} to {info.max / 8:.3g})"
            )
            raise reject("weight_scale", scale, expected)
        return cast

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        raise NotImplementedError(f"{type(self).__name__} must define _form")

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        order: torch.Tensor | None,
    ) -> WeightBundle:
        raise NotImplementedError(f"{type(self).__name__} must define _pack")


@attrs.frozen
class IntDequantMatmul(IntWeightOnly):
    """Dequantize to the activation's dtype (fp32 for fp16, whose range a product of a
    scale and a zero point may leave) and run ``F.linear``: any group, zero points and
    act-order. The prepared weight is int8 ``[N, K]`` in group order."""

    _keeps_zero_points: ClassVar[bool] = True

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        return (torch.int8, self.config.weight_shape), (torch.float32, self._scale_shape())

    def _scale_shape(self) -> tuple[int, ...]:
        # [N, G, depth]: the group depth is in the bundle's shape (a stride-0 view, no
        # copy), so a bundle of another grouping with as many groups is refused.
        n, groups = self.config.weight_scale_shape
        return (n, groups, self.config.weight_block[1])

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        order: torch.Tensor | None,
    ) -> WeightBundle:
        expanded = scale.unsqueeze(-1).expand(self._scale_shape())
        return WeightBundle(q.contiguous(), expanded, None, zero, order)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        work = torch.float32 if x.dtype == torch.float16 else x.dtype
        scale = bundle.scale[:, :, 0]
        values = dequantize_values(bundle.weight, scale, bundle.zero_point, self.config)
        weight = values.to(work)
        out = torch.nn.functional.linear(self._columns(x, bundle).to(work), weight)
        return self._finish(out, bias)
