"""What every weight loader shares: the call engines make
(``weight_loader(param, loaded_weight, shard_id=None)``), shard ids, the refusal of a load
into a processed layer, and an engine's own loader behind kernelpick's checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import attrs
import torch

from kernelpick.core import InvalidValueError, KernelInputError
from kernelpick.integration.layer._accept import Check
from kernelpick.integration.layer._state import ALL_SHARDS, CheckpointShape, LayerState

__all__ = [
    "EngineLoader",
    "WeightLoader",
    "check_open",
    "check_own",
    "closed_loader",
    "engine_loader",
    "loaded_tensor",
    "shard_index",
    "weight_loader_of",
]


class WeightLoader(Protocol):
    """``weight_loader(param, loaded_weight, shard_id=None)``, as engines call it."""

    def __call__(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None: ...


def weight_loader_of(param: torch.Tensor) -> WeightLoader:
    """The loader ``create_weights`` attached to ``param`` (engines read the attribute)."""
    loader = getattr(param, "weight_loader", None)
    if not callable(loader):
        raise InvalidValueError("param", tuple(param.shape), "a weight set up by create_weights")
    return cast(WeightLoader, loader)


_QKV = ("q", "k", "v")  # vLLM's QKVParallelLinear names its three shards


def shard_index(state: LayerState, shard_id: object) -> int:
    """The index of ``shard_id`` in the layer's shards (``ALL_SHARDS`` for None): an int,
    or for a layer of three shards ``"q"``, ``"k"`` or ``"v"``."""
    sizes = state.shards
    if shard_id is None:
        return ALL_SHARDS
    if isinstance(shard_id, int) and not isinstance(shard_id, bool) and 0 <= shard_id < len(sizes):
        return shard_id
    if len(sizes) == len(_QKV) and isinstance(shard_id, str) and shard_id in _QKV:
        return _QKV.index(shard_id)
    names = ", 'q', 'k' or 'v'" if len(sizes) == len(_QKV) else ""
    raise InvalidValueError("shard_id", shard_id, f"None or 0..{len(sizes) - 1}{names}")


def check_open(state: LayerState, label: str) -> None:
    """Refuse a load into a processed layer: processing checked, canonicalized and bound its
    tensors, and a later write would skip all of it (a -0 byte left, a scale unchecked)."""
    if state.processed:
        raise InvalidValueError(
            f"load of {label}", "after process_weights_after_loading",
            "loads before processing only: the layer's tensors are final once processed; "
            "build the layer again (create_weights) to load other weights",
        )  # fmt: skip


@attrs.frozen(eq=False)
class _Closed:
    state: LayerState
    name: str

    def __call__(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        check_open(self.state, self.state.label(self.name))


def closed_loader(state: LayerState, name: str) -> WeightLoader:
    """The loader a processed layer's parameter ``name`` carries: it refuses every tensor.
    An engine that finds no ``weight_loader`` on a parameter copies into it with its
    default loader (vLLM's casts), so every installed parameter carries this one. A value,
    not a closure, so a model holding it can be pickled."""
    return _Closed(state, name)


def check_own(state: LayerState, name: str, param: object, own: torch.Tensor | None) -> None:
    """Refuse a load into another parameter than ``own``, the one the loader was made for."""
    if param is not own:
        raise InvalidValueError(
            "param", tuple(getattr(param, "shape", ())),
            f"{state.name}.{name}, the parameter this loader was made for",
        )  # fmt: skip


def loaded_tensor(label: str, loaded: object) -> torch.Tensor:
    if not isinstance(loaded, torch.Tensor):
        raise KernelInputError(label, (), type(loaded).__name__, "-", "a torch.Tensor")
    return loaded


# An engine's own loader, called as ``loader(param, loaded_weight, shard_id)`` with the
# shard id the engine passes (its own annotation of it may be narrower than ours).
EngineLoader = Callable[[torch.Tensor, torch.Tensor, Any], object]


def engine_loader(
    state: LayerState,
    name: str,
    check: Check,
    per_shard: bool,
    loader: EngineLoader,
    whole: CheckpointShape,
) -> WeightLoader:
    """An engine's own loader behind kernelpick's checks: the tensor is checked against the
    ``whole`` layer's checkpoint shape (the engine narrows it to this rank's part), the
    engine is handed the checked value, and the shards it loaded are recorded so that
    processing can refuse a layer with shards never loaded."""

    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        label = state.label(name if shard_id is None else f"{name}[shard {shard_id}]")
        check_open(state, label)
        index = shard_index(state, shard_id)  # before loading: an unknown id loads nothing
        tensor = loaded_tensor(label, loaded_weight)
        shape = (1,) if per_shard else whole.shape(state.config, name, index)
        loader(param, check(label, tensor, shape), shard_id)
        state.loaded.setdefault(name, set()).add(index)

    return weight_loader
