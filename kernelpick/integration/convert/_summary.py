"""What each layer of a loaded model runs, wherever it was loaded: ``model_summary`` reads
every kernelpick layer's decision (``quantize_model``, ``load_quantized``, the transformers
quantizer and the vLLM plugin all attach one) and the layers a conversion kept in high
precision, which the conversion records on the model (``record_kept``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kernelpick.core import (
    Decision,
    DeviceCaps,
    InvalidValueError,
    KeptLayer,
    ModelSummary,
    QuantConfig,
    scheme_of,
)
from kernelpick.integration.convert._report import SkippedLayer
from kernelpick.integration.formats import is_conv1d
from kernelpick.integration.layer import find_state

__all__ = ["kept_layers", "model_summary", "record_kept"]

# The attribute of a converted model's root that holds its kept layers: a plain attribute
# (not a parameter, buffer or module), so state_dict, save and load never see it.
_KEPT = "kernelpick_kept"


def kept_layers(model: torch.nn.Module, skipped: Iterable[SkippedLayer]) -> tuple[KeptLayer, ...]:
    """``skipped`` (name and reason) as ``KeptLayer`` values, their shapes read from
    ``model`` (N x K; a ``Conv1D`` stores K x N); a name that is not a linear module of it
    is left out."""
    modules = dict(model.named_modules(remove_duplicate=False))
    kept = []
    for layer in skipped:
        module = modules.get(layer.name)
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            k, n = weight.shape if module is not None and is_conv1d(module) else weight.T.shape
            kept.append(KeptLayer(layer.name, (n, k), weight.element_size(), layer.reason))
    return tuple(kept)


def record_kept(model: torch.nn.Module, kept: Iterable[KeptLayer]) -> None:
    """Record on ``model`` the layers a conversion kept in high precision, replacing those
    recorded under the same names; ``model_summary`` lists them."""
    recorded = {layer.name: layer for layer in model.__dict__.get(_KEPT, ())}
    recorded |= {layer.name: layer for layer in kept}
    model.__dict__[_KEPT] = tuple(recorded.values())


def model_summary(model: torch.nn.Module) -> ModelSummary:
    """What every kernelpick layer of ``model`` runs, grouped by config and decision, with
    the layers its conversion kept in high precision (see ``kernelpick.core.ModelSummary``).
    A model whose layers were selected for different devices is refused: one summary
    would read them as one device's."""
    layers: list[tuple[str, QuantConfig, Decision]] = []
    caps: set[DeviceCaps] = set()
    schemes: set[str] = set()
    world = 1
    for name, module in model.named_modules():
        state = find_state(module)
        if state is None:
            continue
        layers.append((name, state.config, state.decision))
        caps.add(state.caps)
        named = scheme_of(state.config)
        schemes.add("custom" if named is None else named.value)
        if state.parallel is not None:
            world = state.parallel.world_size
    if not layers:
        raise InvalidValueError(
            "model", type(model).__name__, "a model holding kernelpick layers (quantize_model, "
            "load_quantized, an engine's kernelpick config)",
        )  # fmt: skip
    if len(caps) > 1:
        found = f"layers selected for {sorted(c.name for c in caps)}"
        raise InvalidValueError("model", found, "layers selected for one device")
    # A layer kept by one conversion and quantized by a later one is no longer kept.
    converted = {
        name for name, module in model.named_modules(remove_duplicate=False)
        if find_state(module) is not None
    }  # fmt: skip
    kept = [layer for layer in model.__dict__.get(_KEPT, ()) if layer.name not in converted]
    mixed = " + ".join(sorted(schemes))  # a model converted twice may mix them
    return ModelSummary.of(mixed, caps.pop(), layers, kept, tensor_parallel=world)
