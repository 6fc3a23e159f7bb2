"""FP8 and int8 quantization with torch ops: activations per call, weights once after loading.

One formula everywhere: per group, ``scale = amax / qmax`` clamped below at
``1 / (qmax * 512)`` so an all-zero group does not divide by zero, then
``clamp(x / scale, -qmax, qmax)`` cast to the format; int8 rounds half to even first, as
a cast to an integer would truncate. The clamp comes before the cast because
out-of-range casts differ by format (e4m3fn saturates, e4m3fnuz gives NaN, e5m2 gives
inf), and reductions run in fp32 because CPU FP8 tensors cannot reduce (torch 2.13 has
no FP8 ``amax`` or ``sum`` on the CPU).

E8M0 scales (the MX formats) are powers of two: ``2^(floor(log2(amax)) - emax)``, with
``emax = floor(log2(qmax))`` (8 for e4m3fn), as the OCP Microscaling spec v1.0 computes
the shared exponent; values beyond range saturate to +-qmax.

Group shapes here are ``(rows, cols)`` over the tensor as given, ``-1`` for a whole
dimension: per-token on an activation ``[M, K]`` is ``(1, -1)``; per-channel on a weight
``[N, K]`` is also ``(1, -1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._torch import torch_dtype

__all__ = [
    "CHUNK_ROWS",
    "E8M0_EXPONENTS",
    "SCALE_FLOOR_DIVISOR",
    "AmaxReduce",
    "dequantize",
    "expand_scales",
    "quantize",
    "quantize_in_chunks",
    "quantize_per_tensor",
    "quantize_per_token",
    "quantize_static",
    "reduced_amax",
    "scale_floor",
]

# Takes every group's fp32 amax and returns the amax to scale with (see quantize_in_chunks).
AmaxReduce = Callable[[torch.Tensor], torch.Tensor]

# Rows of a weight quantized at a time: the fp32 working copy is at most this many rows.
CHUNK_ROWS = 512

# The clamp floor is 1 / (fp8_max * 512), as in vLLM's per-token FP8 quantizer
# (docs/design.md#quantization-numerics). The cupy quantizer reads it from here too.
SCALE_FLOOR_DIVISOR = 512.0


# The exponents a float8_e8m0fnu holds: 2^-127 .. 2^127 (byte 0xFF is NaN).
E8M0_EXPONENTS = (-127, 127)


def scale_floor(fp8: Dtype) -> float:
    """The least scale of a group, so that an all-zero group does not divide by zero."""
    return 1.0 / (fp8.quant_max * SCALE_FLOOR_DIVISOR)


def _quant_max(fmt: Dtype, like: torch.Tensor) -> torch.Tensor:
    """The format's largest value as a 0-dim fp32 tensor on ``like``'s device.

    Scales divide by this rather than by a Python number: CUDA torch computes
    ``tensor / python_scalar`` (and a division by a CPU 0-dim tensor) as
    ``tensor * reciprocal(scalar)`` (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu),
    which is 1 ulp off the exact quotient for about a third of amaxes and flips FP8 ties.
    A divisor on the data's own device is divided exactly on every device, as the cupy
    quantizer does."""
    # A fill on the device, not a copy from the host: no sync, and a CUDA graph captures it.
    return torch.full((), fmt.quant_max, dtype=torch.float32, device=like.device)


def _scaled(t: torch.Tensor, scale: torch.Tensor, fp8: Dtype) -> torch.Tensor:
    """``t / scale`` in fp32, clamped to the FP8 range: one copy, then in place. A scale on
    another device moves to ``t``'s first: CUDA divides by a CPU 0-dim one inexactly."""
    limit = fp8.quant_max
    return t.to(torch.float32, copy=True).div_(scale.to(t.device)).clamp_(-limit, limit)


def _cast(t: torch.Tensor, scale: torch.Tensor, fmt: Dtype) -> torch.Tensor:
    """``t / scale``, clamped to the format's range (int8: rounded half to even), cast."""
    scaled = _scaled(t, scale, fmt)
    if fmt is Dtype.INT8:
        scaled.round_()
    return scaled.to(torch_dtype(fmt))


def _power_of_two_scale(amax: torch.Tensor, fmt: Dtype) -> torch.Tensor:
    """The E8M0 scale of groups with largest magnitude ``amax`` (fp32), as fp32 values."""
    emax = math.floor(math.log2(fmt.quant_max))
    # frexp is exact: amax = mantissa * 2^exponent with mantissa in [0.5, 1), so
    # floor(log2(amax)) = exponent - 1. An all-zero group (frexp's exponent 0) gets
    # 2^(-1 - emax): any scale encodes its zeros exactly.
    exponent = torch.frexp(amax).exponent - 1 - emax
    low, high = E8M0_EXPONENTS
    return torch.ldexp(torch.ones_like(amax), exponent.clamp_(low, high))


def _row_scale(t: torch.Tensor, fp8: Dtype) -> torch.Tensor:
    # The amax is exact in the input's own dtype, so it is taken there (fewer bytes read).
    amax = t.abs().amax(dim=-1, keepdim=True).float()
    return (amax / _quant_max(fp8, amax)).clamp_(min=scale_floor(fp8))


def quantize_per_token(x: torch.Tensor, fp8: Dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token: ``x [M, K]`` -> (FP8 ``[M, K]``, fp32 scales ``[M, 1]``)."""
    scale = _row_scale(x, fp8)
    return _cast(x, scale, fp8), scale


def quantize_per_tensor(x: torch.Tensor, fp8: Dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor: ``x`` -> (FP8, fp32 0-dim scale)."""
    amax = x.abs().amax().float()
    scale = (amax / _quant_max(fp8, amax)).clamp_(min=scale_floor(fp8))
    return _cast(x, scale, fp8), scale


def quantize_static(x: torch.Tensor, scale: torch.Tensor, fp8: Dtype) -> torch.Tensor:
    """Static per-tensor with a stored fp32 ``scale``: values beyond range are clamped."""
    return _cast(x, scale, fp8)


def _extents(group: tuple[int, int], shape: tuple[int, int]) -> tuple[int, int]:
    """A group's rows and columns over a tensor of ``shape``: -1 is the whole dimension,
    and so is a group larger than it (the same single group, without padding the tensor
    out to the group's size)."""
    rows, cols = group
    return (
        shape[0] if rows == -1 else min(rows, shape[0]),
        shape[1] if cols == -1 else min(cols, shape[1]),
    )


def expand_scales(
    scale: torch.Tensor, extents: tuple[int, int], shape: tuple[int, int]
) -> torch.Tensor:
    """Group scales ``[ceil(R/r), ceil(C/c)]`` of ``r x c`` groups (no -1: extents of the
    tensor's own) broadcast, or repeated, to ``[R, C]``."""
    rows, cols = extents
    out = scale
    if rows != 1 and out.shape[0] != 1:
        out = out.repeat_interleave(rows, dim=0)[: shape[0]]
    if cols != 1 and out.shape[1] != 1:
        out = out.repeat_interleave(cols, dim=1)[:, : shape[1]]
    return out


def _group_amax(values: torch.Tensor, extents: tuple[int, int]) -> torch.Tensor:
    rows, cols = extents
    height, width = values.shape
    grid = (-(-height // rows), -(-width // cols))
    # Zero padding leaves every group's amax unchanged.
    padded = torch.nn.functional.pad(
        values.abs(), (0, grid[1] * cols - width, 0, grid[0] * rows - height)
    )
    return padded.view(grid[0], rows, grid[1], cols).amax(dim=(1, 3))


def _group_scale(amax: torch.Tensor, fmt: Dtype, scale_dtype: Dtype) -> torch.Tensor:
    if scale_dtype is Dtype.FLOAT8_E8M0FNU:
        return _power_of_two_scale(amax, fmt)
    return (amax / _quant_max(fmt, amax)).clamp_(min=scale_floor(fmt))


def quantize(
    t: torch.Tensor, group: tuple[int, int], fmt: Dtype, scale_dtype: Dtype = Dtype.FLOAT32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any group shape over a 2-D ``t``: (``t`` in ``fmt``, fp32 scales
    ``[ceil(R/r), ceil(C/c)]``). With ``scale_dtype`` E8M0 the scales are powers of two,
    still returned as fp32 (exact in E8M0)."""
    shape = (t.shape[0], t.shape[1])
    extents = _extents(group, shape)
    values = t.float()
    scale = _group_scale(_group_amax(values, extents), fmt, scale_dtype)
    return _cast(values, expand_scales(scale, extents, shape), fmt), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: tuple[int, int]) -> torch.Tensor:
    """The fp32 values that ``quantize`` encoded: ``q * scale`` group by group (E8M0 scales
    widen to fp32 exactly)."""
    shape = (q.shape[0], q.shape[1])
    scale = scale.float()
    expanded = scale if scale.dim() == 0 else expand_scales(scale, _extents(group, shape), shape)
    return q.float() * expanded


def quantize_in_chunks(
    w: torch.Tensor,
    group: tuple[int, int],
    fp8: Dtype,
    *,
    chunk_rows: int = CHUNK_ROWS,
    scale_dtype: Dtype = Dtype.FLOAT32,
    reduce_amax: AmaxReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D ``w`` a chunk of rows at a time, so the fp32 working copy is at most
    ``chunk_rows`` rows. Same result as ``quantize(w, group, fp8, scale_dtype)``.

    ``reduce_amax`` receives every group's fp32 amax ``[ceil(R/r), ceil(C/c)]`` before
    the scales are computed, and returns the amax to use (same shape): a tensor-parallel
    shard all-reduces it, so that every rank scales a group split across ranks alike.
    """
    shape = (w.shape[0], w.shape[1])
    extents = _extents(group, shape)
    rows, cols = extents
    out = torch.empty(shape, dtype=torch_dtype(fp8), device=w.device)
    if reduce_amax is None and extents == (1, shape[1]) and scale_dtype is Dtype.FLOAT32:
        # Per channel, one pass: each chunk's rows are its own groups.
        row_scales = torch.empty((shape[0], 1), dtype=torch.float32, device=w.device)
        for start in range(0, shape[0], chunk_rows):
            chunk = w[start : start + chunk_rows]
            scale = row_scales[start : start + chunk_rows]
            scale.copy_(_row_scale(chunk, fp8))
            out[start : start + chunk_rows].copy_(_cast(chunk, scale, fp8))
        return out, row_scales
    # Two passes: every group's amax first (a group may span every row, or the amax may be
    # reduced with other devices'), then each chunk quantized with the final scales.
    spans = rows >= shape[0]  # one group spans every row: per tensor, or per column group
    step = chunk_rows if spans else max(rows, chunk_rows // rows * rows)
    chunks = [w[start : start + step] for start in range(0, shape[0], step)]
    if spans:
        amax = torch.stack([_group_amax(c.float(), (c.shape[0], cols))[0] for c in chunks]).amax(
            dim=0, keepdim=True
        )
    else:
        amax = torch.cat([_group_amax(c.float(), extents) for c in chunks])
    if reduce_amax is not None:
        amax = reduced_amax(reduce_amax, amax)
    scale = _group_scale(amax, fp8, scale_dtype)
    for index, chunk in enumerate(chunks):
        start, height = index * step, chunk.shape[0]
        own = scale if spans else scale[start // rows : -(-(start + height) // rows)]
        expanded = expand_scales(own, (height if spans else rows, cols), (height, shape[1]))
        out[start : start + height] = _cast(chunk.float(), expanded, fp8)
    return out, scale


def reduced_amax(reduce_amax: AmaxReduce, amax: torch.Tensor) -> torch.Tensor:
    """``reduce_amax(amax)``, checked to be fp32 of ``amax``'s shape."""
    reduced = reduce_amax(amax)
    if (
        not isinstance(reduced, torch.Tensor)
        or reduced.shape != amax.shape
        or reduced.dtype != torch.float32
    ):
        found = type(reduced).__name__
        if isinstance(reduced, torch.Tensor):
            found = f"{str(reduced.dtype).removeprefix('torch.')} {list(reduced.shape)}"
        raise InvalidValueError(
            "reduce_amax's result", found, f"an fp32 tensor of the amax's shape {list(amax.shape)}"
        )
    return reduced
