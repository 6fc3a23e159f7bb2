"""Allocate: a layer's parameters registered from its plan, once its kernel is selected
(the linear method's ``create_weights``), each with the loader that checks what it takes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from kernelpick.core import InvalidValueError, QuantConfig
from kernelpick.integration.layer._int_form import is_weight_only_int, values_per_word
from kernelpick.integration.layer._loaders import EngineLoader, WeightLoader, loader_for
from kernelpick.integration.layer._parallel import TensorParallel, check_split_blocks
from kernelpick.integration.layer._plan import Param
from kernelpick.integration.layer._recipe import Recipe
from kernelpick.integration.layer._shards import check_shards
from kernelpick.integration.layer._state import (
    CheckpointShape,
    LayerState,
    attach,
    positive_sizes,
)
from kernelpick.integration.layer._steps import LayerSteps, frozen

__all__ = ["ParameterFactory", "allocate", "check_partition", "partition_config"]

# An engine's parameter class for a planned parameter: (what to register, its storage, the
# checking loader it must carry) -> the parameter, over that storage.
ParameterFactory = Callable[[Param, torch.Tensor, WeightLoader], torch.nn.Parameter]


def allocate(
    steps: LayerSteps,
    tp: TensorParallel | None,
    layer: torch.nn.Module,
    input_size_per_partition: int,
    output_partition_sizes: Sequence[int],
    input_size: int,
    output_size: int,
    params_dtype: torch.dtype,
    *,
    prefix: str,
    weight_loader: EngineLoader | None,
    checkpoint_shards: Sequence[int] | None,
    parameter: ParameterFactory | None,
    extra_weight_attrs: dict[str, object],
) -> None:
    """``QuantizedLinearMethod.create_weights`` (see there) with the method's steps and
    tensor-parallel place."""
    sizes = positive_sizes(output_partition_sizes)
    config = partition_config(steps.recipe, sizes, input_size_per_partition, input_size,
                              params_dtype)  # fmt: skip
    whole = None
    if weight_loader is not None:
        whole = CheckpointShape.of_engine(sizes, input_size, output_size, checkpoint_shards)
    layer_name = prefix or "layer"
    tp = check_partition(
        steps.recipe, config, sizes, input_size, output_size, layer_name, tp=tp, engine=whole
    )
    if tp is not None:
        if dist.is_available() and dist.is_initialized():
            tp.check_group()  # a rank or size the group disagrees with loads another part
        elif tp.reduces(config) and steps.recipe.online:
            tp.check_group()  # raises: its amax is all-reduced, so the group must be up
    pre_quantized = not steps.recipe.online
    engine = None if weight_loader is None or whole is None else (weight_loader, whole)
    if parameter is not None and engine is None:
        raise InvalidValueError(
            "parameter", "a factory without weight_loader",
            "a factory only with an engine's weight_loader: kernelpick's own loaders "
            "load the parameters they make",
        )  # fmt: skip
    plan = steps.plan(config, sizes, params_dtype, prefix, parallel=tp)
    state = LayerState(plan)
    for spec in plan.params:
        data = torch.empty(spec.shape, dtype=spec.dtype)
        if parameter is None:
            param = frozen(data)
            own = loader_for(state, param, spec.name, pre_quantized=pre_quantized, engine=engine)
            extra = {**spec.dims, **extra_weight_attrs, "weight_loader": own}
        else:  # the engine's class, made once, with the dims and the checking loader
            own = loader_for(state, data, spec.name, pre_quantized=pre_quantized, engine=engine)
            param, extra = parameter(spec, data, own), dict(extra_weight_attrs)
            if param.data_ptr() != data.data_ptr():
                raise InvalidValueError(
                    "parameter", type(param).__name__,
                    "a factory returning a parameter over the data it was handed",
                )  # fmt: skip
        for key, value in extra.items():
            setattr(param, key, value)
        layer.register_parameter(spec.name, param)
    attach(layer, state)
    # Logged now, at selection, not once the weights are processed: an engine builds
    # every layer before loading any weight, and this is when it wants to know the
    # kernel; what goes wrong later is raised to it by process_weights_after_loading.
    steps.log(state)


def partition_config(
    recipe: Recipe,
    sizes: Sequence[int],
    input_size_per_partition: int,
    input_size: int,
    dtype: object,
    *,
    bias: bool = False,
) -> QuantConfig:
    """The QuantConfig of one rank's part of a layer: N the sum of its shards' ``sizes``, K
    ``input_size_per_partition`` of the whole ``input_size``. An integer weight-only part
    cut along K says into how many parts (``k_parts``), so that its kernels are asked for
    whole groups in it (``WholeGroupsPerPart``)."""
    config = recipe.config(sum(sizes), input_size_per_partition, dtype, bias=bias)
    if is_weight_only_int(config) and input_size != input_size_per_partition:
        parts = input_size // input_size_per_partition if input_size_per_partition else 1
        config = recipe.config(sum(sizes), input_size_per_partition, dtype, bias=bias,
                               k_parts=parts)  # fmt: skip
    return config


def check_partition(
    recipe: Recipe,
    config: QuantConfig,
    sizes: Sequence[int],
    input_size: int,
    output_size: int,
    layer: str,
    *,
    tp: TensorParallel | None,
    engine: CheckpointShape | None,
) -> TensorParallel | None:
    """Every refusal ``create_weights`` makes of one rank's part from its sizes alone, before
    anything is selected or allocated (no process group is asked): a partition the group
    could not have made, fused pre-quantized shards that would share a block of scales (or
    a word of zero points), a split cutting a scale block or a packed word. ``engine`` is
    the whole layer as an engine's own loaders read it (they narrow every tensor), None for
    kernelpick's loaders. Returns the tensor-parallel place the layer keeps: None where an
    engine narrows every tensor and no scale group spans the split."""
    if engine is not None and tp is not None and not tp.reduces(config):
        # The engine narrows every tensor itself; kernelpick's part in the split is only
        # agreeing scale groups that span it, which this layer's do not.
        tp = None
    if tp is not None:
        tp.check_partition(config, sizes, input_size, output_size, layer)
    if not recipe.online:  # before selecting: a layer it refuses logs no kernel
        check_shards(config, sizes, layer)
    if is_weight_only_int(config):
        _check_int_split(
            config, tp, engine is not None, recipe.online, sizes, output_size, input_size, layer
        )
    if engine is not None and tp is None:  # the engine splits the layer itself
        split = [part for part, rows in zip(sizes, engine.shards, strict=True) if part != rows]
        check_split_blocks(config, split, engine.k != config.k, layer)
    return tp


def _check_int_split(
    config: QuantConfig,
    tp: TensorParallel | None,
    engine: bool,
    online: bool,
    sizes: Sequence[int],
    output_size: int,
    input_size: int,
    layer: str,
) -> None:
    """Refuse a split integer weight-only layer whose part would be read as other values.
    Online, each part is quantized from its own float rows, on the whole row's bounds
    where its groups span the split (agreed over the group, ``TensorParallel.reduces``),
    so every split the kernels' whole-groups rule lets through is exact. Pre-quantized,
    kernelpick's own loaders do not narrow packed tensors, and an engine's must not cut a
    word: K along a row, or an asymmetric layer's zero points along N."""
    split = sum(sizes) != output_size or input_size != config.k
    if online or (not split and tp is None):
        return
    per_word = values_per_word(config)
    refusal = None
    if not engine:
        refusal = (
            "a whole layer: kernelpick's own loaders do not narrow pack-quantized tensors "
            "(an engine's loaders, such as vLLM's, do; or quantize each part online with "
            "shard_linear)"
        )
    elif config.k % per_word:
        refusal = f"each rank's K ({config.k}) a multiple of {per_word}, the values in a word"
    elif (
        config.weight.zero_point is not None
        and sum(sizes) != output_size
        and any(rows % per_word for rows in sizes)
    ):
        refusal = (
            f"each shard's rows on a rank ({list(sizes)}) a multiple of {per_word}: the "
            "zero points are packed that many rows to a word"
        )
    if refusal is not None:
        where = "the engine's split" if tp is None else tp.describe()
        raise InvalidValueError(f"tensor-parallel split of {layer}", where, refusal)
