"""An independent float64 reading of compressed-tensors' pack-quantized tensors, written
from the format's description (not from kernelpick's packer): the numerics the integer
weight-only kernels are held to."""

from __future__ import annotations

import torch

from kernelpick.core import QuantConfig

__all__ = ["dequantize_fp64", "emulated_int_weight"]


def _values(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    # Element j of a row: bits (j * bits) % 32 .. of word (j * bits) // 32, stored + 2^(b-1).
    words = packed.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty((packed.shape[0], k), dtype=torch.float64)
    for j in range(k):
        word, bit = divmod(j * bits, 32)
        out[:, j] = ((words[:, word] >> bit) & ((1 << bits) - 1)).to(torch.float64)
    return out - (1 << (bits - 1))


def emulated_int_weight(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    bits: int,
    k: int,
    group: int,
) -> torch.Tensor:
    """The float64 ``[N, K]``: ``scale[:, g] * (q - zero[:, g])`` with ``g`` the column's
    group: ``g_idx[k]`` where given, else ``k // group`` (``group`` -1: one per channel)."""
    q = _values(packed, bits, k)
    column = torch.arange(k)
    groups = (
        g_idx.to(torch.int64)
        if g_idx is not None
        else (column // group if group > 0 else column * 0)
    )
    zero = 0.0 if zero_point is None else zero_point.to(torch.float64)[:, groups]
    return scale.to(torch.float64)[:, groups] * (q - zero)


def dequantize_fp64(tensors: dict[str, torch.Tensor], config: QuantConfig) -> torch.Tensor:
    """The float64 ``[N, K]`` of a layer's pack-quantized ``tensors`` by their format names,
    the zero points read from their words along N here too."""
    n, k = config.weight_shape
    bits = config.weight.dtype.bits
    packed_zero = tensors.get("weight_zero_point")
    zero = None if packed_zero is None else _values(packed_zero.t(), bits, n).t()
    group = config.weight_block[1] if config.weight_scale_shape[1] > 1 else -1
    return emulated_int_weight(
        tensors["weight_packed"], tensors["weight_scale"], zero, tensors.get("weight_g_idx"),
        bits, k, group,
    )  # fmt: skip
