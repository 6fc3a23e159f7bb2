"""Reading a quantized checkpoint into a skeleton, step two: ``build`` reads the tensors
``_load_plan.plan`` checked, accepts each layer's (``integration.layer.accept``) and makes
the new modules; the model is not touched until ``load_quantized`` puts them in place."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.core import KernelpickError
from kernelpick.integration._errors import CheckpointError, ModelConversionError
from kernelpick.integration.checkpoints._load_plan import LoadPlan, PlannedLayer
from kernelpick.integration.checkpoints._safetensors_io import Checkpoint
from kernelpick.integration.layer import (
    SHAPE_NAME,
    IntWeights,
    LayerState,
    LayerSteps,
    LayerWeights,
    QuantizedLinear,
    accept,
    accept_int,
    check_bias,
    check_shape,
    install,
    is_weight_only_int,
)

__all__ = ["build"]


def _read_layer(
    checkpoint: Checkpoint,
    steps: LayerSteps,
    layer: PlannedLayer,
    weight: torch.nn.Parameter | None,
    device: torch.device,
) -> QuantizedLinear:
    """The layer's tensors read and accepted (``weight``: the accepted weight of a layer
    the skeleton ties this one to, shared), and its module made."""
    keys, linear, state = layer.keys, layer.module, layer.state

    def read(name: str) -> torch.Tensor | None:
        if name not in keys:
            return None
        return checkpoint.read(keys[name]).to(device, copy=True)  # accept reads E8M0 bytes

    def label(name: str) -> str:  # named as stored: weight_scale_inv is a transformers one's
        return keys.get(name, f"{layer.paths[0]}.{name}")

    bias = None
    if linear.bias is not None:
        bias = _read_as(checkpoint, keys["bias"], linear.bias.dtype, device)
    if is_weight_only_int(state.config):
        return _install(steps, layer, bias, _read_int(state, read, label, weight, bias))
    stored_weight = weight if weight is not None else read("weight")
    scale = read("weight_scale")
    if stored_weight is None or scale is None:  # _layer_keys found both
        raise CheckpointError(str(checkpoint.directory), layer.paths[0], "no weight", "one")
    weights = accept(
        state.config, label, stored_weight, scale, read("input_scale"), bias,
        owned=True, chunk_rows=steps.chunk_rows,
    )  # fmt: skip
    if weight is not None:
        weights = attrs.evolve(weights, weight=weight)  # the tied layer's parameter, shared
    return _install(steps, layer, bias, weights)


def _read_int(
    state: LayerState,
    read: Callable[[str], torch.Tensor | None],
    label: Callable[[str], str],
    weight: torch.nn.Parameter | None,
    bias: torch.Tensor | None,
) -> IntWeights:
    """An integer layer's pack-quantized tensors, read and accepted (``weight``: the
    packed weight of the layer the skeleton ties this one to, shared)."""
    shape = read(SHAPE_NAME)
    if shape is not None:
        check_shape(state.config, label(SHAPE_NAME), shape)
    tensors = {name: read(name) for name in state.plan.names}
    if weight is not None:
        tensors["weight_packed"] = weight
    if bias is not None:
        check_bias(state.config, label, bias)
    return accept_int(state.config, label, tensors)


def _install(
    steps: LayerSteps, layer: PlannedLayer, bias: torch.Tensor | None, weights: LayerWeights
) -> QuantizedLinear:
    linear = layer.module
    kept = None if bias is None else torch.nn.Parameter(bias, linear.bias.requires_grad)
    module = QuantizedLinear(linear.in_features, linear.out_features, steps, kept)
    install(module, layer.state, layer.bound, weights)  # it makes the parameters
    return module


def build(
    checkpoint: Checkpoint, steps: LayerSteps, plan: LoadPlan, device: torch.device
) -> tuple[list[QuantizedLinear], dict[int, torch.Tensor]]:
    """Every new module and tensor, read and accepted (NaN bytes, scales, bias); the model
    is not touched. A tensor that fails its checks raises ``ModelConversionError``."""
    modules: list[QuantizedLinear] = []
    weights: dict[int, torch.nn.Parameter] = {}  # linears tied in the skeleton stay tied
    for layer in plan.layers:
        name, linear = layer.paths[0], layer.module
        try:
            module = _read_layer(checkpoint, steps, layer, weights.get(id(linear.weight)), device)
            weights.setdefault(id(linear.weight), module.get_parameter(layer.state.plan.names[0]))
            modules.append(module)
        except KernelpickError as error:
            raise ModelConversionError([(name, error)]) from error
    tensors: dict[int, torch.Tensor] = {}
    for ident, (key, old) in plan.tensors.items():
        new = _read_as(checkpoint, key, old.dtype, device)
        is_param = isinstance(old, torch.nn.Parameter)
        tensors[ident] = torch.nn.Parameter(new, old.requires_grad) if is_param else new
    return modules, tensors


def _read_as(
    checkpoint: Checkpoint, key: str, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A stored tensor in the skeleton's ``dtype``, refusing a value the cast cannot hold
    (1e6 in fp16 would become inf)."""
    stored = checkpoint.read(key)
    new = stored.to(device, dtype)
    if new.dtype != stored.dtype and bool((stored.isfinite() & ~new.isfinite().cpu()).any()):
        name = str(dtype).removeprefix("torch.")
        raise CheckpointError(checkpoint.where(key), "values", f"values out of range of {name}",
                              f"values the model's {name} can hold")  # fmt: skip
    return new
