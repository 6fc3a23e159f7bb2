"""e4m3fn -> e4m3fnuz, for OCP weights on MI300-series GPUs (gfx94x).

The two formats share a bit layout but e4m3fnuz's exponent bias is one higher, so the same
byte means half the value: reinterpreting and doubling the scale keeps every product
exact. Byte 0x80 is -0 in e4m3fn but NaN in e4m3fnuz, and e4m3fn's NaN bytes (0x7F, 0xFF)
read as +-240 in e4m3fnuz. A canonical weight has neither (loading refuses them), so it
is reinterpreted without a copy.
"""

from __future__ import annotations

import torch

from kernelpick.kernels._torch import reject

__all__ = ["as_fnuz"]


def as_fnuz(
    weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A canonical e4m3fn weight (no -0, no NaN byte) read as e4m3fnuz: the same bytes,
    with doubled scales. No copy of the weight is made."""
    if scale.dtype == torch.float8_e8m0fnu:
        # torch has no arithmetic on E8M0; no catalog row pairs MX scales with e4m3fnuz.
        expected = "fp32 scales: an e4m3fnuz device (gfx94x) doubles them, which E8M0 cannot do"
        raise reject("weight_scale", scale, expected)
    doubled = None if input_scale is None else input_scale * 2.0
    return weight.view(torch.float8_e4m3fnuz), scale * 2.0, doubled
