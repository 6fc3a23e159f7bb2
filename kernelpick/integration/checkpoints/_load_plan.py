"""Reading a quantized checkpoint into a skeleton, step one: ``plan`` checks every name,
dtype, shape and kernel choice from the file headers, and reads no tensor. ``_build`` then
reads the tensors and ``save_load.load_quantized`` puts them in place."""

from __future__ import annotations

import attrs
import torch

from kernelpick.core import Dtype, KernelpickError
from kernelpick.integration._errors import CheckpointError, ModelConversionError
from kernelpick.integration.checkpoints._safetensors_io import Checkpoint
from kernelpick.integration.convert import SkippedLayer, dropped_by_swap
from kernelpick.integration.formats import Layout, Stored, check_e8m0_dtype
from kernelpick.integration.layer import (
    SHAPE_NAME,
    LayerState,
    LayerSteps,
    is_weight_only_int,
)
from kernelpick.kernels import STORED_SCALE_DTYPES, Kernel

__all__ = ["LoadPlan", "PlannedLayer", "plan"]


@attrs.frozen
class PlannedLayer:
    """A quantized layer of the checkpoint: the skeleton's linear at each of its paths, its
    selected and bound kernel, and the stored key of each of its canonical tensors."""

    paths: tuple[str, ...]
    module: torch.nn.Linear
    state: LayerState
    bound: Kernel
    keys: dict[str, str]


@attrs.frozen
class LoadPlan:
    layers: list[PlannedLayer]
    tensors: dict[int, tuple[str, torch.Tensor]]  # skeleton tensor id -> (stored key, tensor)
    skipped: list[SkippedLayer]


def _wanted(checkpoint: Checkpoint, key: str, ok: bool, expected: str) -> str:
    if not ok:
        dtype, shape = checkpoint.describe(key)
        raise CheckpointError(checkpoint.where(key), "dtype/shape", f"{dtype} {list(shape)}",
                              expected)  # fmt: skip
    return key


def _layer_keys(
    checkpoint: Checkpoint, path: str, names: list[str], layout: Layout, state: LayerState
) -> dict[str, str]:
    """The stored key of each of a layer's tensors, its dtype and (for the weight and bias)
    its shape checked from the file header; values are ``accept``'s, once read."""
    keys: dict[str, str] = {}
    n, _ = state.config.weight_shape
    e8m0 = state.config.weight.scale.dtype is Dtype.FLOAT8_E8M0FNU
    for name in names:
        stored = f"{path}.{layout.stored_name(name)}"
        key = checkpoint.source(stored)
        if key is None:
            where = str(checkpoint.directory)
            raise CheckpointError(where, stored, "nothing", "a tensor of this layer")
        dtype, shape = checkpoint.describe(key)
        if name in ("weight", "weight_packed", "weight_zero_point"):  # exact, as planned
            param = state.plan.param(name)
            ok, expected = (
                dtype == param.dtype and shape == param.shape,
                f"{str(param.dtype).removeprefix('torch.')} {list(param.shape)}",
            )
        elif name == "bias":
            ok, expected = (
                dtype in STORED_SCALE_DTYPES and shape == (n,),
                f"fp32, bf16 or fp16 [{n}]",
            )
        elif name == "weight_scale" and e8m0:  # shapes are checked with the values, in build
            check_e8m0_dtype(checkpoint.where(key), dtype)
            ok, expected = True, ""
        elif name in ("weight_g_idx", SHAPE_NAME):  # values are checked in build
            wanted = (state.config.k,) if name == "weight_g_idx" else (2,)
            ok = dtype in (torch.int32, torch.int64) and shape == wanted
            expected = f"int32 or int64 {list(wanted)}"
        else:
            ok, expected = dtype in STORED_SCALE_DTYPES, "fp32, bf16 or fp16"
        keys[name] = _wanted(checkpoint, key, ok, expected)
    return keys


def _stored_in(checkpoint: Checkpoint, path: str) -> Stored:
    def stored(name: str) -> bool:
        return checkpoint.source(f"{path}.{name}") is not None

    return stored


def _plan_layer(
    checkpoint: Checkpoint,
    steps: LayerSteps,
    layout: Layout,
    paths: list[str],
    module: torch.nn.Module,
    device: torch.device,
) -> PlannedLayer:
    name = paths[0]
    if type(module) is not torch.nn.Linear or dropped_by_swap(module):
        found = type(module).__name__
        extra = dropped_by_swap(module) if isinstance(module, torch.nn.Linear) else []
        found += f" holding {', '.join(extra)}" if extra else ""
        expected = "an nn.Linear of weight and bias: kernelpick replaces exact nn.Linear modules"
        raise CheckpointError(name, "module", found, expected)
    bias = module.bias is not None
    config = steps.config(module.out_features, module.in_features, module.weight.dtype, bias=bias)
    state = LayerState(steps.plan(config, (module.out_features,), module.weight.dtype, name))
    kernel = steps.bind(state, device)
    names = [*state.plan.names, *(["bias"] if bias else [])]
    if is_weight_only_int(config) and checkpoint.source(f"{name}.{SHAPE_NAME}") is not None:
        names.append(SHAPE_NAME)  # the format stores it; checked against the layer's shape
    keys = _layer_keys(checkpoint, name, names, layout, state)
    return PlannedLayer(tuple(paths), module, state, kernel, keys)


def plan(
    model: torch.nn.Module,
    checkpoint: Checkpoint,
    steps: LayerSteps,
    layout: Layout,
    device: torch.device,
) -> LoadPlan:
    """Everything ``build`` will read, checked against the skeleton; raises
    ``ModelConversionError`` naming every layer with no kernel, or ``CheckpointError``.
    ``layout`` says which modules the checkpoint quantizes and what it names their
    tensors."""
    paths: dict[int, list[str]] = {}
    modules: dict[int, torch.nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(name)
        modules[id(module)] = module
    layers: list[PlannedLayer] = []
    skipped: list[SkippedLayer] = []
    failures: list[tuple[str, KernelpickError]] = []
    for key, names in paths.items():
        module, first = modules[key], names[0]
        if not first:
            continue
        role = layout.loaded_role(first, module, _stored_in(checkpoint, first))
        if role is None:
            continue
        if isinstance(role, str):
            skipped.append(SkippedLayer(first, role))
            continue
        try:
            layers.append(_plan_layer(checkpoint, steps, layout, names, module, device))
        except KernelpickError as error:
            failures.append((names[0], error))
    if failures:
        raise ModelConversionError(failures)
    _check_ties(checkpoint, layers)
    tensors = _plan_tensors(model, checkpoint, layers)
    used = {key for layer in layers for key in layer.keys.values()}
    unexpected = sorted(checkpoint.keys() - used - {key for key, _ in tensors.values()})
    if unexpected:
        raise CheckpointError(
            checkpoint.where(unexpected[0]), "tensors", ", ".join(unexpected[:5]),
            "only tensors of this model: the skeleton and the checkpoint disagree",
        )  # fmt: skip
    return LoadPlan(layers, tensors, skipped)


def _check_ties(checkpoint: Checkpoint, layers: list[PlannedLayer]) -> None:
    """Linears the skeleton ties load one weight: the checkpoint must store one for them."""
    first: dict[int, PlannedLayer] = {}
    for layer in layers:
        tied = first.setdefault(id(layer.module.weight), layer)
        weight = layer.state.plan.names[0]  # the weight, or an integer layer's packed one
        if layer.keys[weight] != tied.keys[weight]:
            raise CheckpointError(
                checkpoint.where(layer.keys[weight]), weight,
                f"a tensor apart from {tied.keys[weight]}",
                f"the weight of {tied.paths[0]}, which the skeleton ties to {layer.paths[0]}",
            )  # fmt: skip


def _plan_tensors(
    model: torch.nn.Module, checkpoint: Checkpoint, layers: list[PlannedLayer]
) -> dict[int, tuple[str, torch.Tensor]]:
    """Each other tensor of the skeleton, once, with the stored key it loads from."""
    replaced = {f"{p}.{key}" for layer in layers for p in layer.paths for key in ("weight", "bias")}
    gone = {id(layer.module) for layer in layers}
    held = {
        id(tensor)
        for module in model.modules() if id(module) not in gone
        for tensor in (*module._parameters.values(), *module._buffers.values())
    }  # fmt: skip
    tensors: dict[int, tuple[str, torch.Tensor]] = {}
    missing: list[tuple[str, torch.Tensor]] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in replaced:
            continue
        if id(tensor) not in held:  # made by a module's _save_to_state_dict: nowhere to put it
            raise CheckpointError(
                str(checkpoint.directory), name, "a tensor the model derives when saving",
                "parameters and buffers of the skeleton, which is all kernelpick loads",
            )  # fmt: skip
        key = checkpoint.source(name)
        if key is None:
            missing.append((name, tensor))
            continue
        dtype, shape = checkpoint.describe(key)
        # Floats load into the skeleton's float dtype (build refuses a value that overflows
        # it); FP8 would drop its scale, and integers must match exactly.
        if tensor.is_floating_point():
            kind_ok = isinstance(dtype, torch.dtype) and dtype.is_floating_point
            kind_ok = kind_ok and isinstance(dtype, torch.dtype) and dtype.itemsize > 1
        else:
            kind_ok = dtype == tensor.dtype
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        ok = shape == tuple(tensor.shape) and kind_ok
        _wanted(checkpoint, key, ok, f"{dtype_name} {list(tensor.shape)}, as the model's")
        tensors.setdefault(id(tensor), (key, tensor))
    # A tensor the skeleton ties to another (saved once) loads with that one.
    absent = [name for name, tensor in missing if id(tensor) not in tensors]
    absent += [n for n, b in model.named_buffers() if b.is_meta and id(b) not in tensors]
    if absent:
        raise CheckpointError(
            str(checkpoint.directory), "tensors", "none for " + ", ".join(absent[:5]),
            "a value for every parameter and buffer of the skeleton; only tensors a checkpoint "
            "holds may be on the meta device",
        )  # fmt: skip
    return tensors
