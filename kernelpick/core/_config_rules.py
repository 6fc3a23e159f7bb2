"""The rules that read the layer's config: formats, scale granularities and dtypes, shape,
tokens per call and dtypes. The two kind rules the core adds are in ``_kinds``."""

from __future__ import annotations

import attrs

from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import positive_int
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._rule_fields import (
    fp8_dtypes,
    group_shapes,
    high_precision_dtypes,
    listed,
    positive_multiple,
    quantized_dtypes,
    scale_dtypes,
)

__all__ = [
    "FP32_SCALES",
    "ActivationScales",
    "Alignment",
    "DynamicActivationScales",
    "Fp8Dtypes",
    "InputDtypes",
    "MinTokens",
    "NotBothPerTensor",
    "OutDtypes",
    "QuantDtypes",
    "ScaleDtypes",
    "WeightScales",
]

# What a kernel reads unless it says otherwise: scales rounded to nothing coarser than fp32.
FP32_SCALES = frozenset({Dtype.FLOAT32})


# One named converter per field: attrs' mypy plugin reads named functions only.
def _activation_groups(value: object) -> frozenset[GroupShape]:
    return group_shapes(value, "ActivationScales groups")


def _weight_groups(value: object) -> frozenset[GroupShape]:
    return group_shapes(value, "WeightScales groups")


def _out_dtypes(value: object) -> frozenset[Dtype]:
    return high_precision_dtypes(value, "OutDtypes dtypes")


def _input_dtypes(value: object) -> frozenset[Dtype]:
    return high_precision_dtypes(value, "InputDtypes dtypes")


def _scale_dtypes(value: object) -> frozenset[Dtype]:
    return scale_dtypes(value, "scale dtypes")


def _quantized_dtypes(value: object) -> frozenset[Dtype]:
    return quantized_dtypes(value, "QuantDtypes dtypes")


def _scale_dtype_reason(wanted: frozenset[Dtype], key: QuantKey, operand: str) -> Reason | None:
    if key.scale.dtype in wanted:
        return None
    return Reason(RejectCode.SCALE_DTYPE, listed(wanted), f"{key.scale.dtype} ({operand})")


@attrs.frozen
class Fp8Dtypes:
    """The config's FP8 operands use one of these formats (names such as
    ``"float8_e4m3fn"`` are parsed)."""

    dtypes: frozenset[Dtype] = attrs.field(converter=fp8_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if config.weight.dtype in self.dtypes and (act is None or act.dtype in self.dtypes):
            return None
        found = {config.weight.dtype} | ({act.dtype} if act else set())
        return Reason(RejectCode.FP8_DTYPE, listed(self.dtypes), listed(found - self.dtypes))

    def render(self) -> str:
        return f"FP8 {listed(self.dtypes)}"


@attrs.frozen
class ActivationScales:
    """A W8A8 kernel reads activation scales of these granularities, kept in one of
    ``dtypes`` (fp32 unless the kernel says otherwise, so no kernel misreads E8M0)."""

    groups: frozenset[GroupShape] = attrs.field(converter=_activation_groups)
    dtypes: frozenset[Dtype] = attrs.field(default=FP32_SCALES, converter=_scale_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        # A weight-only config is judged by the kind rule, not here.
        if act is None:
            return None
        if act.scale.group not in self.groups:
            found = act.scale.group.render()
            return Reason(RejectCode.ACTIVATION_SCALES, listed(self.groups), found)
        return _scale_dtype_reason(self.dtypes, act, "activation")

    def render(self) -> str:
        return f"activation {listed(self.groups)}{_unless_fp32(self.dtypes)}"


def _unless_fp32(dtypes: frozenset[Dtype]) -> str:
    return "" if dtypes == FP32_SCALES else f" ({listed(dtypes)} scales)"


def _static_groups(value: object) -> frozenset[GroupShape]:
    # Empty is the rule's usual form (no static scale at all), not a set that matches nothing.
    if isinstance(value, (frozenset, set, list, tuple)) and not value:
        return frozenset()
    return group_shapes(value, "DynamicActivationScales static_groups")


@attrs.frozen
class DynamicActivationScales:
    """A W8A8 kernel that computes activation scales itself, on every call: it has no way to
    take a static (calibrated) scale, except for the groups in ``static_groups`` (a kernel
    that also takes one stored per-tensor scale names ``per_tensor`` there)."""

    static_groups: frozenset[GroupShape] = attrs.field(
        default=frozenset(), converter=_static_groups
    )

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        # A weight-only config is judged by the kind rule, not here.
        if act is None or not act.scale.static or act.scale.group in self.static_groups:
            return None
        needed = "dynamic"
        if self.static_groups:
            needed = f"dynamic, or static {listed(self.static_groups)}"
        return Reason(RejectCode.ACTIVATION_SCALES, needed, act.scale.render())

    def render(self) -> str:
        if self.static_groups:
            return f"activation scales dynamic (static: {listed(self.static_groups)})"
        return "activation scales dynamic"


@attrs.frozen
class WeightScales:
    """The kernel reads weight scales of these granularities, kept in one of ``dtypes``
    (fp32 unless the kernel says otherwise)."""

    groups: frozenset[GroupShape] = attrs.field(converter=_weight_groups)
    dtypes: frozenset[Dtype] = attrs.field(default=FP32_SCALES, converter=_scale_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        group = config.weight.scale.group
        if group not in self.groups:
            return Reason(RejectCode.WEIGHT_SCALES, listed(self.groups), group.render())
        return _scale_dtype_reason(self.dtypes, config.weight, "weight")

    def render(self) -> str:
        return f"weight {listed(self.groups)}{_unless_fp32(self.dtypes)}"


@attrs.frozen
class ScaleDtypes:
    """Both operands' scales are kept in one of these dtypes: for a kernel that reads any
    granularity (a dequantizing reference) but not every scale format."""

    dtypes: frozenset[Dtype] = attrs.field(converter=_scale_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        found = _scale_dtype_reason(self.dtypes, config.weight, "weight")
        if found is None and config.activation is not None:
            found = _scale_dtype_reason(self.dtypes, config.activation, "activation")
        return found

    def render(self) -> str:
        return f"scales {listed(self.dtypes)}"


@attrs.frozen
class QuantDtypes:
    """The config's quantized operands use one of these formats, FP8 or int8 (names such
    as ``"int8"`` are parsed). ``Fp8Dtypes`` is the FP8-only form."""

    dtypes: frozenset[Dtype] = attrs.field(converter=_quantized_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if config.weight.dtype in self.dtypes and (act is None or act.dtype in self.dtypes):
            return None
        found = {config.weight.dtype} | ({act.dtype} if act else set())
        return Reason(RejectCode.QUANT_DTYPE, listed(self.dtypes), listed(found - self.dtypes))

    def render(self) -> str:
        return f"quantized {listed(self.dtypes)}"


def _positive_tokens(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    positive_int("MinTokens minimum", value, "a positive integer, e.g. 17")


@attrs.frozen
class MinTokens:
    """Every call passes at least ``minimum`` rows (tokens): for a GEMM with a floor on M,
    read from the config's ``min_tokens`` (1, its default, includes decode)."""

    minimum: int = attrs.field(validator=_positive_tokens)
    why: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.min_tokens >= self.minimum:
            return None
        why = f" ({self.why})" if self.why else ""
        decode = " (decode)" if config.min_tokens == 1 else ""
        needed = f"M >= {self.minimum} rows per call{why}"
        return Reason(RejectCode.TOKEN_COUNT, needed, f"M >= {config.min_tokens}{decode}")

    def render(self) -> str:
        return f"M >= {self.minimum}"


@attrs.frozen
class NotBothPerTensor:
    """At least one operand is scaled finer than per-tensor (else the tensor-wise kernel serves)."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if act is None or act.scale.group != GroupShape.PER_TENSOR:
            return None
        if config.weight.scale.group != GroupShape.PER_TENSOR:
            return None
        return Reason(
            RejectCode.SCALE_COMBINATION,
            "per-token activation or per-channel weight scales",
            "both per-tensor",
        )

    def render(self) -> str:
        return "not both per-tensor"


@attrs.frozen
class Alignment:
    """K and N are multiples of ``multiple``, a positive integer."""

    multiple: int = attrs.field(validator=positive_multiple)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.k % self.multiple == 0 and config.n % self.multiple == 0:
            return None
        return Reason(
            RejectCode.SHAPE_ALIGNMENT,
            f"K and N to be multiples of {self.multiple}",
            f"N={config.n}, K={config.k}",
        )

    def render(self) -> str:
        return f"K, N % {self.multiple} == 0"


@attrs.frozen
class OutDtypes:
    """The kernel writes one of these output dtypes (names such as ``"bfloat16"`` are parsed)."""

    dtypes: frozenset[Dtype] = attrs.field(converter=_out_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.out_dtype in self.dtypes:
            return None
        return Reason(RejectCode.OUT_DTYPE, listed(self.dtypes), str(config.out_dtype))

    def render(self) -> str:
        return f"out {listed(self.dtypes)}"


@attrs.frozen
class InputDtypes:
    """The kernel reads activations in one of these dtypes (names are parsed)."""

    dtypes: frozenset[Dtype] = attrs.field(converter=_input_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.input_dtype in self.dtypes:
            return None
        return Reason(RejectCode.INPUT_DTYPE, listed(self.dtypes), str(config.input_dtype))

    def render(self) -> str:
        return f"input {listed(self.dtypes)}"
