"""What the linear method keeps on a layer between its calls, and the checkpoint formats."""

from __future__ import annotations

import enum

import attrs
import torch

from kernelpick.core._decision import Selected
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError, parse_enum
from kernelpick.core._quant import QuantConfig
from kernelpick.integration._parallel import TensorParallel
from kernelpick.kernels._base import Kernel

__all__ = [
    "ALL_SHARDS",
    "CheckpointFormat",
    "LayerState",
    "attach",
    "find_state",
    "layer_state",
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
