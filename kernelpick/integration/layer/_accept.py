"""What a tensor must be to reach a layer, whoever's loader carries it: kernelpick's own,
or an engine's, which is handed the tensor only once it passed. Each check takes the
tensor and the shape it must have (a rank's part, or the whole layer's tensor an engine
narrows itself) and returns the value to copy. A scale's check is ``canonical_scale``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelpick.integration.layer._state import LayerState
from kernelpick.kernels._canonical import (
    CANONICAL_FP8,
    canonical_dtype,
    check_fp8_finite,
)
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = ["Accept", "high_precision", "quantized_weight"]

# Checks a loaded tensor against the shape it must have and returns what to copy.
Accept = Callable[[str, torch.Tensor, tuple[int, ...]], torch.Tensor]

_PRE_QUANTIZED = "checkpoint_format='pre_quantized' (or 'fp8'; the pre-quantized path)"
_ONLINE = "checkpoint_format='high_precision' (online quantization)"


def high_precision(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The float ``weight`` of the online path. FP8 and integer tensors are refused: they
    are quantized already, and casting them would drop their scales."""
    check_tensor(label, tensor)
    if tensor.is_complex():
        raise reject(label, tensor, "a real floating-point dtype")
    if tensor.dtype.itemsize == 1 or not tensor.is_floating_point():
        raise reject(
            label, tensor, f"a high-precision float tensor; a quantized weight belongs to "
            f"{_PRE_QUANTIZED}, which loads its scales too",
        )  # fmt: skip
    if tuple(tensor.shape) != shape:
        raise reject(label, tensor, f"shape {list(shape)}")
    return tensor


def quantized_weight(state: LayerState) -> Accept:
    """The quantized ``weight`` of the pre-quantized path: e4m3fn without NaN bytes (its
    negative zeros become +0 when the layer is processed), or int8 for an int8 scheme (any
    of -128..127: compressed-tensors' symmetric int8 reaches -128)."""
    fmt = canonical_dtype(state.config)
    dtype = torch_dtype(fmt)
    layout = "the canonical FP8 layout" if fmt is CANONICAL_FP8 else "an int8 scheme's weight"

    def accept(label: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        check_tensor(label, tensor)
        if tensor.dtype != dtype:
            hint = f"; a high-precision weight belongs to {_ONLINE}"
            wanted = f"dtype {str(dtype).removeprefix('torch.')} ({layout})"
            floating = tensor.is_floating_point() and tensor.dtype.itemsize > 1
            raise reject(label, tensor, wanted + (hint if floating else ""))
        if tuple(tensor.shape) != shape:
            raise reject(label, tensor, f"shape {list(shape)}")
        if fmt is CANONICAL_FP8:
            check_fp8_finite(label, tensor)
        return tensor

    return accept
