"""The rules that read the layer's config: formats, scale granularities, shape, dtypes,
and the two kind rules the core adds to every kernel of a kind."""

from __future__ import annotations

import attrs

from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import Dtype
from kernelpick.core._quant import GroupShape, QuantConfig
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._rule_fields import (
    fp8_dtypes,
    group_shapes,
    high_precision_dtypes,
    listed,
    positive_multiple,
)

__all__ = [
    "ActivationQuantized",
    "ActivationScales",
    "Alignment",
    "DynamicActivationScales",
    "Fp8Dtypes",
    "InputDtypes",
    "NotBothPerTensor",
    "OutDtypes",
    "WeightOnlyActivation",
    "WeightScales",
]


# One named converter per field: attrs' mypy plugin reads named functions only.
def _activation_groups(value: object) -> frozenset[GroupShape]:
    return group_shapes(value, "ActivationScales groups")


def _weight_groups(value: object) -> frozenset[GroupShape]:
    return group_shapes(value, "WeightScales groups")


def _out_dtypes(value: object) -> frozenset[Dtype]:
    return high_precision_dtypes(value, "OutDtypes dtypes")


def _input_dtypes(value: object) -> frozenset[Dtype]:
    return high_precision_dtypes(value, "InputDtypes dtypes")


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
    """A W8A8 kernel reads activation scales of these granularities."""

    groups: frozenset[GroupShape] = attrs.field(converter=_activation_groups)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        # A weight-only config is judged by the kind rule, not here.
        if act is None or act.scale.group in self.groups:
            return None
        return Reason(RejectCode.ACTIVATION_SCALES, listed(self.groups), act.scale.group.render())

    def render(self) -> str:
        return f"activation {listed(self.groups)}"


@attrs.frozen
class DynamicActivationScales:
    """A W8A8 kernel that computes activation scales itself, on every call: it has no way to
    take a static (calibrated) scale."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        # A weight-only config is judged by the kind rule, not here.
        if act is None or not act.scale.static:
            return None
        return Reason(RejectCode.ACTIVATION_SCALES, "dynamic", act.scale.render())

    def render(self) -> str:
        return "activation scales dynamic"


@attrs.frozen
class WeightScales:
    """The kernel reads weight scales of these granularities."""

    groups: frozenset[GroupShape] = attrs.field(converter=_weight_groups)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        group = config.weight.scale.group
        if group in self.groups:
            return None
        return Reason(RejectCode.WEIGHT_SCALES, listed(self.groups), group.render())

    def render(self) -> str:
        return f"weight {listed(self.groups)}"


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


# The two kind rules below are not declared by kernels: the core applies them to every
# kernel of the kind (see specs.KIND_RULES), so no kernel can forget them.


@attrs.frozen
class ActivationQuantized:
    """A W8A8 kernel quantizes activations, so the config must say how."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.activation is not None:
            return None
        return Reason(RejectCode.ACTIVATION_REQUIRED, "an activation quantization", "none")

    def render(self) -> str:
        return "an activation quantization (W8A8)"


@attrs.frozen
class WeightOnlyActivation:
    """A W8A16 kernel leaves activations in high precision: it can stand in for a per-tensor
    activation scale (degraded), never for a finer one such as per-token (vLLM issue 61316)."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        act = config.activation
        if act is None or act.scale.group == GroupShape.PER_TENSOR:
            return None
        return Reason(
            RejectCode.WEIGHT_ONLY_ACTIVATION,
            "no activation quantization, or per-tensor (degraded)",
            act.scale.group.render(),
        )

    def render(self) -> str:
        return "activation none, or per-tensor (degraded)"
