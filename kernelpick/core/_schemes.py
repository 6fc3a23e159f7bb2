"""Named quantization schemes, so callers need not assemble a QuantConfig by hand."""

from __future__ import annotations

import enum

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError, parse_enum, positive_int
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GROUP_SIZE",
    "INTEGER_WEIGHT_ONLY",
    "MX_BLOCK_SIZE",
    "PER_CHANNEL_GROUP",
    "Scheme",
    "block_size_of",
    "group_size_of",
    "quant_config",
    "scheme_of",
]

# DeepSeek-V3/R1 and Qwen3's FP8 releases use 128x128 weight blocks and 1x128 activation
# groups (their config.json's weight_block_size, read by HF's FineGrainedFP8 and vLLM).
DEFAULT_BLOCK_SIZE = 128
# OCP Microscaling Formats spec v1.0: one E8M0 scale per 32 consecutive elements along K.
MX_BLOCK_SIZE = 32
# compressed-tensors' W4A16 and W4A16_ASYM presets (and GPTQ's, AWQ's defaults): one scale
# per 128 consecutive weights along K.
DEFAULT_GROUP_SIZE = 128
# group_size=-1 is per channel, as vLLM and GPTQ write it.
PER_CHANNEL_GROUP = -1


class Scheme(enum.Enum):
    FP8_PER_CHANNEL = "fp8_per_channel"
    FP8_PER_TENSOR = "fp8_per_tensor"
    FP8_PER_TENSOR_STATIC = "fp8_per_tensor_static"
    FP8_WEIGHT_ONLY = "fp8_weight_only"
    FP8_BLOCK = "fp8_block"
    INT8_PER_CHANNEL = "int8_per_channel"
    MXFP8 = "mxfp8"
    INT4_WEIGHT_ONLY = "int4_weight_only"
    INT8_WEIGHT_ONLY = "int8_weight_only"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> Scheme:
        return parse_enum(cls, value, "scheme")


@attrs.frozen
class _Recipe:
    weight: QuantKey
    activation: QuantKey | None


# A config names the e4m3 format; either e4m3 flavour satisfies it on a device, because
# the integration quantizes into the device's native format (docs/design.md#vocabulary).
_FP8 = Dtype.FLOAT8_E4M3FN
_STATIC_CHANNEL = QuantKey(_FP8, ScaleSpec(GroupShape.PER_CHANNEL, static=True))
_STATIC_TENSOR = QuantKey(_FP8, ScaleSpec(GroupShape.PER_TENSOR, static=True))
_E8M0 = Dtype.FLOAT8_E8M0FNU


def _block(size: int) -> _Recipe:
    # Weight blocks of size x size over [K, N]; activations 1 x size groups along K.
    return _Recipe(
        QuantKey(_FP8, ScaleSpec(GroupShape.block(size), static=True)),
        QuantKey(_FP8, ScaleSpec(GroupShape.per_group(size), static=False)),
    )


_RECIPES: dict[Scheme, _Recipe] = {
    # PTPC: per-token dynamic activations, per-channel static weights.
    Scheme.FP8_PER_CHANNEL: _Recipe(
        _STATIC_CHANNEL, QuantKey(_FP8, ScaleSpec(GroupShape.PER_TOKEN, static=False))
    ),
    Scheme.FP8_PER_TENSOR: _Recipe(
        _STATIC_TENSOR, QuantKey(_FP8, ScaleSpec(GroupShape.PER_TENSOR, static=False))
    ),
    Scheme.FP8_PER_TENSOR_STATIC: _Recipe(_STATIC_TENSOR, _STATIC_TENSOR),
    Scheme.FP8_WEIGHT_ONLY: _Recipe(_STATIC_CHANNEL, None),
    Scheme.FP8_BLOCK: _block(DEFAULT_BLOCK_SIZE),
    # SmoothQuant / compressed-tensors int8 W8A8: symmetric int8, per-token dynamic
    # activations, per-channel weights.
    Scheme.INT8_PER_CHANNEL: _Recipe(
        QuantKey(Dtype.INT8, ScaleSpec(GroupShape.PER_CHANNEL, static=True)),
        QuantKey(Dtype.INT8, ScaleSpec(GroupShape.PER_TOKEN, static=False)),
    ),
    # MXFP8: e4m3 values with one E8M0 scale per 32 elements along K, on both operands;
    # over the weight's [K, N] that is a (32, 1) group.
    Scheme.MXFP8: _Recipe(
        QuantKey(_FP8, ScaleSpec(GroupShape(MX_BLOCK_SIZE, 1), static=True, dtype=_E8M0)),
        QuantKey(_FP8, ScaleSpec(GroupShape(1, MX_BLOCK_SIZE), static=False, dtype=_E8M0)),
    ),
}


# The integer weight-only schemes: their weight's format, and the group size when none is
# given (W8A16, compressed-tensors' preset, is per channel). Any group size, zero points
# or act-order are parameters of the config, not other schemes.
INTEGER_WEIGHT_ONLY: dict[Scheme, tuple[Dtype, int]] = {
    Scheme.INT4_WEIGHT_ONLY: (Dtype.INT4, DEFAULT_GROUP_SIZE),
    Scheme.INT8_WEIGHT_ONLY: (Dtype.INT8, PER_CHANNEL_GROUP),
}


def _block_size(value: object) -> int:
    return positive_int("block_size", value, "a positive integer, e.g. 128")


def _integer_weight(scheme: Scheme, group_size: int | None, symmetric: bool) -> QuantKey:
    dtype, default = INTEGER_WEIGHT_ONLY[scheme]
    size = default if group_size is None else group_size
    if size != PER_CHANNEL_GROUP:
        positive_int("group_size", size, "a positive integer such as 128, or -1 (per channel)")
    group = GroupShape.PER_CHANNEL if size == PER_CHANNEL_GROUP else GroupShape(size, 1)
    if not isinstance(symmetric, bool):
        raise InvalidValueError("symmetric", symmetric, "True or False (zero points)")
    zero = None if symmetric else dtype
    return QuantKey(dtype, ScaleSpec(group, static=True), zero_point=zero)


def quant_config(
    name: Scheme | str,
    *,
    weight_shape: tuple[int, int],
    out_dtype: Dtype | str = Dtype.BFLOAT16,
    input_dtype: Dtype | str | None = None,
    bias: bool = False,
    block_size: int | None = None,
    min_tokens: int = 1,
    group_size: int | None = None,
    symmetric: bool = True,
    act_order: bool = False,
    k_parts: int = 1,
) -> QuantConfig:
    """The QuantConfig of a named scheme for one layer.

    ``weight_shape`` is ``(N, K)``. ``input_dtype`` defaults to ``out_dtype``.
    ``block_size`` is ``fp8_block``'s (weight blocks ``size x size``, activation groups
    ``1 x size``; 128 when None) and is refused for any other scheme. ``min_tokens`` is the
    fewest rows one call passes (see ``QuantConfig``).

    The integer weight-only schemes (``int4_weight_only``, ``int8_weight_only``) take
    ``group_size`` (weights along K per scale, or -1 per channel; None: 128 for int4, per
    channel for int8), ``symmetric`` (False: a zero point per group) and ``act_order``
    (a ``g_idx`` permutes the groups); the other schemes refuse them. ``k_parts`` is how
    many row-parallel parts K is cut in (see ``QuantConfig``).

    Raises ``UnknownNameError`` for an unknown scheme or dtype and ``InvalidValueError``
    for a bad shape, block or group size; both are ``kp.KernelpickError``.
    """
    scheme = Scheme.parse(name)
    integer = scheme in INTEGER_WEIGHT_ONLY
    if not integer:
        passed = {"group_size": group_size is not None, "symmetric": symmetric is not True}
        passed["act_order"] = act_order is not False
        for field, given in passed.items():
            if given:
                value = {"group_size": group_size, "symmetric": symmetric}.get(field, act_order)
                expected = "its default: only int4_weight_only and int8_weight_only take one"
                raise InvalidValueError(field, value, expected)
    recipe = _RECIPES[scheme] if not integer else None
    if block_size is not None:
        if scheme is not Scheme.FP8_BLOCK:
            expected = "None: only fp8_block takes a block size (mxfp8's is fixed at 32)"
            raise InvalidValueError("block_size", block_size, expected)
        recipe = _block(_block_size(block_size))
    if recipe is None:
        recipe = _Recipe(_integer_weight(scheme, group_size, symmetric), None)
    out = Dtype.parse(out_dtype)
    return QuantConfig(
        weight=recipe.weight,
        activation=recipe.activation,
        weight_shape=weight_shape,
        input_dtype=out if input_dtype is None else Dtype.parse(input_dtype),
        out_dtype=out,
        bias=bias,
        min_tokens=min_tokens,
        act_order=act_order,
        k_parts=k_parts,
    )


def block_size_of(config: QuantConfig) -> int | None:
    """The block size of an ``fp8_block`` config (any size), else None."""
    size = config.weight.scale.group.rows
    if size < 1 or config.weight.scale.group.cols != size:
        return None
    return size if (config.weight, config.activation) == _pair(_block(size)) else None


def _pair(recipe: _Recipe) -> tuple[QuantKey, QuantKey | None]:
    return (recipe.weight, recipe.activation)


def group_size_of(config: QuantConfig) -> int | None:
    """An integer weight-only config's group size along K (-1 per channel), else None."""
    weight = config.weight
    if config.activation is not None or not weight.dtype.is_integer:
        return None
    if weight.scale != ScaleSpec(weight.scale.group, static=True):
        return None
    group = weight.scale.group
    if group == GroupShape.PER_CHANNEL:
        return PER_CHANNEL_GROUP
    return group.rows if group.cols == 1 and group.rows > 0 else None


def scheme_of(config: QuantConfig) -> Scheme | None:
    """The named scheme whose scales and dtypes ``config`` uses, or None for a custom one.
    An ``fp8_block`` config of any block size is ``Scheme.FP8_BLOCK``; an integer
    weight-only config of any group size, symmetric or not, is its width's scheme."""
    for name, recipe in _RECIPES.items():
        if (config.weight, config.activation) == _pair(recipe):
            return name
    if group_size_of(config) is not None:
        for scheme, (dtype, _) in INTEGER_WEIGHT_ONLY.items():
            if config.weight.dtype is dtype:
                return scheme
    return Scheme.FP8_BLOCK if block_size_of(config) is not None else None
