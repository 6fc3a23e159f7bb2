"""The ``weight_g_idx`` loaders of an act-order integer layer: every shard of a fused
layer reads the same columns, so each shard's must be the one already loaded (GPTQ orders
the columns of q, k and v alike, from their one input); a shard whose order differs is
refused, never overwritten, whoever's loader copies it."""

from __future__ import annotations

import weakref

import torch

from kernelpick.integration.layer._accept import Check
from kernelpick.integration.layer._loader_calls import (
    EngineLoader,
    WeightLoader,
    check_open,
    check_own,
    engine_loader,
    loaded_tensor,
    shard_index,
)
from kernelpick.integration.layer._state import CheckpointShape, LayerState
from kernelpick.kernels import reject

__all__ = ["g_idx_engine_loader", "g_idx_loader"]


def g_idx_loader(state: LayerState, own: torch.Tensor, check: Check) -> WeightLoader:
    """An act-order layer's ``weight_g_idx [K]``: every shard of a fused layer reads the
    same columns, so each shard's must be the one already loaded (GPTQ orders the columns
    of q, k and v alike, from their one input); a shard whose order differs is refused,
    never overwritten."""
    own_ref = weakref.ref(own)

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        name = "weight_g_idx"
        label = state.label(name if shard_id is None else f"{name}[shard {shard_id}]")
        check_open(state, label)
        check_own(state, name, param, own_ref())
        index = shard_index(state, shard_id)
        value = check(label, loaded_tensor(label, loaded_weight), tuple(own.shape))
        _same_order(state, label, param, value)
        with torch.no_grad():
            param.copy_(value)
        state.loaded.setdefault(name, set()).add(index)

    return weight_loader


def _same_order(state: LayerState, label: str, param: torch.Tensor, value: torch.Tensor) -> None:
    """Refuse a shard's g_idx other than the one its fused layer already holds."""
    if state.loaded.get("weight_g_idx") and not torch.equal(param, value.to(param.dtype)):
        raise reject(
            label, value, "the g_idx of the shards already loaded: a fused layer's shards "
            "share one column order",
        )  # fmt: skip


def g_idx_engine_loader(
    state: LayerState, check: Check, loader: EngineLoader, whole: CheckpointShape
) -> WeightLoader:
    """An engine's loader of ``weight_g_idx`` behind the same check and the same refusal
    of a shard whose order differs (vLLM's copies each shard's over the last)."""
    inner = engine_loader(state, "weight_g_idx", check, False, loader, whole)

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        label = state.label(
            "weight_g_idx" if shard_id is None else f"weight_g_idx[shard {shard_id}]"
        )
        check_open(state, label)
        value = check(label, loaded_tensor(label, loaded_weight), (whole.k,))
        _same_order(state, label, param, value)
        inner(param, loaded_weight, shard_id)

    return weight_loader
