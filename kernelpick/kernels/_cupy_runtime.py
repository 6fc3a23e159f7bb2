"""The one place cupy is touched: import, compile, launch, behind a small typed surface.

cupy has no type information and its first real use raises without a GPU, so it is
imported lazily, inside these functions only, never at ``import kernelpick``. Compiled
kernels are cached per (source, device). A launch runs inside the device's context on
torch's current stream (wrapped as a cupy ``ExternalStream``), so it is ordered with torch
work and is captured with it in a CUDA graph.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from kernelpick.core import InvalidValueError
from kernelpick.kernels._torch import reject

__all__ = ["Grid", "cuda_device", "cupy_usable", "launch"]

# cupy's CUDA errors subclass RuntimeError; a missing libcuda or libnvrtc is an OSError.
_CUPY_ERRORS = (ImportError, RuntimeError, OSError)


def _cupy() -> Any:
    return importlib.import_module("cupy")


def cupy_usable() -> bool:
    """Whether cupy imports and a CUDA driver answers it with at least one device."""
    try:
        if importlib.util.find_spec("cupy") is None:
            return False
        count = _cupy().cuda.runtime.getDeviceCount()
    except _CUPY_ERRORS:
        return False
    return isinstance(count, int) and count > 0


def cuda_device(name: str, tensor: torch.Tensor) -> torch.device:
    """The CUDA device ``tensor`` lives on; any other device is refused by ``name``."""
    if tensor.device.type != "cuda":
        raise reject(name, tensor, "a CUDA tensor (the cupy kernels run on NVIDIA GPUs)")
    return tensor.device


@attrs.frozen
class Grid:
    """A raw kernel launch's geometry: grid and block dimensions (x, y, z). Not
    ``kernelpick.kernels.Launch``, the launch table's row for a catalog id."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@functools.lru_cache(maxsize=256)
def _compiled(name: str, source: str, device_index: int) -> Any:
    cupy = _cupy()
    with cupy.cuda.Device(device_index):
        # NVRTC: no include path is needed, the source decodes its own element types.
        kernel = cupy.RawKernel(source, name, options=("--std=c++14",))
        kernel.compile()
    return kernel


# Scalars are numpy-typed, so each matches its C parameter's width exactly.
Arg = torch.Tensor | None | np.int32 | np.int64 | np.float32


def _argument(value: Arg) -> Any:
    # cupy has no fp8 or bf16 dtype: tensors travel as raw device pointers, None as NULL.
    if isinstance(value, torch.Tensor):
        return np.uint64(value.data_ptr())
    if value is None:
        return np.uint64(0)
    return value


def launch(
    name: str,
    source: str,
    geometry: Grid,
    args: Sequence[Arg],
    device: torch.device,
) -> None:
    """Compile ``source`` once per device, then run kernel ``name`` on torch's current
    stream of ``device``. ``args`` are tensors (passed as pointers) and numpy scalars."""
    if device.type != "cuda" or device.index is None:
        raise InvalidValueError("device", str(device), "an indexed CUDA device such as cuda:0")
    cupy = _cupy()
    kernel = _compiled(name, source, device.index)
    with cupy.cuda.Device(device.index), _torch_stream(cupy, device):
        # A RawKernel launches on cupy's current stream: the context above makes that
        # torch's current stream.
        kernel(geometry.grid, geometry.block, tuple(_argument(a) for a in args))


def _torch_stream(cupy: Any, device: torch.device) -> Any:
    """torch's current stream on ``device`` as a cupy stream (usable as a context)."""
    stream = torch.cuda.current_stream(device)
    if hasattr(cupy.cuda.Stream, "from_external"):  # cupy >= 14: the CUDA stream protocol
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, device.index)
