"""e4m3fn -> e4m3fnuz, for OCP checkpoints on MI300-series GPUs (design §5).

The two formats share a bit layout but e4m3fnuz's exponent bias is one higher, so the same
byte means half the value: reinterpreting and doubling the scale keeps every product
exact. Byte 0x80 is -0 in e4m3fn but NaN in e4m3fnuz, so it becomes +0; e4m3fn's NaN bytes
(0x7F, 0xFF) would read as +-240 and become e4m3fnuz's only NaN, 0x80.
"""

from __future__ import annotations

import torch

from kernelpick.kernels._torch import check_tensor

__all__ = ["normalize_e4m3fn_to_fnuz"]

_FNUZ_NAN = -128  # 0x80 as int8
_MAGNITUDE = 0x7F


def normalize_e4m3fn_to_fnuz(
    weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same values in e4m3fnuz: (weight, 2 x scale, 2 x input_scale)."""
    check_tensor("weight", weight, dtypes=(torch.float8_e4m3fn,))
    bits = weight.view(torch.int8)
    nan = (bits & _MAGNITUDE) == _MAGNITUDE
    bits = torch.where(bits == _FNUZ_NAN, torch.zeros_like(bits), bits)
    bits = torch.where(nan, torch.full_like(bits, _FNUZ_NAN), bits)
    doubled = None if input_scale is None else input_scale * 2.0
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0, doubled
