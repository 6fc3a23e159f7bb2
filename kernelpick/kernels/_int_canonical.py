"""The canonical form of an integer weight-only layer (int4, int8), and the quantizer and
dequantizer every integer family is held to.

A layer's persistent tensors are compressed-tensors' ``pack-quantized`` ones (what
llmcompressor's W4A16 and W8A16 presets write and vLLM loads):

- ``weight``: int32 ``[N, ceil(K * bits / 32)]``. Each value ``q`` (-8..7, or -128..127)
  is stored unsigned as ``q + 2^(bits-1)``; element ``k`` of a row sits at bit
  ``(k * bits) % 32`` of word ``k * bits // 32`` (little-endian), and the unused bits of
  a short last word are zero.
- ``weight_scale``: fp32 ``config.weight_scale_shape``: ``[N, ceil(K/g)]`` per group,
  ``[N, 1]`` per channel (a checkpoint's bf16 or fp16 scales widen to fp32 exactly).
- ``zero_point``: int8 ``[N, ceil(K/g)]`` in the weight's own range, for an asymmetric
  config only (unpacked: the format packs it along N when it writes a checkpoint).
- ``g_idx``: int32 or int64 ``[K]``, for an act-order config only: the group of each
  column, every group naming exactly ``g`` columns (the last ``K mod g``).

A value reads ``scale * (q - zero_point)``. The quantizer is compressed-tensors'
round-to-nearest: symmetric scales ``amax / ((qmax - qmin) / 2)`` (amax / 7.5 for int4),
asymmetric ones ``(max - min) / (qmax - qmin)`` with ``zero = round(qmin - min / scale)``,
and ``q = round(clamp(w / scale + zero, qmin, qmax))`` (half to even).
"""

from __future__ import annotations

import torch

from kernelpick.core import Dtype, QuantConfig
from kernelpick.kernels._quantize import AmaxReduce, reduced_amax
from kernelpick.kernels._torch import check_tensor, reject

__all__ = [
    "dequantize_int",
    "dequantize_values",
    "group_order",
    "int_range",
    "pack_int",
    "pack_zero_points",
    "quantize_int",
    "unpack_int",
    "unpack_zero_points",
]

_WORD = 32


def int_range(dtype: Dtype) -> tuple[int, int]:
    """``(qmin, qmax)`` of a signed integer format: (-8, 7) for int4, (-128, 127) for int8."""
    half = 1 << (dtype.bits - 1)
    return (-half, half - 1)


def pack_int(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed values ``q [N, K]`` (int8) into the canonical int32 words."""
    n, k = q.shape
    per_word = _WORD // bits
    words = -(-k // per_word)
    unsigned = (q.to(torch.int32) + (1 << (bits - 1))).to(torch.int64)
    padded = torch.zeros((n, words * per_word), dtype=torch.int64, device=q.device)
    padded[:, :k] = unsigned
    shifts = torch.arange(per_word, device=q.device, dtype=torch.int64) * bits
    packed = (padded.view(n, words, per_word) << shifts).sum(dim=-1)
    # Words are unsigned 32-bit patterns: stored as int32 two's complement.
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_int(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """The canonical int32 words back to signed values ``[N, K]`` (int8)."""
    n, words = packed.shape
    per_word = _WORD // bits
    shifts = torch.arange(per_word, device=packed.device, dtype=torch.int32) * bits
    fields = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    unsigned = fields.reshape(n, words * per_word)[:, :k]
    return (unsigned - (1 << (bits - 1))).to(torch.int8)


def pack_zero_points(zero_point: torch.Tensor, bits: int) -> torch.Tensor:
    """Zero points ``[N, G]`` (int8) as a pack-quantized checkpoint stores them: packed
    along N, int32 ``[ceil(N * bits / 32), G]`` (compressed-tensors' ``packed_dim=0``)."""
    return pack_int(zero_point.t().contiguous(), bits).t().contiguous()


def unpack_zero_points(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """``pack_zero_points`` undone: int8 ``[N, G]``."""
    return unpack_int(packed.t().contiguous(), bits, n).t().contiguous()


def _depth(config: QuantConfig) -> int:
    # Columns per scale along K: weight_block is (rows, cols) of the stored [N, K] weight.
    return config.weight_block[1]


def _groups(values: torch.Tensor, depth: int) -> tuple[torch.Tensor, int]:
    # [N, K] as [N, G, depth], the last group padded with zeros (which leave amax, min and
    # max as they were: both bounds are taken with 0 in range, as compressed-tensors does).
    n, k = values.shape
    count = -(-k // depth)
    padded = values.new_zeros((n, count * depth))
    padded[:, :k] = values
    return padded.view(n, count, depth), count


def quantize_int(
    weight: torch.Tensor, config: QuantConfig, *, reduce_amax: AmaxReduce | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A float ``weight [N, K]`` to its canonical ``(weight, weight_scale, zero_point)``
    (zero_point None for a symmetric config), rounding to nearest in fp32. The caller has
    refused NaN and infinity.

    ``reduce_amax`` receives each group's bounds as one fp32 ``[2, N, G]`` tensor, its
    largest value and the negation of its smallest (both at least 0, so a MAX all-reduce
    combines them), and returns them combined: a row-parallel shard of a per-channel layer
    all-reduces them, so that every rank quantizes its part of a row on the whole row's
    grid (see ``quantize_canonical``)."""
    fmt = config.weight.dtype
    qmin, qmax = int_range(fmt)
    n, k = weight.shape
    grouped, _ = _groups(weight.detach().to(torch.float32), _depth(config))
    low = grouped.amin(dim=-1).clamp(max=0.0)
    high = grouped.amax(dim=-1).clamp(min=0.0)
    if reduce_amax is not None:
        high, negated_low = reduced_amax(reduce_amax, torch.stack([high, -low]))
        low = -negated_low
    tiny = torch.finfo(torch.float32).tiny
    if config.weight.zero_point is None:
        scale = (torch.maximum(-low, high) / ((qmax - qmin) / 2)).clamp(min=tiny)
        zero = torch.zeros_like(scale)
    else:
        scale = ((high - low) / (qmax - qmin)).clamp(min=tiny)
        zero = torch.round((qmin - low / scale).clamp(qmin, qmax))
    q = torch.round((grouped / scale.unsqueeze(-1) + zero.unsqueeze(-1)).clamp(qmin, qmax))
    values = q.view(n, -1)[:, :k].to(torch.int8)
    zero_point = None if config.weight.zero_point is None else zero.to(torch.int8)
    return pack_int(values, fmt.bits), scale, zero_point


def group_order(
    g_idx: torch.Tensor, config: QuantConfig, name: str = "g_idx", *, check: bool = True
) -> torch.Tensor:
    """The column order (int64 ``[K]``) that makes an act-order weight's groups contiguous,
    or ``KernelInputError`` (naming the tensor ``name``) where ``g_idx`` is not a
    permutation of whole groups: a group of the wrong size cannot be read as one, whatever
    kernel runs it. ``check`` False: the order only, of a ``g_idx`` already checked."""
    k = config.k
    depth = _depth(config)
    check_tensor(name, g_idx, dtypes=(torch.int32, torch.int64), shape=(k,))
    order = torch.argsort(g_idx.to(torch.int64), stable=True)
    if not check:
        return order
    expected = torch.arange(k, device=g_idx.device, dtype=torch.int64) // depth
    if not torch.equal(g_idx.to(torch.int64)[order], expected):
        count = -(-k // depth)
        raise reject(
            name, g_idx,
            f"each group 0..{count - 1} naming exactly {depth} of the K={k} columns (the "
            f"last {k - (count - 1) * depth}), as GPTQ's act-order writes it",
        )  # fmt: skip
    return order


def dequantize_values(
    q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, config: QuantConfig
) -> torch.Tensor:
    """The fp32 ``[N, K]`` of signed values ``q [N, K]`` whose groups are contiguous."""
    n, k = config.weight_shape
    grouped, _ = _groups(q.to(torch.float32), _depth(config))
    if zero_point is not None:
        grouped = grouped - zero_point.to(torch.float32).unsqueeze(-1)
    return (grouped * scale.unsqueeze(-1)).view(n, -1)[:, :k]


def dequantize_int(
    weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    config: QuantConfig,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fp32 ``[N, K]`` a canonical layer means, in the columns' stored order; with
    ``order`` (``group_order``), columns permuted so that each group is contiguous."""
    q = unpack_int(weight, config.weight.dtype.bits, config.k)
    return dequantize_values(q if order is None else q[:, order], scale, zero_point, config)
