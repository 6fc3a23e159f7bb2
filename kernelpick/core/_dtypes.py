"""Data types as plain names, so the core can speak of them without importing torch."""

from __future__ import annotations

import enum

from kernelpick.core._errors import InvalidValueError, UnknownNameError

__all__ = [
    "E4M3_FORMATS",
    "HIGH_PRECISION",
    "INTEGER_FORMATS",
    "SCALE_DTYPES",
    "Dtype",
    "as_dtype",
]


class Dtype(enum.Enum):
    """A tensor element type. Values are torch's attribute names (``torch.<value>``)."""

    FLOAT8_E4M3FN = "float8_e4m3fn"
    FLOAT8_E4M3FNUZ = "float8_e4m3fnuz"
    FLOAT8_E5M2 = "float8_e5m2"
    INT8 = "int8"
    # Signed 4-bit integers, -8..7: a weight format only (GPTQ, AWQ, compressed-tensors'
    # pack-quantized), stored eight to an int32 word and never as a tensor of its own.
    INT4 = "int4"
    # A scale format, never a quantized operand: a power of two, 2^(byte - 127), as OCP
    # microscaling (MX) stores block scales.
    FLOAT8_E8M0FNU = "float8_e8m0fnu"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"

    def __str__(self) -> str:
        return self.value

    @property
    def is_fp8(self) -> bool:
        return self in _FP8

    @property
    def is_quantized(self) -> bool:
        """Whether a quantized operand may be stored in it: an FP8 format, int8 or int4."""
        return self in _QUANTIZED

    @property
    def is_integer(self) -> bool:
        """Whether it is an integer format: int8 or int4."""
        return self in INTEGER_FORMATS

    @property
    def bits(self) -> int:
        """Bits per element."""
        return _BITS[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element; int4, which packs two elements a byte, has none."""
        if self.bits % 8:
            raise InvalidValueError(
                "dtype", self.value, "a whole-byte dtype: int4 packs 8 values an int32 word"
            )
        return self.bits // 8

    @property
    def finfo_max(self) -> float:
        """Largest finite value, as ``torch.finfo`` (``torch.iinfo`` for int8) reports it
        (7 for int4)."""
        return _FINFO_MAX[self]

    @property
    def quant_max(self) -> float:
        """The range a quantizer targets, symmetric about zero.

        Equal to ``finfo_max`` except for e4m3fnuz, where engines use 224 rather than
        torch's 240 for accuracy on MI300, as vLLM does; int8 uses +-127, never -128, so
        that a value and its negation both exist (docs/design.md#quantization-numerics).
        int4 has no symmetric range of its own: its quantizer uses -8..7 whole
        (``kernelpick.kernels``, as compressed-tensors does).
        """
        if not self.is_quantized or self is Dtype.INT4:
            raise InvalidValueError(
                "dtype", self.value, "an FP8 dtype or int8 to have a symmetric range"
            )
        return 224.0 if self is Dtype.FLOAT8_E4M3FNUZ else self.finfo_max

    @classmethod
    def parse(cls, value: object) -> Dtype:
        """A member from a member, a name (``"bfloat16"``, ``"bf16"``) or a torch dtype.

        Anything whose ``str`` is ``torch.<name>`` is accepted, so an engine may pass
        ``torch.bfloat16`` without the core importing torch.
        """
        if isinstance(value, Dtype):
            return value
        text = str(value).strip().lower().removeprefix("torch.")
        found = _BY_NAME.get(text)
        if found is None:
            raise UnknownNameError("dtype", value, [d.value for d in cls])
        return found


def as_dtype(value: object) -> Dtype:
    """``Dtype.parse`` as a plain function, for use as an attrs converter."""
    return Dtype.parse(value)


_FP8 = frozenset({Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ, Dtype.FLOAT8_E5M2})
INTEGER_FORMATS = frozenset({Dtype.INT8, Dtype.INT4})
_QUANTIZED = _FP8 | INTEGER_FORMATS
# What a scale may be stored in: fp32, or E8M0 powers of two (MX formats).
SCALE_DTYPES = frozenset({Dtype.FLOAT32, Dtype.FLOAT8_E8M0FNU})
E4M3_FORMATS = frozenset({Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ})
HIGH_PRECISION = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32})

_BITS = {
    Dtype.FLOAT8_E4M3FN: 8,
    Dtype.FLOAT8_E4M3FNUZ: 8,
    Dtype.FLOAT8_E5M2: 8,
    Dtype.INT8: 8,
    Dtype.INT4: 4,
    Dtype.FLOAT8_E8M0FNU: 8,
    Dtype.BFLOAT16: 16,
    Dtype.FLOAT16: 16,
    Dtype.FLOAT32: 32,
}
# torch.finfo(...).max for each type.
_FINFO_MAX = {
    Dtype.FLOAT8_E4M3FN: 448.0,
    Dtype.FLOAT8_E4M3FNUZ: 240.0,
    Dtype.FLOAT8_E5M2: 57344.0,
    Dtype.INT8: 127.0,
    Dtype.INT4: 7.0,
    Dtype.FLOAT8_E8M0FNU: 2.0**127,
    Dtype.BFLOAT16: 3.3895313892515355e38,
    Dtype.FLOAT16: 65504.0,
    Dtype.FLOAT32: 3.4028234663852886e38,
}
_ALIASES = {
    "bf16": Dtype.BFLOAT16,
    "fp16": Dtype.FLOAT16,
    "half": Dtype.FLOAT16,
    "fp32": Dtype.FLOAT32,
    "float": Dtype.FLOAT32,
    "e4m3fn": Dtype.FLOAT8_E4M3FN,
    "e4m3fnuz": Dtype.FLOAT8_E4M3FNUZ,
    "e5m2": Dtype.FLOAT8_E5M2,
    "e8m0": Dtype.FLOAT8_E8M0FNU,
    "e8m0fnu": Dtype.FLOAT8_E8M0FNU,
    "i8": Dtype.INT8,
    "i4": Dtype.INT4,
}
_BY_NAME = {**{d.value: d for d in Dtype}, **_ALIASES}
