"""Named quantization schemes, so callers need not assemble a QuantConfig by hand."""

from __future__ import annotations

import enum
import functools

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import parse_enum
from kernelpick.core._quant import GroupShape, QuantConfig, QuantKey, ScaleSpec

__all__ = ["Scheme", "clear_scheme_cache", "quant_config", "scheme_of"]


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
    weight: ScaleSpec
    activation: ScaleSpec | None


# A config names the e4m3 format; either e4m3 flavour satisfies it on a device, because
# the integration quantizes into the device's native format (design §3).
_FP8 = Dtype.FLOAT8_E4M3FN
_STATIC_CHANNEL = ScaleSpec(GroupShape.PER_CHANNEL, static=True)
_STATIC_TENSOR = ScaleSpec(GroupShape.PER_TENSOR, static=True)

_RECIPES = {
    # PTPC: per-token dynamic activations, per-channel static weights.
    Scheme.FP8_PER_CHANNEL: _Recipe(_STATIC_CHANNEL, ScaleSpec(GroupShape.PER_TOKEN, static=False)),
    Scheme.FP8_PER_TENSOR: _Recipe(_STATIC_TENSOR, ScaleSpec(GroupShape.PER_TENSOR, static=False)),
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
    # Only exact ints and bools reach the cache: it compares keys with ==, and (1.0, 1) or
    # bias=1 must be refused, not served the config of (1, 1) or bias=True.
    exact = (
        type(bias) is bool
        and type(weight_shape) is tuple
        and all(type(extent) is int for extent in weight_shape)
    )
    if exact:
        try:
            return _cached(name, weight_shape, out_dtype, input_dtype, bias)
        except TypeError:  # an unhashable dtype or name: build it uncached
            pass
    return _build(name, weight_shape, out_dtype, input_dtype, bias)


def _build(
    name: Scheme | str,
    weight_shape: tuple[int, int],
    out_dtype: Dtype | str,
    input_dtype: Dtype | str | None,
    bias: bool,
) -> QuantConfig:
    recipe = _RECIPES[Scheme.parse(name)]
    out = Dtype.parse(out_dtype)
    return QuantConfig(
        weight=QuantKey(_FP8, recipe.weight),
        activation=None if recipe.activation is None else QuantKey(_FP8, recipe.activation),
        weight_shape=weight_shape,
        input_dtype=out if input_dtype is None else Dtype.parse(input_dtype),
        out_dtype=out,
        bias=bias,
    )


# A model asks for the same few layer shapes hundreds of times; a config is a frozen
# value, so building each once keeps planning a model cheap (plan_model_ns). Errors are
# not cached: they are raised again on each call.
_cached = functools.lru_cache(maxsize=4096)(_build)


def clear_scheme_cache() -> None:
    _cached.cache_clear()


def scheme_of(config: QuantConfig) -> Scheme | None:
    """The named scheme whose scales and dtypes ``config`` uses, or None for a custom one."""
    for name, recipe in _RECIPES.items():
        act = None if config.activation is None else config.activation.scale
        if (config.weight.scale, act) == (recipe.weight, recipe.activation) and (
            config.weight.dtype is _FP8
            and (config.activation is None or config.activation.dtype is _FP8)
        ):
            return name
    return None
