"""Weight loaders: ``param.weight_loader(param, loaded_weight, shard_id=None)``, as engines
call them, for each parameter ``create_weights`` registers.

A loader checks everything about the tensor it is handed before it writes a byte, so a
refused tensor leaves the parameter as it was. A fused layer (q/k/v, gate/up) loads one
shard at a time: ``shard_id`` indexes its ``output_partition_sizes`` (vLLM's ``"q"``,
``"k"`` and ``"v"`` name the three shards of a QKV layer), and each shard's scales go to
the scale rows ``_shards`` gives it.

A tensor-parallel layer's loader takes the whole checkpoint tensor and narrows it to this
rank's part itself, along the dimension its style splits (``param_dims`` says which
dimension of each parameter is the output and which the input, as engines read them).
A parameter without that dimension (a row-parallel layer's per-channel scales, any
per-tensor scale) is replicated: every rank loads all of it.

An engine's own loader (vLLM's, which narrows by ``output_dim`` and ``input_dim`` itself)
is wrapped, never trusted: each tensor passes the same checks first, against the whole
layer's checkpoint shape (``CheckpointShape``), and the engine's loader is handed the
checked value, in the parameter's dtype, so nothing it casts can change what the tensor
means. Once a layer is processed, every loader of it refuses: its tensors are final.
The call protocol, shard ids and the engine wrapper are ``_loader_calls``'; an act-order
layer's ``weight_g_idx`` loaders are ``_int_loaders``'.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from kernelpick.integration.layer._accept import (
    Check,
    float_weight_check,
    scale_check,
    weight_check,
)
from kernelpick.integration.layer._int_form import int_check
from kernelpick.integration.layer._int_loaders import g_idx_engine_loader, g_idx_loader
from kernelpick.integration.layer._loader_calls import (
    EngineLoader,
    WeightLoader,
    check_open,
    check_own,
    closed_loader,
    engine_loader,
    loaded_tensor,
    shard_index,
    weight_loader_of,
)
from kernelpick.integration.layer._plan import param_dims
from kernelpick.integration.layer._shards import per_tensor, scale_rows, zero_point_rows
from kernelpick.integration.layer._state import ALL_SHARDS, CheckpointShape, LayerState
from kernelpick.kernels import canonical_scale, reject

__all__ = [
    "EngineLoader",
    "WeightLoader",
    "closed_loader",
    "loader_for",
    "param_dims",
    "shard_index",
    "weight_loader_of",
]


# The rows of a parameter that a shard's weight rows (first, count) fill.
Rows = Callable[[int, int], tuple[int, int]]


def _shard(state: LayerState, shard_id: object) -> tuple[int, int, int]:
    """(first row, rows, the id recorded as loaded) of ``shard_id``."""
    index = shard_index(state, shard_id)
    if index == ALL_SHARDS:
        return 0, sum(state.shards), ALL_SHARDS
    return sum(state.shards[:index]), state.shards[index], index


def _narrowed(
    state: LayerState,
    dims: dict[str, int],
    label: str,
    tensor: torch.Tensor,
    local: list[int],
    pieces: Sequence[int],
) -> torch.Tensor:
    """This rank's part of the whole checkpoint ``tensor``, whose part has shape ``local``
    (the tensor as it is when the layer is not split, or the dimension replicated).

    ``pieces`` are the part's extents along dimension 0, one per shard it holds: a whole
    fused tensor (``[q; k; v]``, loaded with no shard id) is split at the whole shards'
    boundaries, and each shard narrowed on its own, as a column-parallel rank holds its
    part of every shard rather than a run of rows of the fused tensor."""
    tp = state.parallel
    dim = None if tp is None else dims.get(tp.split_dim)
    if tp is None or dim is None:
        return tensor
    whole = [*local]
    whole[dim] *= tp.world_size
    if tensor.dim() <= dim or tensor.shape[dim] != whole[dim]:
        raise reject(
            label, tensor, f"the whole layer's tensor, shape {whole}: this loader narrows it to "
            f"rank {tp.rank}'s part ({local}) itself",
        )  # fmt: skip
    if dim != 0 or len(pieces) == 1:
        return tensor.narrow(dim, tp.rank * local[dim], local[dim])
    parts, offset = [], 0
    for piece in pieces:
        parts.append(tensor.narrow(0, offset + tp.rank * piece, piece))
        offset += piece * tp.world_size
    return torch.cat(parts)


def _loader(
    state: LayerState,
    own: torch.Tensor,
    name: str,
    check: Check,
    per_shard: bool,
    rows_of: Rows,
) -> WeightLoader:
    """A loader for ``own``, the parameter ``name`` of a layer. ``per_shard`` parameters
    hold one value per shard (per-tensor scales); the others the rows ``rows_of`` gives a
    shard's weight rows (the same rows, or its rows of block scales), narrowed from the
    whole layer's tensor on a tensor-parallel rank. The loader holds
    ``own`` weakly: it is an attribute of ``own``, and a cycle would keep a replaced
    high-precision weight alive until the garbage collector runs."""
    own_ref = weakref.ref(own)
    dims = {} if per_shard else dict(state.plan.param(name).dims)
    columns = list(own.shape[1:])

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        label = state.label(name if shard_id is None else f"{name}[shard {shard_id}]")
        check_open(state, label)
        check_own(state, name, param, own_ref())
        start, rows, loaded = _shard(state, shard_id)
        pieces = [rows]
        if not per_shard:
            if loaded == ALL_SHARDS:  # the whole fused tensor: each shard's rows in turn
                firsts = [sum(state.shards[:i]) for i in range(len(state.shards))]
                pieces = [rows_of(f, n)[1] for f, n in zip(firsts, state.shards, strict=True)]
            start, rows = rows_of(start, rows)
        tensor = loaded_tensor(label, loaded_weight)
        part = _narrowed(state, dims, label, tensor, [rows, *columns], pieces)
        value = check(label, part, (1,) if per_shard else (rows, *columns))
        with torch.no_grad():
            if not per_shard:
                param[start : start + rows].copy_(value)
            elif loaded == ALL_SHARDS:
                param.fill_(float(value.reshape(())))
            else:
                param[loaded].copy_(value.reshape(()))
        state.loaded.setdefault(name, set()).add(loaded)

    return weight_loader


def _check_of(state: LayerState, name: str, pre_quantized: bool) -> Check:
    if name == "weight":
        return weight_check(state.config) if pre_quantized else float_weight_check
    if name == "weight_scale":
        return scale_check(state.config)
    if name == "input_scale":
        return canonical_scale  # fp32 wherever it is stored
    return int_check(state.config, name)  # an integer layer's packed tensors and g_idx


def loader_for(
    state: LayerState,
    own: torch.Tensor,
    name: str,
    *,
    pre_quantized: bool,
    engine: tuple[EngineLoader, CheckpointShape] | None = None,
) -> WeightLoader:
    """The loader of ``own``, a layer's parameter ``name``: kernelpick's own, or an
    ``engine``'s (its loader, and the whole layer it is handed tensors of) behind the same
    checks. ``weight`` is the float weight (online) or the canonical FP8 or int8 one
    (``pre_quantized``); ``weight_scale`` one per output row, one row per ``b`` output rows
    per block, or one per shard per tensor; ``input_scale`` one per shard; an integer
    layer's ``weight_packed`` one row per output row, its ``weight_zero_point`` one row
    per word of packed output rows, its ``weight_g_idx`` one per layer."""
    per_shard = name == "input_scale" or (name == "weight_scale" and per_tensor(state.config))
    check = _check_of(state, name, pre_quantized)
    if name == "weight_g_idx":
        if engine is not None:
            return g_idx_engine_loader(state, check, *engine)
        return g_idx_loader(state, own, check)
    if engine is not None:
        return engine_loader(state, name, check, per_shard, *engine)

    def rows_of(start: int, rows: int) -> tuple[int, int]:
        if name == "weight_zero_point":
            return zero_point_rows(state.config, start, rows)
        if name == "weight_scale":
            return scale_rows(state.config, start, rows)
        return (start, rows)

    return _loader(state, own, name, check, per_shard, rows_of)
