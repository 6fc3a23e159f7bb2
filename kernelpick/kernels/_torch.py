"""The bridge between core's names and torch: dtypes, and tensor checks before a launch."""

from __future__ import annotations

import torch

from kernelpick.core import Dtype, KernelInputError

__all__ = ["check_tensor", "reject", "torch_dtype"]


# A core Dtype's value is torch's attribute name for it.
_TORCH_DTYPES: dict[Dtype, torch.dtype] = {dtype: getattr(torch, dtype.value) for dtype in Dtype}


def torch_dtype(dtype: Dtype) -> torch.dtype:
    """The torch dtype a core ``Dtype`` names."""
    return _TORCH_DTYPES[dtype]


def reject(name: str, tensor: torch.Tensor, expected: str) -> KernelInputError:
    """The error for ``tensor`` (argument ``name``), which should have been ``expected``."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return KernelInputError(name, tuple(tensor.shape), dtype, str(tensor.device), expected)


def check_tensor(
    name: str,
    tensor: object,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``tensor`` if it is a dense tensor with data, of one of ``dtypes``, of ``shape`` (None
    matches any extent) and on ``device``; otherwise a ``KernelInputError`` naming what was
    expected. Sparse and meta tensors are refused whatever else is asked."""
    if not isinstance(tensor, torch.Tensor):
        raise KernelInputError(name, (), type(tensor).__name__, "-", "a torch.Tensor")
    if tensor.layout != torch.strided:
        raise reject(name, tensor, f"a dense (strided) tensor, not {tensor.layout}")
    if tensor.is_meta:
        raise reject(name, tensor, "a tensor with data (not on the meta device)")
    if dtypes is not None and tensor.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise reject(name, tensor, f"dtype {names}")
    if shape is not None and (
        tensor.dim() != len(shape)
        or any(
            want is not None and got != want for got, want in zip(tensor.shape, shape, strict=True)
        )
    ):
        wanted = ", ".join("*" if want is None else str(want) for want in shape)
        raise reject(name, tensor, f"shape [{wanted}]")
    if device is not None and tensor.device != device:
        raise reject(name, tensor, f"device {device}, where the kernel is bound")
    return tensor
