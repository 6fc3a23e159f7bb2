"""What the linear method keeps on a layer between its calls, and the checkpoint formats."""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs
import torch

from kernelpick.core._decision import Selected
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError, parse_enum
from kernelpick.core._quant import QuantConfig
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.kernels._base import Kernel

__all__ = [
    "ALL_SHARDS",
    "CheckpointFormat",
    "CheckpointShape",
    "LayerState",
    "attach",
    "find_state",
    "layer_state",
    "positive_sizes",
]

ALL_SHARDS = -1  # the loaded-shard marker for a whole-tensor load
_STATE = "kernelpick_state"


class CheckpointFormat(enum.Enum):
    """What the checkpoint a layer loads from holds.

    ``HIGH_PRECISION``: float weights, quantized after loading (online). ``PRE_QUANTIZED``:
    weights already quantized, in the canonical layout (see
    ``kernelpick.kernels.quantize_weight``): the FP8 or int8 ``weight``, its
    ``weight_scale`` and, for static schemes, ``input_scale``. ``FP8`` is the same member
    under its first name, and the string ``"fp8"`` still parses to it.
    """

    HIGH_PRECISION = "high_precision"
    PRE_QUANTIZED = "pre_quantized"
    FP8 = "pre_quantized"  # an alias: the name from before int8 weights loaded too

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> CheckpointFormat | None:
        return cls.PRE_QUANTIZED if value == "fp8" else None

    @classmethod
    def parse(cls, value: object) -> CheckpointFormat:
        return parse_enum(cls, value, "checkpoint format")


def positive_sizes(sizes: object, what: str = "output_partition_sizes") -> tuple[int, ...]:
    """``sizes`` (shards' rows: ``output_partition_sizes`` by default) as a tuple, or
    ``InvalidValueError`` naming ``what``."""
    items = tuple(sizes) if isinstance(sizes, (list, tuple)) else ()
    if not items or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in items
    ):
        raise InvalidValueError(what, sizes, "a non-empty list of positive ints")
    return items


def _positive(what: str, value: object, expected: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidValueError(what, value, expected)
    return value


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
        k = _positive("input_size", input_size, "a positive int: the whole layer's K")
        if shards is not None:
            whole = positive_sizes(shards, "checkpoint_shards")
            if len(whole) != len(sizes):
                expected = f"{len(sizes)} sizes, one per shard of {list(sizes)}"
                raise InvalidValueError("checkpoint_shards", list(whole), expected)
            return cls(whole, k)
        n = _positive("output_size", output_size, "a positive int: the whole layer's N")
        if n % sum(sizes):
            raise InvalidValueError(
                "output_size", n,
                f"a multiple of sum(output_partition_sizes) = {sum(sizes)} (the whole "
                "layer's N), or checkpoint_shards giving each shard's rows in the checkpoint",
            )  # fmt: skip
        return cls(tuple(rows * (n // sum(sizes)) for rows in sizes), k)

    def shape(self, config: QuantConfig, name: str, index: int) -> tuple[int, ...]:
        """The checkpoint shape of parameter ``name`` (``weight`` or a non-per-tensor
        ``weight_scale``) for shard ``index`` (``ALL_SHARDS``: the fused tensor)."""
        rows = sum(self.shards) if index == ALL_SHARDS else self.shards[index]
        if name == "weight":
            return (rows, self.k)
        return attrs.evolve(config, weight_shape=(rows, self.k)).weight_scale_shape


@attrs.define
class LayerState:
    """One layer's config, decision and device, which shards of each parameter were
    loaded, its place in a tensor-parallel group (None: the whole layer) and (once its
    weights are processed) the bound kernel."""

    config: QuantConfig
    decision: Selected
    caps: DeviceCaps
    prefix: str
    shards: tuple[int, ...]
    loaded: dict[str, set[int]] = attrs.field(factory=dict)
    kernel: Kernel | None = None
    parallel: TensorParallel | None = None

    @property
    def processed(self) -> bool:
        """Whether the weights were processed: the layer's tensors are final from then on."""
        return self.kernel is not None

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
