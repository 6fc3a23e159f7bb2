"""What the linear method keeps on a layer between its calls, and the checkpoint shape an
engine's loader is checked against."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import attrs
import torch

from kernelpick.core import (
    DeviceCaps,
    InvalidValueError,
    QuantConfig,
    Selected,
    is_positive_int,
    positive_int,
)
from kernelpick.integration.layer._int_form import int_params, is_weight_only_int
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.integration.layer._plan import LayerPlan
from kernelpick.kernels import Kernel, WeightBundle

__all__ = [
    "ALL_SHARDS",
    "CheckpointShape",
    "LayerState",
    "Prepared",
    "attach",
    "find_state",
    "layer_state",
    "positive_sizes",
]

ALL_SHARDS = -1  # the loaded-shard marker for a whole-tensor load
_STATE = "kernelpick_state"


def positive_sizes(sizes: object, what: str = "output_partition_sizes") -> tuple[int, ...]:
    """``sizes`` (shards' rows: ``output_partition_sizes`` by default) as a tuple, or
    ``InvalidValueError`` naming ``what``."""
    items = tuple(sizes) if isinstance(sizes, (list, tuple)) else ()
    if not items or not all(is_positive_int(s) for s in items):
        raise InvalidValueError(what, sizes, "a non-empty list of positive ints")
    return items


@attrs.frozen
class CheckpointShape:
    """The whole layer as its checkpoint stores it: each shard's rows and K. An engine's own
    loader is handed these whole tensors and narrows them to this rank's part itself, so
    kernelpick checks each tensor against this shape before handing it on."""

    shards: tuple[int, ...]
    k: int

    @classmethod
    def of_engine(
        cls,
        sizes: Sequence[int],
        input_size: object,
        output_size: object,
        shards: Sequence[int] | None = None,
    ) -> CheckpointShape:
        """The whole layer of a part with shards of ``sizes`` rows, as the linear-method
        protocol states it: K is ``input_size``; each shard's rows are ``shards`` or, when
        None, ``sizes`` times ``output_size / sum(sizes)`` (a column-parallel split of every
        shard alike). Anything else could be read two ways, and is refused."""
        k = positive_int("input_size", input_size, "a positive int: the whole layer's K")
        if shards is not None:
            whole = positive_sizes(shards, "checkpoint_shards")
            if len(whole) != len(sizes):
                expected = f"{len(sizes)} sizes, one per shard of {list(sizes)}"
                raise InvalidValueError("checkpoint_shards", list(whole), expected)
            return cls(whole, k)
        n = positive_int("output_size", output_size, "a positive int: the whole layer's N")
        if n % sum(sizes):
            raise InvalidValueError(
                "output_size", n,
                f"a multiple of sum(output_partition_sizes) = {sum(sizes)} (the whole "
                "layer's N), or checkpoint_shards giving each shard's rows in the checkpoint",
            )  # fmt: skip
        return cls(tuple(rows * (n // sum(sizes)) for rows in sizes), k)

    def shape(self, config: QuantConfig, name: str, index: int) -> tuple[int, ...]:
        """The checkpoint shape of parameter ``name`` (``weight`` or a non-per-tensor
        ``weight_scale``, or an integer layer's ``_int_form`` tensor) for shard ``index``
        (``ALL_SHARDS``: the fused tensor)."""
        rows = sum(self.shards) if index == ALL_SHARDS else self.shards[index]
        whole = attrs.evolve(config, weight_shape=(rows, self.k))
        if name == "weight":  # the FP8 or int8 weight, or the float one of an online layer
            return (rows, self.k)
        if is_weight_only_int(config):  # its pack-quantized tensors, by name
            return next(param.shape for param in int_params(whole) if param.name == name)
        return whole.weight_scale_shape


@attrs.frozen(eq=False)
class Prepared:
    """What a bound kernel made of a layer's canonical tensors (its bundle), and the stamp
    of the tensors it was made from: their identity, version, storage and dtype. A stamp
    that no longer matches (the tensors were replaced, moved, cast or written) means the
    bundle is stale, and it is made again before the layer runs."""

    bundle: WeightBundle
    stamp: tuple[tuple[object, ...] | None, ...]


@attrs.define
class LayerState:
    """What a layer is between the linear method's calls: its plan (config, decision,
    device, shards, tensor-parallel place), which shards of each parameter were loaded
    and, once its weights are processed, the bound kernel (``bound``) and what that kernel
    prepared from the canonical tensors (``prepared``)."""

    plan: LayerPlan
    loaded: dict[str, set[int]] = attrs.field(factory=dict)
    bound: Kernel | None = None
    prepared: Prepared | None = None

    @property
    def config(self) -> QuantConfig:
        return self.plan.config

    @property
    def decision(self) -> Selected:
        return self.plan.decision

    @property
    def caps(self) -> DeviceCaps:
        return self.plan.caps

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    @property
    def shards(self) -> tuple[int, ...]:
        return self.plan.shards

    @property
    def parallel(self) -> TensorParallel | None:
        return self.plan.parallel

    @property
    def kernel(self) -> Kernel | None:
        """Deprecated (goes away in 0.4.0): ``bound``. ``.kernel`` is a kernel id elsewhere
        (``Selected.kernel``, ``LayerReport.kernel``)."""
        warnings.warn(
            "LayerState.kernel is deprecated and goes away in 0.4.0; use LayerState.bound "
            "(the bound kernel) or LayerState.decision.kernel (its id)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.bound

    @property
    def processed(self) -> bool:
        """Whether the weights were processed: the layer's tensors are final from then on."""
        return self.bound is not None

    @property
    def name(self) -> str:
        return self.prefix or "layer"

    def label(self, tensor: str) -> str:
        """How errors name this layer's ``tensor``: ``prefix.tensor``, and for a shard its
        rank, since each rank raises about its own part."""
        where = "" if self.parallel is None else f" {self.parallel.describe()}"
        return f"{self.name}.{tensor}{where}"


def find_state(layer: torch.nn.Module) -> LayerState | None:
    """The method's state on ``layer``, or None for a layer kernelpick does not run."""
    state = layer.__dict__.get(_STATE)
    return state if isinstance(state, LayerState) else None


def layer_state(layer: torch.nn.Module) -> LayerState:
    """The method's state on ``layer``; an error if ``create_weights`` never ran on it."""
    state = find_state(layer)
    if state is None:
        raise InvalidValueError(
            "layer", type(layer).__name__, "a layer set up by create_weights (no kernelpick state)"
        )
    return state


def attach(layer: torch.nn.Module, state: LayerState) -> None:
    """Record the state, and the decision for people to read, on ``layer``."""
    layer.__dict__[_STATE] = state
    layer.__dict__["kernelpick_decision"] = state.decision
