"""What this host's CPU build of torch refuses, for the tests that run device families on it.

A CPU computes in e4m3fn (``DeviceCaps.fp8_format``), so no selection puts e4m3fnuz on a CPU
tensor; the tests do, to run the ROCm families' math (gfx94x is e4m3fnuz) on CPU tensors.
torch's CPU ``_scaled_mm`` takes tensor-wise scales through oneDNN on an AMX CPU, and oneDNN
refuses e4m3fnuz operands ("itensor_view_from_dense expects ... fp8"); its fallback, used
elsewhere and for row-wise scales, takes them. Which one a host has is probed, not guessed.
"""

from __future__ import annotations

import functools

import pytest
import torch

from kernelpick.core import Dtype
from kernelpick.kernels import LAUNCHES
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, TensorwiseScaledMM

__all__ = ["FNUZ_REFUSED", "refuses_fnuz", "skip_where_fnuz_is_refused"]

# The families that call torch._scaled_mm with 0-dim (tensor-wise) scales.
_TENSORWISE_FAMILIES = frozenset({TensorwiseScaledMM, ChannelwiseUnfused})
FNUZ_REFUSED = "this CPU's tensor-wise torch._scaled_mm (oneDNN on AMX) refuses e4m3fnuz operands"


@functools.cache
def _tensorwise_scaled_mm_takes_fnuz() -> bool:
    a = torch.zeros(16, 16).to(torch.float8_e4m3fnuz)
    one = torch.ones((), dtype=torch.float32)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except RuntimeError:
        return False
    return True


def refuses_fnuz(kernel: str, fp8: Dtype) -> bool:
    """Whether ``kernel``'s family, given ``fp8`` operands on a CPU tensor, cannot run here."""
    return (
        fp8 is Dtype.FLOAT8_E4M3FNUZ
        and LAUNCHES[kernel].family in _TENSORWISE_FAMILIES
        and not _tensorwise_scaled_mm_takes_fnuz()
    )


def skip_where_fnuz_is_refused(kernel: str, fp8: Dtype) -> pytest.MarkDecorator:
    """A mark skipping the case, with the reason, where ``refuses_fnuz(kernel, fp8)``."""
    return pytest.mark.skipif(refuses_fnuz(kernel, fp8), reason=FNUZ_REFUSED)
