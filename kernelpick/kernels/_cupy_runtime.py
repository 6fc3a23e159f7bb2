"""The one place cupy is touched: import, compile, launch, behind a small typed surface.

cupy has no type information and its first real use raises without a GPU, so it is
imported lazily, inside these functions only, never at ``import kernelpick``. Compiled
kernels are cached per (source, device). A launch runs inside the device's context on
torch's current stream (wrapped as a cupy stream), so it is ordered with torch work and
is captured with it in a CUDA graph.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from kernelpick.core import InvalidValueError
from kernelpick.kernels._torch import reject

__all__ = ["HALF_DTYPES", "Grid", "cuda_device", "cupy_unusable_reason", "cupy_usable", "launch"]

LOGGER = logging.getLogger("kernelpick.kernels")

# All RuntimeError: cupy's CUDA errors, NVRTC's (NVRTCError), and a library cupy cannot
# find (cupy 14: cuda.pathfinder's DynamicLibNotFoundError; cupy 13: "CuPy failed to
# load ..."). ctypes' own loading raises OSError.
_CUPY_ERRORS = (ImportError, RuntimeError, OSError)

# NVRTC's options for every cupy kernel here, and for the probe's kernel: the smallest
# that proves NVRTC loads and compiles.
_NVRTC_OPTIONS = ("--std=c++14",)
_PROBE_SOURCE = 'extern "C" __global__ void kp_probe(float* out) { out[threadIdx.x] = 0.0f; }'


def _cupy() -> Any:
    return importlib.import_module("cupy")


def cupy_usable() -> bool:
    """Whether the cupy kernels can run here (``cupy_unusable_reason`` is None)."""
    return cupy_unusable_reason() is None


@functools.cache
def cupy_unusable_reason() -> str | None:
    """Why the cupy kernels cannot run in this process, or None when they can: cupy
    imports, a CUDA driver answers it with at least one device, and NVRTC (which compiles
    every cupy kernel at first use) compiles a kernel. Probed once per process; the reason
    is logged to ``kernelpick.kernels``."""
    reason, level = _unusable_reason()
    if reason is not None:
        LOGGER.log(level, "cupy is not usable: %s", reason)
    return reason


def _unusable_reason() -> tuple[str | None, int]:
    """The reason and the level it is logged at: no cupy or no GPU is the ordinary case of
    a CPU host (debug); a GPU that cupy sees but cannot compile for is a broken install."""
    try:
        if importlib.util.find_spec("cupy") is None:
            return "cupy is not installed", logging.DEBUG
        cupy = _cupy()
        count = cupy.cuda.runtime.getDeviceCount()
    except _CUPY_ERRORS as error:
        return f"no CUDA driver answers cupy ({_first_line(error)})", logging.DEBUG
    if not isinstance(count, int) or count < 1:
        return "the CUDA driver sees no device", logging.DEBUG
    try:
        compiled = _nvrtc_compiles(cupy.cuda.nvrtc)
    except _CUPY_ERRORS as error:
        return f"NVRTC cannot compile a kernel ({_first_line(error)})", logging.WARNING
    if not compiled:
        return "NVRTC cannot compile a kernel (it returned no PTX)", logging.WARNING
    return None, logging.DEBUG


def _nvrtc_compiles(nvrtc: Any) -> bool:
    # cupy's NVRTC binding itself: cupy's compiler front end asks the driver for the
    # device's arch first, and NVRTC needs neither a device nor a context.
    program = nvrtc.createProgram(_PROBE_SOURCE, "kp_probe.cu", (), ())
    try:
        nvrtc.compileProgram(program, _NVRTC_OPTIONS)
        return bool(nvrtc.getPTX(program))
    finally:
        nvrtc.destroyProgram(program)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    name = type(error).__name__
    return f"{name}: {text.splitlines()[0]}" if text else name


# The 16-bit float inputs the cupy kernels read with 16-byte loads.
HALF_DTYPES = (torch.bfloat16, torch.float16)


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
        kernel = cupy.RawKernel(source, name, options=_NVRTC_OPTIONS)
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
    # from_external (cupy 14, cupy#9567) needs __cuda_stream__ (torch 2.10, pytorch#163614).
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, device.index)
