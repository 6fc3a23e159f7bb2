"""The canonical form of a quantized linear layer: what is stored, saved and loaded.

Whatever kernel runs a layer and whatever device it runs on, its persistent tensors are:

- ``weight``: ``[N, K]``, contiguous and row-major: FP8 in the OCP ``float8_e4m3fn``
  format, or int8 for an int8 config (kernelpick's quantizer writes -127..127; a loaded
  compressed-tensors checkpoint may hold -128, which every kernel multiplies exactly).
  In FP8, zero is the byte 0x00, never negative zero (0x80), and no byte is NaN (0x7F,
  0xFF), so the same bytes read as e4m3fnuz are the same values halved (see ``fnuz``);
- ``weight_scale``: ``config.weight_scale_shape``: ``[N, 1]`` per channel, ``[1]`` per
  tensor, ``[ceil(N/b), ceil(K/b)]`` per ``b x b`` block, ``[N, ceil(K/32)]`` for MXFP8;
  fp32, or ``float8_e8m0fnu`` where the config's scales are E8M0 (stored, in a state
  dict and a checkpoint, as its uint8 bytes: ``stored_scale``);
- ``input_scale``: fp32 ``[1]``, for schemes with a static activation scale.

These are the names and shapes of compressed-tensors' "float-quantized" format, which
FP8 checkpoints use. A kernel's own layout is prepared from them (``Kernel.prepare_weights``)
and never stored.
"""

from __future__ import annotations

import torch

from kernelpick.core import Dtype, QuantConfig
from kernelpick.kernels._quantize import (
    CHUNK_ROWS,
    AmaxReduce,
    dequantize,
    quantize_in_chunks,
    quantize_static,
)
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "CANONICAL_FP8",
    "E8M0_DTYPES",
    "E8M0_STORED",
    "STORED_SCALE_DTYPES",
    "canonical_dtype",
    "canonical_scale",
    "canonical_scale_dtype",
    "canonicalize_fp8_",
    "check_finite",
    "check_fp8_finite",
    "check_positive_finite",
    "dequantize_weight",
    "has_negative_zero",
    "one_tensor_scale",
    "positive_zero_",
    "quantize_canonical",
    "stored_scale",
]

CANONICAL_FP8 = Dtype.FLOAT8_E4M3FN
# The torch dtypes a checkpoint may store scales in: fp32, or the model's dtype
# (llmcompressor writes bf16 scales for bf16 models); both widen to fp32 exactly. Not the
# dtypes a config's scales may have (kernelpick.core's, fp32 and E8M0).
STORED_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# An E8M0 scale (MXFP8's weight_scale) is stored as its bytes, uint8: the bits of
# float8_e8m0fnu, 2 ** (byte - 127). compressed-tensors' MXFP8 compressor writes and reads
# them so (scale_dtype torch.uint8); its reader converts a float8_e8m0fnu tensor's values
# instead of reading its bits, so the dtype is never left to the writer.
E8M0_STORED = torch.uint8
# What an E8M0 scale may be read from: itself, or its stored bytes.
E8M0_DTYPES = (torch.float8_e8m0fnu, E8M0_STORED)

_NEGATIVE_ZERO = 0x80
_MAGNITUDE = 0x7F  # an e4m3fn byte with every exponent and mantissa bit set is NaN


def check_fp8_finite(name: str, weight: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> None:
    """Refuse an e4m3fn tensor holding a NaN byte: a corrupt checkpoint, whose NaN bytes
    would silently read as +-240 on an e4m3fnuz device."""
    check_tensor(name, weight, dtypes=(torch.float8_e4m3fn,))
    rows = _rows(weight.view(torch.uint8))
    for start in range(0, rows.shape[0], chunk_rows):
        nan = (rows[start : start + chunk_rows] & _MAGNITUDE) == _MAGNITUDE
        if bool(nan.any()):
            row = start + int(nan.any(dim=1).nonzero()[0])
            raise reject(name, weight, f"finite FP8 values; row {row} holds a NaN byte")


def positive_zero_(weight: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> None:
    """-0 (byte 0x80) becomes +0 in an e4m3fn tensor, in place: the same value, and the
    byte e4m3fnuz reads as NaN gone. A chunk of rows at a time, so the mask stays small."""
    rows = _rows(weight.view(torch.uint8))
    for start in range(0, rows.shape[0], chunk_rows):
        chunk = rows[start : start + chunk_rows]
        chunk.masked_fill_(chunk == _NEGATIVE_ZERO, 0)


def has_negative_zero(weight: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> bool:
    """Whether an e4m3fn tensor holds a -0 byte (0x80), which ``positive_zero_`` rewrites:
    so a caller that does not own the tensor knows whether to copy it first."""
    rows = _rows(weight.view(torch.uint8))
    return any(
        bool((rows[start : start + chunk_rows] == _NEGATIVE_ZERO).any())
        for start in range(0, rows.shape[0], chunk_rows)
    )


def stored_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` as a state dict or a checkpoint stores it: an E8M0 one as its uint8 bytes
    (``E8M0_STORED``, the same bits), any other as it is."""
    return scale.view(E8M0_STORED) if scale.dtype == torch.float8_e8m0fnu else scale


def canonicalize_fp8_(name: str, weight: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> None:
    """Make an e4m3fn ``weight`` canonical in place, refusing NaN before changing a byte."""
    check_fp8_finite(name, weight, chunk_rows)
    positive_zero_(weight, chunk_rows)


def _rows(bits: torch.Tensor) -> torch.Tensor:
    return bits.reshape(-1, bits.shape[-1]) if bits.dim() > 1 else bits.view(1, -1)


def _scale_layouts(shape: tuple[int, ...]) -> set[tuple[int, ...]]:
    """The layouts a checkpoint may store a scale of ``shape`` in: itself, per channel also
    ``[N]``, and one value as ``[]``, ``[1]`` or ``[1, 1]``. Nothing else: a ``[1, N]``
    scale is one per input channel, which read per output channel would be wrong."""
    layouts = {shape, shape[:-1] if shape[-1:] == (1,) else shape}
    if all(extent == 1 for extent in shape):
        layouts |= {(), (1,), (1, 1)}
    return layouts


def canonical_scale(name: str, scale: object, shape: tuple[int, ...]) -> torch.Tensor:
    """``scale`` as canonical fp32 of ``shape``, from the layouts checkpoints use (``[N, 1]``
    or ``[N]`` per channel; ``[]``, ``[1]`` or ``[1, 1]`` per tensor), refusing values that
    are not positive and finite (a zero or NaN scale is a corrupt checkpoint)."""
    tensor = check_tensor(name, scale, dtypes=STORED_SCALE_DTYPES)
    if tuple(tensor.shape) not in _scale_layouts(shape):
        raise reject(name, tensor, f"fp32 scales of shape {list(shape)}")
    values = tensor.to(torch.float32).reshape(shape)
    check_positive_finite(name, values)
    return values.contiguous()


def check_positive_finite(name: str, scale: torch.Tensor) -> None:
    """Refuse a scale holding zero, a negative, NaN or Inf: a corrupt checkpoint's, which
    would give zero or NaN outputs."""
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise reject(name, scale, "positive, finite scales")


def check_finite(name: str, weight: torch.Tensor, chunk_rows: int = CHUNK_ROWS) -> None:
    """Refuse a high-precision weight holding NaN or Inf, before it is quantized. The scan is
    a min/max reduction per chunk of rows, which allocates nothing the size of the weight
    (NaN propagates through both, and an Inf is the max or the min); only a failure builds
    masks, to say where."""
    for start in range(0, weight.shape[0], chunk_rows):
        chunk = weight[start : start + chunk_rows]
        if chunk.numel() == 0:
            continue
        low, high = torch.aminmax(chunk)
        if not bool(torch.isfinite(low) & torch.isfinite(high)):
            nan = int(torch.isnan(chunk).sum())
            inf = int(torch.isinf(chunk).sum())
            row = start + int((~torch.isfinite(chunk)).any(dim=1).nonzero()[0])
            expected = (
                f"finite values; row {row} has NaN or Inf ({nan} NaN, {inf} Inf in its chunk)"
            )
            raise reject(name, weight, expected)


def canonical_dtype(config: QuantConfig) -> Dtype:
    """The format a config's weight is stored in: int8, or e4m3fn for every FP8 config."""
    return Dtype.INT8 if config.weight.dtype is Dtype.INT8 else CANONICAL_FP8


def canonical_scale_dtype(config: QuantConfig) -> torch.dtype:
    """The dtype a config's weight scale is stored in: fp32, or float8_e8m0fnu (MX)."""
    return torch_dtype(config.weight.scale.dtype)


def quantize_canonical(
    weight: torch.Tensor,
    config: QuantConfig,
    *,
    chunk_rows: int = CHUNK_ROWS,
    reduce_amax: AmaxReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A high-precision ``weight [N, K]`` in canonical form: (FP8 or int8 weight, scale).

    Quantized a chunk of rows at a time, so the fp32 working copy is at most
    ``chunk_rows`` rows. ``reduce_amax``, when given, maps each scale group's fp32 amax
    (``[ceil(N/r), ceil(K/c)]`` for ``config.weight_block`` ``(r, c)``) to the amax
    the scales are computed from: a tensor-parallel shard passes an all-reduce (MAX), so
    that its scales are the whole layer's.
    """
    fmt = canonical_dtype(config)
    q, scale = quantize_in_chunks(
        weight,
        config.weight_block,
        fmt,
        chunk_rows=chunk_rows,
        scale_dtype=config.weight.scale.dtype,
        reduce_amax=reduce_amax,
    )
    if fmt is CANONICAL_FP8:
        positive_zero_(q, chunk_rows)
    return q, scale.reshape(config.weight_scale_shape).to(canonical_scale_dtype(config))


def one_tensor_scale(
    weight: torch.Tensor,
    shards: tuple[int, ...],
    scales: torch.Tensor,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused weight whose shards (of ``shards`` rows each) were saved with a scale each,
    with one per-tensor scale ``[1]``: the largest. The other shards' FP8 values are
    requantized to it (one more rounding, as engines do) in a new tensor, so ``weight`` is
    unchanged if this stops halfway; shards already at the largest keep their bytes."""
    largest = scales.amax()
    merged = weight.clone()
    start = 0
    for rows, shard_scale in zip(shards, scales.tolist(), strict=True):
        if shard_scale != float(largest):
            for first in range(start, start + rows, chunk_rows):
                chunk = merged[first : min(first + chunk_rows, start + rows)]
                chunk.copy_(quantize_static(chunk.float() * shard_scale, largest, CANONICAL_FP8))
            positive_zero_(merged[start : start + rows], chunk_rows)
        start += rows
    return merged, largest.reshape(1)


def dequantize_weight(
    weight: torch.Tensor, scale: torch.Tensor, config: QuantConfig
) -> torch.Tensor:
    """The fp32 ``[N, K]`` values a canonical (weight, scale) pair encodes."""
    return dequantize(
        weight, scale.reshape(()) if scale.numel() == 1 else scale, config.weight_block
    )
