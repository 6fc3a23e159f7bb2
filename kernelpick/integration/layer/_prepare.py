"""Prepare: a processed layer's kernel makes what it runs on from the canonical tensors
once (``install``), keeps it on the layer's state (``Prepared``) stamped with the tensors it
came from, and makes it again only when they are not those tensors any more
(``bundle_for``, the one place after ``install``); ``run`` is the forward.

Invalidated by: a cast or a move (a new state, selected again), ``load_state_dict`` (which
clears it), and any tensor replaced or written in place as torch tracks it. Not seen: a
write through ``.data``, which bypasses torch's version counter; a processed layer's
tensors are final (its loaders refuse), so write them through ``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernelpick.core import InvalidValueError, QuantConfig
from kernelpick.integration.layer._accept import CanonicalWeights
from kernelpick.integration.layer._int_form import IntWeights, is_weight_only_int, prepare_int
from kernelpick.integration.layer._loaders import closed_loader
from kernelpick.integration.layer._state import LayerState, Prepared, attach, layer_state
from kernelpick.integration.layer._steps import frozen
from kernelpick.kernels import Kernel, WeightBundle

__all__ = ["LayerWeights", "bundle_for", "install", "run", "tensor_names", "weights_from"]

# A layer's accepted tensors: the canonical FP8 or int8 ones, or an integer weight-only
# layer's pack-quantized ones.
LayerWeights = CanonicalWeights | IntWeights


def weights_from(config: QuantConfig, tensors: Mapping[str, torch.Tensor | None]) -> LayerWeights:
    """A layer's accepted tensors from its parameters by name (``config`` says which form),
    or ``InvalidValueError`` when it lacks its weight or scale."""

    def held(name: str) -> torch.Tensor:
        tensor = tensors.get(name)
        if tensor is None:
            raise InvalidValueError("layer", f"one without {name}", "a layer holding its tensors")
        return tensor

    if is_weight_only_int(config):
        return IntWeights(
            config, held("weight_packed"), held("weight_scale"),
            tensors.get("weight_zero_point"), tensors.get("weight_g_idx"),
        )  # fmt: skip
    return CanonicalWeights(held("weight"), held("weight_scale"), tensors.get("input_scale"))


def install(
    layer: torch.nn.Module, state: LayerState, kernel: Kernel, weights: LayerWeights
) -> None:
    """Give ``layer`` its canonical parameters (accepted: see ``_accept``) and its kernel,
    which prepares what it runs on from them now (the parameters may be shared with a
    layer tied to this one). Each parameter carries a ``weight_loader`` that refuses: the
    layer is processed, and its tensors are final."""
    params = {
        name: tensor if isinstance(tensor, torch.nn.Parameter) else frozen(tensor)
        for name, tensor in zip(weights.NAMES, weights.tensors(), strict=True)
        if tensor is not None
    }  # fmt: skip
    state.prepared = _prepare(kernel, state.config, params)
    for name, param in params.items():
        param.weight_loader = closed_loader(state, name)  # type: ignore[attr-defined]
        setattr(layer, name, param)
    for name in state.plan.names:  # what was loaded into another form (an online int weight)
        if name not in params:
            layer._parameters.pop(name, None)
    state.bound = kernel
    attach(layer, state)


def _stamp(*tensors: torch.Tensor | None) -> tuple[tuple[object, ...] | None, ...]:
    # The tensor itself (compared by identity: an id could be reused once it is freed),
    # its version (bumped by every in-place write torch tracks; an inference tensor has
    # none), storage and dtype: what must hold for a bundle prepared from these tensors to
    # still be theirs.
    return tuple(
        None
        if t is None
        else (t, None if t.is_inference() else t._version, t.data_ptr(), t.dtype, t.device)
        for t in tensors
    )


def _same(
    held: tuple[tuple[object, ...] | None, ...], now: tuple[tuple[object, ...] | None, ...]
) -> bool:
    return all(
        a is b if a is None or b is None else a[0] is b[0] and a[1:] == b[1:]
        for a, b in zip(held, now, strict=True)
    )


def tensor_names(config: QuantConfig) -> tuple[str, ...]:
    """The names a processed layer of ``config`` holds its quantized tensors under."""
    return IntWeights.NAMES if is_weight_only_int(config) else CanonicalWeights.NAMES


def _bundle(
    kernel: Kernel, config: QuantConfig, params: Mapping[str, torch.Tensor | None]
) -> WeightBundle:
    # Plain calls on the live tensors, no value built: torch.compile traces it.
    if is_weight_only_int(config):
        return prepare_int(kernel, config, params)
    weight, scale = params.get("weight"), params.get("weight_scale")
    if weight is None or scale is None:
        raise InvalidValueError("layer", "one without its weight or scale",
                                "a layer holding its weight and scale")  # fmt: skip
    return kernel.prepare_weights(weight, scale, params.get("input_scale"))


def _prepare(
    kernel: Kernel, config: QuantConfig, params: Mapping[str, torch.Tensor | None]
) -> Prepared:
    stamp = _stamp(*(params.get(name) for name in tensor_names(config)))
    return Prepared(_bundle(kernel, config, params), stamp)


def bundle_for(layer: torch.nn.Module, state: LayerState) -> WeightBundle:
    """What ``state``'s kernel runs on: the bundle it prepared from ``layer``'s canonical
    parameters, prepared again (the one place that happens after ``install``) only when
    they are not the tensors it was made from any more."""
    kernel = _bound(state)
    params = layer._parameters
    if torch.compiler.is_compiling():
        # Traced into the graph from the live parameters, and nothing stored: dynamo cannot
        # compare storages, and a bundle held outside the graph would be baked in stale.
        return _bundle(kernel, state.config, params)
    held = state.prepared
    now = _stamp(*(params.get(name) for name in tensor_names(state.config)))
    if held is None or not _same(held.stamp, now):
        held = state.prepared = _prepare(kernel, state.config, params)
    return held.bundle


def run(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Run a processed layer's kernel on what it prepared: ``x [..., K]`` -> ``[..., N]``."""
    state = layer_state(layer)
    return _bound(state).apply(x, bundle_for(layer, state), bias)


def _bound(state: LayerState) -> Kernel:
    if state.bound is None:
        raise InvalidValueError(
            "layer", state.name,
            "a layer whose weights were processed: call process_weights_after_loading first",
        )  # fmt: skip
    return state.bound
