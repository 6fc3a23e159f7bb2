"""What the rule classes share: their field converters, and how they list values in text.

A rule is built once, with the catalog, and read on every uncached decision, so a wrong
field is refused here, naming it, rather than misread there: a ``{"bfloat16"}`` that never
equals ``Dtype.BFLOAT16``, an ``Alignment(0)`` that divides by zero, a ``"9.0"`` compared
with a ``CudaArch``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kernelpick.core._arch import CudaArch
from kernelpick.core._dtypes import HIGH_PRECISION, SCALE_DTYPES, Dtype
from kernelpick.core._errors import InvalidValueError, positive_int
from kernelpick.core._quant import GroupShape

__all__ = [
    "as_cuda_arch",
    "either",
    "flag_names",
    "fp8_dtypes",
    "group_shapes",
    "high_precision_dtypes",
    "listed",
    "non_empty_text",
    "positive_multiple",
    "quantized_dtypes",
    "scale_dtypes",
]

_FP8 = frozenset(dtype for dtype in Dtype if dtype.is_fp8)
_QUANTIZED = frozenset(dtype for dtype in Dtype if dtype.is_quantized)


def either(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def listed(items: Iterable[Dtype] | Iterable[GroupShape]) -> str:
    return either(
        sorted(item.render() if isinstance(item, GroupShape) else str(item) for item in items)
    )


def _members(value: object, what: str) -> list[object]:
    # A bare string is refused: iterated, it would be a set of characters.
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidValueError(what, value, "a set of values, e.g. frozenset({...})")
    items = list(value)
    if not items:
        raise InvalidValueError(what, value, "at least one value: an empty set matches nothing")
    return items


def _dtypes(value: object, what: str, allowed: frozenset[Dtype]) -> frozenset[Dtype]:
    dtypes = frozenset(Dtype.parse(item) for item in _members(value, what))
    if not dtypes <= allowed:
        raise InvalidValueError(what, value, f"dtypes among {listed(allowed)}")
    return dtypes


def fp8_dtypes(value: object) -> frozenset[Dtype]:
    """A converter: a set of FP8 dtypes, from members or names (``"float8_e4m3fn"``)."""
    return _dtypes(value, "FP8 dtypes", _FP8)


def quantized_dtypes(value: object, what: str) -> frozenset[Dtype]:
    """A set of FP8 or int8 dtypes, from members or names; ``what`` names the field."""
    return _dtypes(value, what, _QUANTIZED)


def scale_dtypes(value: object, what: str) -> frozenset[Dtype]:
    """A set of scale dtypes (fp32, float8_e8m0fnu); ``what`` names the field."""
    return _dtypes(value, what, SCALE_DTYPES)


def high_precision_dtypes(value: object, what: str) -> frozenset[Dtype]:
    """A set of bf16/fp16/fp32 dtypes, from members or names; ``what`` names the field."""
    return _dtypes(value, what, HIGH_PRECISION)


def group_shapes(value: object, what: str) -> frozenset[GroupShape]:
    """A non-empty set of ``GroupShape`` values; ``what`` names the field."""
    items = _members(value, what)
    shapes = [item for item in items if isinstance(item, GroupShape)]
    if len(shapes) != len(items):
        raise InvalidValueError(what, value, "GroupShape values, e.g. GroupShape.PER_TOKEN")
    return frozenset(shapes)


def flag_names(value: object, what: str) -> frozenset[str]:
    """A non-empty set of ISA flag names, lower-cased and stripped as ``CpuArch`` keeps
    them (``"AVX2 "`` is ``avx2``); ``what`` names the field."""
    items = _members(value, what)
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise InvalidValueError(what, value, "flag names (non-empty strings), e.g. {'avx2'}")
    return frozenset(str(item).strip().lower() for item in items)


def as_cuda_arch(value: object) -> CudaArch:
    """``CudaArch.parse`` as a plain function, for use as an attrs converter."""
    return CudaArch.parse(value)


def non_empty_text(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    """An attrs validator: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValueError(attribute.name, value, "a non-empty string")


def positive_multiple(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    """An attrs validator: a positive int. bool is an int subclass, and Alignment(True) is
    a slip, not "multiples of 1"."""
    positive_int("Alignment multiple", value, "a positive integer, e.g. 16")
