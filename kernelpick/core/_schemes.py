"""Named quantization schemes, so callers need not assemble a QuantConfig by hand."""

from __future__ import annotations

import enum

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError, parse_enum, positive_int
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MX_BLOCK_SIZE",
    "Scheme",
    "block_size_of",
    "quant_config",
    "scheme_of",
]

# DeepSeek-V3/R1 and Qwen3's FP8 releases use 128x128 weight blocks and 1x128 activation
# groups (their config.json's weight_block_size, read by HF's FineGrainedFP8 and vLLM).
DEFAULT_BLOCK_SIZE = 128
# OCP Microscaling Formats spec v1.0: one E8M0 scale per 32 consecutive elements along K.
MX_BLOCK_SIZE = 32


class Scheme(enum.Enum):
    FP8_PER_CHANNEL = "fp8_per_channel"
    FP8_PER_TENSOR = "fp8_per_tensor"
    FP8_PER_TENSOR_STATIC = "fp8_per_tensor_static"
    FP8_WEIGHT_ONLY = "fp8_weight_only"
    FP8_BLOCK = "fp8_block"
    INT8_PER_CHANNEL = "int8_per_channel"
    MXFP8 = "mxfp8"

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


_RECIPES = {
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


def _block_size(value: object) -> int:
    return positive_int("block_size", value, "a positive integer, e.g. 128")


def quant_config(
    name: Scheme | str,
    *,
    weight_shape: tuple[int, int],
    out_dtype: Dtype | str = Dtype.BFLOAT16,
    input_dtype: Dtype | str | None = None,
    bias: bool = False,
    block_size: int | None = None,
    min_tokens: int = 1,
) -> QuantConfig:
    """The QuantConfig of a named scheme for one layer.

    ``weight_shape`` is ``(N, K)``. ``input_dtype`` defaults to ``out_dtype``.
    ``block_size`` is ``fp8_block``'s (weight blocks ``size x size``, activation groups
    ``1 x size``; 128 when None) and is refused for any other scheme. ``min_tokens`` is the
    fewest rows one call passes (see ``QuantConfig``). Raises ``UnknownNameError`` for an
    unknown scheme or dtype and ``InvalidValueError`` for a bad shape or block size; both
    are ``kp.KernelpickError``.
    """
    scheme = Scheme.parse(name)
    recipe = _RECIPES[scheme]
    if block_size is not None:
        if scheme is not Scheme.FP8_BLOCK:
            expected = "None: only fp8_block takes a block size (mxfp8's is fixed at 32)"
            raise InvalidValueError("block_size", block_size, expected)
        recipe = _block(_block_size(block_size))
    out = Dtype.parse(out_dtype)
    return QuantConfig(
        weight=recipe.weight,
        activation=recipe.activation,
        weight_shape=weight_shape,
        input_dtype=out if input_dtype is None else Dtype.parse(input_dtype),
        out_dtype=out,
        bias=bias,
        min_tokens=min_tokens,
    )


def block_size_of(config: QuantConfig) -> int | None:
    """The block size of an ``fp8_block`` config (any size), else None."""
    size = config.weight.scale.group.rows
    if size < 1 or config.weight.scale.group.cols != size:
        return None
    return size if (config.weight, config.activation) == _pair(_block(size)) else None


def _pair(recipe: _Recipe) -> tuple[QuantKey, QuantKey | None]:
    return (recipe.weight, recipe.activation)


def scheme_of(config: QuantConfig) -> Scheme | None:
    """The named scheme whose scales and dtypes ``config`` uses, or None for a custom one.
    An ``fp8_block`` config of any block size is ``Scheme.FP8_BLOCK``."""
    for name, recipe in _RECIPES.items():
        if (config.weight, config.activation) == _pair(recipe):
            return name
    return Scheme.FP8_BLOCK if block_size_of(config) is not None else None
