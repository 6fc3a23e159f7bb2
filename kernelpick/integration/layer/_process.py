"""Accept and prepare: a loaded layer's tensors accepted (``_accept``) and installed with
its bound kernel, which prepares what it runs on (the linear method's
``process_weights_after_loading``)."""

from __future__ import annotations

import torch

from kernelpick.core import InvalidValueError
from kernelpick.integration.layer._accept import accept, accept_float
from kernelpick.integration.layer._int_form import accept_int, is_weight_only_int
from kernelpick.integration.layer._parallel import AmaxExchange
from kernelpick.integration.layer._prepare import LayerWeights, install, weights_from
from kernelpick.integration.layer._state import ALL_SHARDS, LayerState, layer_state
from kernelpick.integration.layer._steps import LayerSteps

__all__ = ["process"]


def process(steps: LayerSteps, layer: torch.nn.Module) -> None:
    """``QuantizedLinearMethod.process_weights_after_loading`` (see there)."""
    state = layer_state(layer)
    if state.processed:
        return
    params = {name: layer.get_parameter(name) for name in state.plan.names}
    device = next(iter(params.values())).device
    if steps.recipe.online:
        reduce = _amax_exchange(state, device)
        try:
            _check_loaded(state)
            kernel = steps.bind(state, device)
            weights = accept_float(
                state.config, state.label, params["weight"], chunk_rows=steps.chunk_rows,
                reduce_amax=reduce,
            )  # fmt: skip
        except Exception:
            if reduce is not None and not reduce.sent:
                reduce.fail()  # tell the peers, then raise this rank's own error
            raise
        install(layer, state, kernel, weights)
        return
    _check_loaded(state)
    kernel = steps.bind(state, device)
    loaded = {name: param.detach() for name, param in params.items()}
    accepted: LayerWeights  # whoever loaded them: an engine's loader checks nothing
    if is_weight_only_int(state.config):
        accepted = accept_int(state.config, state.label, loaded)
    else:
        accepted = accept(
            state.config, state.label, loaded["weight"], loaded["weight_scale"],
            loaded.get("input_scale"), shards=state.shards, owned=True,
            chunk_rows=steps.chunk_rows,
        )  # fmt: skip
    # The registered parameters (an engine's own classes among them) stay wherever accept
    # kept their storage: only a merged or widened tensor is a new one.
    kept = {
        name: tensor if tensor is None or name not in params else _kept(params[name], tensor)
        for name, tensor in zip(accepted.NAMES, accepted.tensors(), strict=True)
    }  # fmt: skip
    install(layer, state, kernel, weights_from(state.config, kept))


def _kept(param: torch.nn.Parameter, accepted: torch.Tensor) -> torch.Tensor:
    same = (
        accepted.data_ptr() == param.data_ptr()
        and accepted.dtype == param.dtype
        and accepted.shape == param.shape
    )
    return param if same else accepted


def _check_loaded(state: LayerState) -> None:
    """Refuse a layer with a shard of a parameter never loaded."""
    for name in state.plan.names:
        loaded = state.loaded.get(name, set())
        missing = set(range(len(state.shards))) - loaded
        if ALL_SHARDS not in loaded and missing:
            raise InvalidValueError(
                f"loaded shards of {state.label(name)}", sorted(loaded),
                f"every shard 0..{len(state.shards) - 1}; never loaded: {sorted(missing)}",
            )  # fmt: skip


def _amax_exchange(state: LayerState, device: torch.device) -> AmaxExchange | None:
    """The all-reduce of a tensor-parallel shard's weight amax, where its scale groups span
    the split dimension; None where each rank's scales are its own."""
    tp = state.parallel
    if tp is None or not tp.reduces(state.config):
        return None
    return AmaxExchange(tp, state.name, state.config, device)
