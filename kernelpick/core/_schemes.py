"""Named quantization schemes, so callers need not assemble a QuantConfig by hand."""

from __future__ import annotations

import enum

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import parse_enum
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec

__all__ = ["Scheme", "quant_config", "scheme_of"]


class Scheme(enum.Enum):
    FP8_PER_CHANNEL = "fp8_per_channel"
    FP8_PER_TENSOR = "fp8_per_tensor"
    FP8_PER_TENSOR_STATIC = "fp8_per_tensor_static"
    FP8_WEIGHT_ONLY = "fp8_weight_only"

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
}


def quant_config(
    name: Scheme | str,
    *,
    weight_shape: tuple[int, int],
    out_dtype: Dtype | str = Dtype.BFLOAT16,
    input_dtype: Dtype | str | None = None,
    bias: bool = False,
) -> QuantConfig:
    """The QuantConfig of a named scheme for one layer.

    ``weight_shape`` is ``(N, K)``. ``input_dtype`` defaults to ``out_dtype``. Raises
    ``UnknownNameError`` for an unknown scheme or dtype and ``InvalidValueError`` for a bad
    shape; both are ``kp.KernelpickError``.
    """
    recipe = _RECIPES[Scheme.parse(name)]
    out = Dtype.parse(out_dtype)
    return QuantConfig(
        weight=recipe.weight,
        activation=recipe.activation,
        weight_shape=weight_shape,
        input_dtype=out if input_dtype is None else Dtype.parse(input_dtype),
        out_dtype=out,
        bias=bias,
    )


def scheme_of(config: QuantConfig) -> Scheme | None:
    """The named scheme whose scales and dtypes ``config`` uses, or None for a custom one."""
    for name, recipe in _RECIPES.items():
        if (config.weight, config.activation) == (recipe.weight, recipe.activation):
            return name
    return None
