"""Quantization vocabulary: group shapes, scale specs, keys and the per-layer QuantConfig.

Group shapes describe an operand as the GEMM sees it: the activation as ``[M, K]`` and the
weight as ``[K, N]``. ``-1`` means the whole dimension, so per-token is ``(1, -1)`` on the
activation and per-channel (one scale per output channel) is ``(-1, 1)`` on the weight.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import attrs

from kernelpick.core._dtypes import HIGH_PRECISION, SCALE_DTYPES, Dtype, as_dtype
from kernelpick.core._errors import InvalidValueError, is_bool, is_positive_int, positive_int

__all__ = ["ActivationGrouping", "GroupShape", "QuantConfig", "QuantKey", "ScaleSpec"]


_NAMED = {(-1, -1): "per-tensor", (1, -1): "per-token", (-1, 1): "per-channel"}


def _group_extent(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not (isinstance(value, int) and value == -1):  # -1: the whole dimension
        expected = "-1 (whole dimension) or a positive integer"
        positive_int(f"group shape {attribute.name}", value, expected)


# Hashes are cached: rules test group membership on every uncached decision.
@attrs.frozen(cache_hash=True)
class GroupShape:
    """How many rows and columns share one scale; -1 spans the whole dimension."""

    rows: int = attrs.field(validator=_group_extent)
    cols: int = attrs.field(validator=_group_extent)

    PER_TENSOR: ClassVar[GroupShape]
    PER_TOKEN: ClassVar[GroupShape]
    PER_CHANNEL: ClassVar[GroupShape]

    @classmethod
    def per_group(cls, size: int) -> GroupShape:
        """One scale per ``size`` consecutive elements of a row, e.g. ``(1, 128)``."""
        return cls(1, size)

    @classmethod
    def block(cls, size: int) -> GroupShape:
        """One scale per ``size`` x ``size`` tile, e.g. ``(128, 128)``."""
        return cls(size, size)

    def render(self) -> str:
        """A name a person knows: per-tensor, per-token, per-channel, per-group or block."""
        shape = (self.rows, self.cols)
        if shape in _NAMED:
            return _NAMED[shape]
        if self.rows == 1 or self.cols == 1:
            return f"per-group {shape}"
        if self.rows == self.cols:
            return f"block {shape}"
        return f"group {shape}"


GroupShape.PER_TENSOR = GroupShape(-1, -1)
GroupShape.PER_TOKEN = GroupShape(1, -1)
GroupShape.PER_CHANNEL = GroupShape(-1, 1)


def _scale_dtype(_inst: object, attribute: attrs.Attribute[Dtype], value: Dtype) -> None:
    if value not in SCALE_DTYPES:
        valid = " or ".join(sorted(d.value for d in SCALE_DTYPES))
        raise InvalidValueError("scale dtype", value.value, valid)


@attrs.frozen(cache_hash=True)
class ScaleSpec:
    """Scale granularity, whether scales are stored (static) or computed per call (dynamic),
    and the dtype they are kept in: fp32, or E8M0 powers of two for the MX formats."""

    group: GroupShape = attrs.field(validator=attrs.validators.instance_of(GroupShape))
    static: bool = attrs.field(validator=is_bool)
    dtype: Dtype = attrs.field(
        default=Dtype.FLOAT32, converter=as_dtype, validator=_scale_dtype, kw_only=True
    )

    def render(self) -> str:
        text = f"{'static' if self.static else 'dynamic'} {self.group.render()}"
        return text if self.dtype is Dtype.FLOAT32 else f"{text} ({self.dtype} scales)"


def _quantized(_inst: object, attribute: attrs.Attribute[Dtype], value: Dtype) -> None:
    if not value.is_quantized:
        raise InvalidValueError("quantized dtype", value.value, "an FP8 dtype, int8 or int4")


def _zero_point_dtype(value: object) -> Dtype | None:
    return None if value is None else Dtype.parse(value)


def _zero_point(inst: QuantKey, attribute: attrs.Attribute[Dtype | None], value: object) -> None:
    # One reading of a zero point only: an integer in the operand's own format, subtracted
    # before the scale, as GPTQ, AWQ and compressed-tensors store it (w = s * (q - z)).
    if value is not None and (value is not inst.dtype or not inst.dtype.is_integer):
        expected = (
            f"None (symmetric) or {inst.dtype}, the operand's own format"
            if inst.dtype.is_integer
            else f"None: {inst.dtype} is symmetric; zero points are for int8 and int4"
        )
        raise InvalidValueError("zero_point", str(value), expected)


@attrs.frozen(cache_hash=True)
class QuantKey:
    """One quantized operand: its FP8 or integer dtype, how it is scaled, and the dtype of
    its zero points (None: symmetric, no zero point).

    A zero point ``z`` is an integer in the operand's own format, one per scale, and a
    value reads ``scale * (q - z)`` (asymmetric int4 and int8 weights: AWQ, GPTQ without
    ``sym``, compressed-tensors' ``symmetric: false``).
    """

    dtype: Dtype = attrs.field(converter=as_dtype, validator=_quantized)
    scale: ScaleSpec = attrs.field(validator=attrs.validators.instance_of(ScaleSpec))
    zero_point: Dtype | None = attrs.field(
        default=None, converter=_zero_point_dtype, validator=_zero_point, kw_only=True
    )

    @property
    def asymmetric(self) -> bool:
        return self.zero_point is not None

    def render(self) -> str:
        zero = f" with {self.zero_point} zero points" if self.zero_point is not None else ""
        return f"{self.scale.render()} {self.dtype}{zero}"


def _weight_shape(value: object) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InvalidValueError("weight_shape", value, "(N, K): two positive integers")
    n, k = value
    if not (is_positive_int(n) and is_positive_int(k)):
        raise InvalidValueError("weight_shape", value, "(N, K): two positive integers")
    return (n, k)


def _high_precision(_inst: object, attribute: attrs.Attribute[Dtype], value: Dtype) -> None:
    if value not in HIGH_PRECISION:
        valid = ", ".join(sorted(d.value for d in HIGH_PRECISION))
        raise InvalidValueError(attribute.name, value.value, f"one of {valid}")


def _optional_key(
    _inst: object, attribute: attrs.Attribute[QuantKey | None], value: object
) -> None:
    if value is not None and not isinstance(value, QuantKey):
        raise InvalidValueError(attribute.name, value, "a QuantKey or None (weight-only)")


def _min_tokens(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    positive_int("min_tokens", value, "a positive integer (1 includes decode)")


def _k_parts(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    positive_int("k_parts", value, "a positive integer: 1, or the row-parallel ranks")


def _operands(config: QuantConfig) -> None:
    # What no kernel can be asked for, refused when the config is built, so no rule has to
    # guess: int4 and zero points are weight formats, and act-order permutes weight groups.
    act = config.activation
    if act is not None and act.dtype is Dtype.INT4:
        raise InvalidValueError(
            "activation dtype", "int4", "an FP8 dtype or int8 (int4 is a weight format)"
        )
    if act is not None and act.zero_point is not None:
        raise InvalidValueError(
            "activation zero_point",
            act.zero_point.value,
            "None: activations are quantized symmetrically",
        )
    if not config.weight.scale.static:
        # A weight is stored quantized, so its scales are stored with it; "dynamic" would be
        # read by every kernel as the stored ones anyway.
        expected = "static weight scales (ScaleSpec(..., static=True)): they are stored with it"
        raise InvalidValueError("weight scale", config.weight.scale.render(), expected)
    group = config.weight.scale.group
    if config.act_order and not (
        config.weight.dtype.is_integer and group.cols == 1 and 1 <= group.rows < config.k
    ):
        expected = "False, unless the weight is int8 or int4 in groups (g, 1) with g < K"
        raise InvalidValueError(
            "act_order", f"True with {config.weight.render()}, K={config.k}", expected
        )


@attrs.frozen(cache_hash=True)
class QuantConfig:
    """What one linear layer asks of a kernel.

    ``weight_shape`` is ``(N, K)`` (output features, input features) of this partition.
    ``activation=None`` means weight-only: activations stay in ``input_dtype``.
    ``min_tokens`` is the fewest rows (tokens, M) one call passes; 1, the default, includes
    decode, and a kernel with a floor on M (``torch._int_mm`` on CUDA needs M > 16) is
    turned down for it. ``act_order``: the weight's K groups are permuted (GPTQ's
    ``desc_act``, compressed-tensors' ``actorder``; a ``g_idx`` names each column's group).
    ``k_parts``: K is one of that many equal row-parallel parts of the layer's K (tensor
    parallelism), so a group may straddle two ranks. Build one with
    ``kp.quant_config(...)`` unless you need a combination no named scheme has.
    """

    weight: QuantKey = attrs.field(validator=attrs.validators.instance_of(QuantKey))
    activation: QuantKey | None = attrs.field(validator=_optional_key)
    weight_shape: tuple[int, int] = attrs.field(converter=_weight_shape)
    input_dtype: Dtype = attrs.field(converter=as_dtype, validator=_high_precision)
    out_dtype: Dtype = attrs.field(converter=as_dtype, validator=_high_precision)
    bias: bool = attrs.field(default=False, validator=is_bool)
    min_tokens: int = attrs.field(default=1, validator=_min_tokens, kw_only=True)
    act_order: bool = attrs.field(default=False, validator=is_bool, kw_only=True)
    k_parts: int = attrs.field(default=1, validator=_k_parts, kw_only=True)

    def __attrs_post_init__(self) -> None:
        _operands(self)

    @property
    def n(self) -> int:
        return self.weight_shape[0]

    @property
    def k(self) -> int:
        return self.weight_shape[1]

    @property
    def weight_only(self) -> bool:
        return self.activation is None

    @property
    def weight_block(self) -> tuple[int, int]:
        """The ``(rows, cols)`` of the stored ``[N, K]`` weight that share one scale.

        A weight is stored, saved and loaded as ``[N, K]`` (one row per output channel),
        while its group shape is written over the GEMM's ``[K, N]`` operand, as engines
        write it. This is the one place that reads one as the other: per-channel
        ``(-1, 1)`` is ``(1, K)``, per-tensor ``(N, K)``, a ``(b, b)`` block ``(b, b)``.
        """
        group = self.weight.scale.group
        n, k = self.weight_shape
        return (n if group.cols == -1 else group.cols, k if group.rows == -1 else group.rows)

    @property
    def weight_scale_shape(self) -> tuple[int, ...]:
        """The shape of the stored weight scale: ``(N, 1)`` per channel, ``(1,)`` per
        tensor, ``(ceil(N / rows), ceil(K / cols))`` per block (compressed-tensors' shapes)."""
        if self.weight.scale.group == GroupShape.PER_TENSOR:
            return (1,)
        n, k = self.weight_shape
        rows, cols = self.weight_block
        return (-(-n // rows), -(-k // cols))

    def render(self) -> str:
        """One line: both operands, the shape and the dtypes."""
        act = "none (weight-only)" if self.activation is None else self.activation.render()
        n, k = self.weight_shape
        bias = ", bias" if self.bias else ""
        tokens = f", M >= {self.min_tokens}" if self.min_tokens > 1 else ""
        order = ", act-order" if self.act_order else ""
        parts = f" (1 of {self.k_parts} K parts)" if self.k_parts > 1 else ""
        return (
            f"weight {self.weight.render()}{order}, activation {act}, N={n} K={k}{parts}"
            f"{tokens}, {self.input_dtype} -> {self.out_dtype}{bias}"
        )

    @property
    def activation_grouping(self) -> ActivationGrouping:
        """How finely this config scales activations, as the kind rules classify it."""
        return ActivationGrouping.of(self)


class ActivationGrouping(enum.Enum):
    """How finely a config scales its activations, for the rules keyed on a kernel's kind.

    Read from the group shape and K together, so a group that spans a whole row is
    per-token whatever it is called: ``(1, 4096)`` on a K=4096 layer is ``(1, -1)``.
    """

    NONE = "none"  # weight-only: activations are not quantized
    PER_TENSOR = "per-tensor"
    TOKEN_GROUP = "per-token-group"  # (1, g) with g < K: block FP8's 1x128, MX's 1x32
    PER_TOKEN = "per-token"
    OTHER = "other"  # any other tiling of the activation

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, config: QuantConfig) -> ActivationGrouping:
        act = config.activation
        return cls.NONE if act is None else cls.of_group(act.scale.group, config.k)

    @classmethod
    def of_group(cls, group: GroupShape, k: int | None = None) -> ActivationGrouping:
        """The grouping of an activation ``group`` over rows of ``k`` (None: K unknown, so
        only -1 spans a whole row, as for a shape a kernel declares)."""
        whole_row = group.cols == -1 or (k is not None and group.cols >= k)
        if group.rows == 1:
            return cls.PER_TOKEN if whole_row else cls.TOKEN_GROUP
        if group.rows == -1 and whole_row:
            return cls.PER_TENSOR
        return cls.OTHER
