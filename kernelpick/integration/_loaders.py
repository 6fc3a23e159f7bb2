"""Weight loaders: ``param.weight_loader(param, loaded_weight, shard_id=None)``, as engines
call them, for each parameter ``create_weights`` registers.

A loader checks everything about the tensor it is handed before it writes a byte, so a
refused tensor leaves the parameter as it was. A fused layer (q/k/v, gate/up) loads one
shard at a time: ``shard_id`` indexes its ``output_partition_sizes``, and each shard's
scales go to the scale rows ``_shards`` gives it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol, cast

import torch

from kernelpick.core._errors import InvalidValueError, KernelInputError
from kernelpick.integration._shards import scale_rows
from kernelpick.integration._state import ALL_SHARDS, LayerState
from kernelpick.kernels._canonical import (
    CANONICAL_FP8,
    canonical_dtype,
    canonical_scale,
    check_fp8_finite,
)
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "WeightLoader",
    "high_precision_loader",
    "quantized_weight_loader",
    "scale_loader",
    "tracking",
    "weight_loader_of",
]

_PRE_QUANTIZED = "checkpoint_format='pre_quantized' (or 'fp8'; the pre-quantized path)"
_ONLINE = "checkpoint_format='high_precision' (online quantization)"


class WeightLoader(Protocol):
    """``weight_loader(param, loaded_weight, shard_id=None)``, as engines call it."""

    def __call__(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None: ...


def weight_loader_of(param: torch.Tensor) -> WeightLoader:
    """The loader ``create_weights`` attached to ``param`` (engines read the attribute)."""
    loader = getattr(param, "weight_loader", None)
    if not callable(loader):
        raise InvalidValueError("param", tuple(param.shape), "a weight set up by create_weights")
    return cast(WeightLoader, loader)


# Checks a loaded tensor for the rows it fills and returns what to copy into them.
Accept = Callable[[str, torch.Tensor, int], torch.Tensor]
# The rows of a parameter that a shard's weight rows (first, count) fill.
Rows = Callable[[int, int], tuple[int, int]]


def _same_rows(start: int, rows: int) -> tuple[int, int]:
    return start, rows


def _shard(state: LayerState, shard_id: object) -> tuple[int, int, int]:
    """(first row, rows, the id recorded as loaded) of ``shard_id``."""
    sizes = state.shards
    if shard_id is None:
        return 0, sum(sizes), ALL_SHARDS
    if isinstance(shard_id, int) and not isinstance(shard_id, bool) and 0 <= shard_id < len(sizes):
        return sum(sizes[:shard_id]), sizes[shard_id], shard_id
    raise InvalidValueError("shard_id", shard_id, f"None or 0..{len(sizes) - 1}")


def _loader(
    state: LayerState,
    own: torch.Tensor,
    name: str,
    accept: Accept,
    per_shard: bool,
    rows_of: Rows = _same_rows,
) -> WeightLoader:
    """A loader for ``own``, the parameter ``name`` of a layer. ``per_shard`` parameters
    hold one value per shard (per-tensor scales); the others the rows ``rows_of`` gives a
    shard's weight rows (the same rows, or its rows of block scales). The loader holds
    ``own`` weakly: it is an attribute of ``own``, and a cycle would keep a replaced
    high-precision weight alive until the garbage collector runs."""
    own_ref = weakref.ref(own)

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None:
        label = f"{state.name}.{name}" + ("" if shard_id is None else f"[shard {shard_id}]")
        if param is not own_ref():
            raise InvalidValueError(
                "param", tuple(getattr(param, "shape", ())),
                f"{state.name}.{name}, the parameter this loader was made for",
            )  # fmt: skip
        start, rows, loaded = _shard(state, shard_id)
        if not per_shard:
            start, rows = rows_of(start, rows)
        if not isinstance(loaded_weight, torch.Tensor):
            kind = type(loaded_weight).__name__
            raise KernelInputError(label, (), kind, "-", "a torch.Tensor")
        value = accept(label, loaded_weight, rows)
        with torch.no_grad():
            if not per_shard:
                param[start : start + rows].copy_(value)
            elif shard_id is None:
                param.fill_(float(value.reshape(())))
            else:
                param[shard_id].copy_(value.reshape(()))
        state.loaded.setdefault(name, set()).add(loaded)

    return weight_loader


def tracking(state: LayerState, name: str, loader: WeightLoader) -> WeightLoader:
    """An engine's own loader, recording which shards it loaded so that processing can
    refuse a layer with shards never loaded."""

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None:
        loader(param, loaded_weight, shard_id)
        state.loaded.setdefault(name, set()).add(ALL_SHARDS if shard_id is None else shard_id)

    return weight_loader


def high_precision_loader(state: LayerState, own: torch.Tensor) -> WeightLoader:
    """The float ``weight [N, K]`` of the online path. FP8 and integer tensors are
    refused: they are quantized already, and casting them would drop their scales."""
    width = state.config.k

    def accept(label: str, tensor: torch.Tensor, rows: int) -> torch.Tensor:
        check_tensor(label, tensor)
        if tensor.is_complex():
            raise reject(label, tensor, "a real floating-point dtype")
        if tensor.dtype.itemsize == 1 or not tensor.is_floating_point():
            raise reject(
                label, tensor, f"a high-precision float tensor; a quantized weight belongs to "
                f"{_PRE_QUANTIZED}, which loads its scales too",
            )  # fmt: skip
        if tuple(tensor.shape) != (rows, width):
            raise reject(label, tensor, f"shape [{rows}, {width}]")
        return tensor

    return _loader(state, own, "weight", accept, per_shard=False)


def quantized_weight_loader(state: LayerState, own: torch.Tensor) -> WeightLoader:
    """The quantized ``weight [N, K]`` of the pre-quantized path: e4m3fn without NaN bytes
    (its negative zeros become +0 when the layer is processed), or int8 for an int8
    scheme (any of -128..127: compressed-tensors' symmetric int8 reaches -128)."""
    width = state.config.k
    fmt = canonical_dtype(state.config)
    dtype = torch_dtype(fmt)
    layout = "the canonical FP8 layout" if fmt is CANONICAL_FP8 else "an int8 scheme's weight"

    def accept(label: str, tensor: torch.Tensor, rows: int) -> torch.Tensor:
        check_tensor(label, tensor)
        if tensor.dtype != dtype:
            hint = f"; a high-precision weight belongs to {_ONLINE}"
            wanted = f"dtype {str(dtype).removeprefix('torch.')} ({layout})"
            floating = tensor.is_floating_point() and tensor.dtype.itemsize > 1
            raise reject(label, tensor, wanted + (hint if floating else ""))
        if tuple(tensor.shape) != (rows, width):
            raise reject(label, tensor, f"shape [{rows}, {width}]")
        if fmt is CANONICAL_FP8:
            check_fp8_finite(label, tensor)
        return tensor

    return _loader(state, own, "weight", accept, per_shard=False)


def scale_loader(state: LayerState, own: torch.Tensor, name: str, per_shard: bool) -> WeightLoader:
    """A scale: one per output row (``[rows, 1]`` or ``[rows]``), one row per ``b`` output
    rows per block (``[ceil(rows / b), ceil(K / b)]``) or, ``per_shard``, one per shard.
    fp32, bf16 and fp16 widen to fp32 exactly; zero, negative or NaN is refused."""
    columns = state.config.weight_scale_shape[1:]

    def accept(label: str, tensor: torch.Tensor, rows: int) -> torch.Tensor:
        return canonical_scale(label, tensor, (1,) if per_shard else (rows, *columns))

    def rows_of(start: int, rows: int) -> tuple[int, int]:
        return scale_rows(state.config, start, rows)

    return _loader(state, own, name, accept, per_shard, rows_of)
