"""What every kernel shares: the weight bundle, the form it must have, and the input checks.

A kernel is bound to one catalog row, one layer's QuantConfig and one device, and works
through two calls: ``prepare_weights`` derives its bundle from the layer's canonical tensors
once (``quantize_weights`` from a high-precision weight), and ``apply`` runs each forward
on it.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import (
    HIGH_PRECISION,
    Dtype,
    GroupShape,
    InvalidValueError,
    KernelInputError,
    KernelKind,
    KernelSpec,
    QuantConfig,
    kind_reason,
)
from kernelpick.kernels._bundle import Kernel, WeightBundle
from kernelpick.kernels._canonical import (
    canonical_dtype,
    canonical_scale_dtype,
    check_finite,
    check_positive_finite,
    quantize_canonical,
)
from kernelpick.kernels._cupy_group_quant import GROUP, quantize_groups_cupy
from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
from kernelpick.kernels._fnuz import as_fnuz
from kernelpick.kernels._quantize import (
    quantize,
    quantize_per_tensor,
    quantize_per_token,
    quantize_static,
)
from kernelpick.kernels._scale_checks import checked_input_scale, checked_weight_scale
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = ["Kernel", "KernelBase", "RowMajorKernel", "WeightBundle"]

_FLOATS = tuple(torch_dtype(d) for d in sorted(HIGH_PRECISION, key=lambda d: d.value))


@attrs.frozen
class KernelBase:
    """Shared checks, bundle form and activation quantization; subclasses supply ``_matmul`` (and
    ``_arrange`` where the weight is not read as a ``[K, N]`` column-major view).

    The math is the same on every device; what differs comes in as fields. ``spec`` is the
    catalog row (its id, and the alignment its requirements state). ``fp8_format`` is the
    device's e4m3 flavour (e4m3fnuz on gfx94x). ``fused_bias`` lists the output dtypes for
    which ``torch._scaled_mm`` takes the bias itself; for the others the bias is added after
    the op. ``fused_quant`` quantizes per-token and 1x128 group activations with the cupy
    kernels (one pass) instead of torch ops. ``isa`` is the CPU's probed ISA flags (empty
    on a GPU), for families compiled per instruction set.
    """

    # Whether the family quantizes activations (W8A8) or only weights (W8A16). A family
    # declares it, and is bound only to catalog rows of the same kind: a weight-only family
    # under a W8A8 row would silently skip the activation quantization the rules vouched
    # for (vLLM issue 61316).
    KIND: ClassVar[KernelKind]

    spec: KernelSpec
    config: QuantConfig
    device: torch.device
    fp8_format: Dtype
    fused_bias: frozenset[Dtype] = HIGH_PRECISION
    fused_quant: bool = False
    isa: frozenset[str] = attrs.field(default=frozenset(), kw_only=True)
    # What this family's prepare_weights makes: bundle.weight's shape and strides (None:
    # any stride, for an extent of 1) and bundle.scale's shape (0-dim per tensor), derived
    # once: apply compares every bundle it is handed with them.
    _bundle_form: tuple[tuple[int, ...], tuple[int | None, ...], tuple[int, ...]] = attrs.field(
        init=False, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        kind = getattr(type(self), "KIND", None)
        if kind is not self.spec.kind:
            name = type(self).__name__
            raise InvalidValueError(
                "kernel family",
                f"{name} (KIND {kind})",
                f"a {self.spec.kind} family, as {self.spec.id}'s catalog row declares",
            )
        # The kind rule once more, for a family built without bind (Launch.kernel, the
        # constructor): a weight-only family must not run a per-token config whatever the
        # route (vLLM issue 61316).
        refused = kind_reason(self.spec.kind, self.config, self.spec.fallback)
        if refused is not None:
            expected = f"a config a {self.spec.kind} kernel may serve: {refused.render()}"
            raise InvalidValueError("config", self.config.render(), expected)
        self._check_weight_format()
        n, k = self.config.weight_shape
        view = self._arrange(torch.empty((n, k), dtype=self.weight_dtype, device="meta"))
        strides = tuple(
            s if e != 1 else None for e, s in zip(view.shape, view.stride(), strict=True)
        )
        scale = self.config.weight_scale_shape
        form = (tuple(view.shape), strides, () if scale == (1,) else scale)
        object.__setattr__(self, "_bundle_form", form)

    def _check_weight_format(self) -> None:
        # What this family's bundle means: FP8 or int8 values, symmetric and in order. An
        # int4, asymmetric or act-order weight read by it would be some other weight.
        weight = self.config.weight
        if weight.dtype is Dtype.INT4 or weight.zero_point is not None or self.config.act_order:
            expected = (
                f"an FP8 or int8 weight, symmetric and in order, for {type(self).__name__}; "
                "integer weight-only layers run on kernelpick.kernels' IntWeightOnly families"
            )
            raise InvalidValueError("config", self.config.render(), expected)

    @property
    def kernel_id(self) -> str:
        return self.spec.id

    @property
    def fp8(self) -> torch.dtype:
        return torch_dtype(self.fp8_format)

    @property
    def weight_dtype(self) -> torch.dtype:
        """The bundle weight's dtype: int8 for an int8 config, else the device's FP8."""
        return torch.int8 if self.config.weight.dtype is Dtype.INT8 else self.fp8

    @property
    def activation_format(self) -> Dtype:
        """What activations are quantized to: int8, or the device's FP8 flavour."""
        act = self.config.activation
        return Dtype.INT8 if act is not None and act.dtype is Dtype.INT8 else self.fp8_format

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
        *,
        zero_point: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
    ) -> WeightBundle:
        """Check a layer's canonical tensors (see ``kernels._canonical``) and derive the
        kernel's bundle from them: what the kernel runs on. The integration prepares once
        per load, device and dtype and keeps the bundle beside the canonical tensors
        (``LayerState.prepared``, see ``kernelpick.integration.layer.bundle_for``), so a
        family may copy, pad, re-tile or pack here; this base derives views, with no copy
        of the weight.

        Checked: dtypes, shapes, contiguity, alignment and device. Not checked, because it
        would cost a scan of the weight (or a device sync) on every call: the values. The
        caller guarantees them, as ``quantize_weights`` and kernelpick's loaders do:

        - ``weight`` holds canonical bytes: no -0 (0x80) and no NaN byte (0x7F, 0xFF). On
          an e4m3fnuz device (gfx94x) the bytes are reread as e4m3fnuz, where 0x80 is NaN;
          ``kernelpick.kernels.canonicalize_fp8_`` makes a weight of one's own canonical.
        - ``weight_scale`` and a static ``input_scale`` are positive and finite.

        ``zero_point`` and ``g_idx`` are the integer weight-only families' (an FP8 or int8
        W8A8 weight is symmetric and in order): refused here.
        """
        for name, extra in (("zero_point", zero_point), ("g_idx", g_idx)):
            if extra is not None:
                raise reject(name, extra, f"None: {self.config.weight.render()} has none")
        n, k = self.config.weight_shape
        stored = (torch_dtype(canonical_dtype(self.config)),)
        check_tensor("weight", weight, dtypes=stored, shape=(n, k), device=self.device)
        if not weight.is_contiguous():
            raise reject("weight", weight, "a contiguous row-major [N, K] tensor")
        align = self.spec.alignment
        if align is not None and (n % align or k % align):
            raise reject("weight", weight, f"N and K multiples of {align} for {self.kernel_id}")
        scale = checked_weight_scale(self.config, weight_scale, self.device)
        static = checked_input_scale(self.config, input_scale, self.device)
        if self.fp8_format is Dtype.FLOAT8_E4M3FNUZ and weight.dtype is torch.float8_e4m3fn:
            weight, scale, static = as_fnuz(weight, scale, static)
        return WeightBundle(self._arrange(weight), scale, static)

    def quantize_weights(
        self, weight: torch.Tensor, input_scale: torch.Tensor | None = None
    ) -> WeightBundle:
        """A high-precision ``weight [N, K]`` quantized to the canonical layout for this
        layer's config, then prepared as ``prepare_weights`` does. The bundle holds the only
        reference to the FP8 weight: keep the bundle, not ``weight``.

        Refuses NaN or Inf in ``weight`` and a static ``input_scale`` that is not positive
        and finite (both would give NaN or zero outputs). The bundle carries no autograd
        history, even from an ``nn.Linear``'s weight, which requires grad.
        """
        shape = self.config.weight_shape
        check_tensor("weight", weight, dtypes=_FLOATS, shape=shape, device=self.device)
        static = checked_input_scale(self.config, input_scale, self.device)
        if static is not None:
            check_positive_finite("input_scale", static)
        with torch.no_grad():
            detached = weight.detach()
            check_finite("weight", detached)
            fp8, scale = quantize_canonical(detached, self.config)
        return self.prepare_weights(fp8, scale, input_scale)

    def quantize_input(
        self, x: torch.Tensor, bundle: WeightBundle
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The activation quantized (FP8 or int8) and its fp32 scale: ``[M, 1]`` per token,
        0-dim per tensor, ``[M, ceil(K/g)]`` per ``(1, g)`` group (powers of two if E8M0)."""
        act = self.config.activation
        fp8 = self.activation_format
        if act is None:
            raise NotImplementedError(f"{self.kernel_id} quantizes no activations")
        if act.scale.static:
            if bundle.input_scale is None:
                expected = "a bundle from prepare_weights, holding the static input_scale"
                raise KernelInputError("bundle.input_scale", (), "None", "-", expected)
            return quantize_static(x, bundle.input_scale, fp8), bundle.input_scale
        group = act.scale.group
        if group == GroupShape.PER_TOKEN and act.scale.dtype is Dtype.FLOAT32:
            if self.fused_quant and fp8.is_fp8:
                return quantize_per_token_cupy(x if x.stride(-1) == 1 else x.contiguous(), fp8)
            return quantize_per_token(x, fp8)
        if group == GroupShape.PER_TENSOR and act.scale.dtype is Dtype.FLOAT32:
            return quantize_per_tensor(x, fp8)
        fused_groups = group == GroupShape.per_group(GROUP) and act.scale.dtype is Dtype.FLOAT32
        if fused_groups and self.fused_quant and fp8.is_fp8:
            # Scales come back outer-dim-major (strides (1, M)), as cuBLASLt reads them.
            return quantize_groups_cupy(x if x.stride(-1) == 1 else x.contiguous(), fp8)
        return quantize(x, (group.rows, group.cols), fp8, act.scale.dtype)

    def apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., K]`` -> ``[..., N]`` in the config's output dtype."""
        # A bundle whose tensors were cast (say by a model-wide .half()) must not run.
        check_tensor("bundle.weight", bundle.weight, dtypes=(self.weight_dtype,))
        check_tensor("bundle.scale", bundle.scale, dtypes=(canonical_scale_dtype(self.config),))
        self._check_bundle_form(bundle)
        return self._apply(x, bundle, bias)

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
    ) -> torch.Tensor:
        """``apply`` on the bundle ``prepare_weights`` derives from the canonical tensors,
        in one call: the bundle is made here, so its form needs no second check."""
        bundle = self.prepare_weights(
            weight, weight_scale, input_scale, zero_point=zero_point, g_idx=g_idx
        )
        return self._apply(x, bundle, bias)

    def _apply(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
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

    def _check_bundle_form(self, bundle: WeightBundle) -> None:
        # Metadata only. A bundle another family prepared holds the same bytes in another
        # view ([N, K] against the [K, N] transpose): on a square layer every dtype and
        # extent matches, and the product would be x @ W instead of x @ W^T.
        shape, strides, scale_shape = self._bundle_form
        weight = bundle.weight
        got = weight.stride()
        if tuple(weight.shape) != shape or (
            got != strides
            and any(w is not None and g != w for g, w in zip(got, strides, strict=True))
        ):
            wanted = ", ".join("*" if w is None else str(w) for w in strides)
            expected = (
                f"shape {list(shape)} with strides ({wanted}), as {self.kernel_id}'s "
                f"prepare_weights makes it (strides {list(got)} given): pass a bundle this "
                "kernel prepared"
            )
            raise reject("bundle.weight", weight, expected)
        if tuple(bundle.scale.shape) != scale_shape:
            expected = f"shape {list(scale_shape)}, as {self.kernel_id}'s prepare_weights makes it"
            raise reject("bundle.scale", bundle.scale, expected)


@attrs.frozen
class RowMajorKernel(KernelBase):
    """A kernel that reads the weight ``[N, K]`` as it is stored (dequantizing families)."""

    def _arrange(self, weight: torch.Tensor) -> torch.Tensor:
        return weight
