"""A model's plan on each device: the recipe (a scheme asked for, or the checkpoint's own
``quantization_config``), each layer's config and the refusals loading would make of its
part, and each layer's decision, as a ``ModelSummary`` per device."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
import torch

from kernelpick.core import (
    DeviceCaps,
    Dtype,
    KeptLayer,
    ModelSummary,
    Policy,
    QuantConfig,
    Scheme,
    UncoveredWeights,
    choose,
)
from kernelpick.integration import CheckpointError, ParallelStyle, Recipe, TensorParallel
from kernelpick.integration.formats import QUANTIZATION_CONFIG, Layout, read_layout
from kernelpick.integration.layer import (
    ONLINE_SCHEMES,
    CheckpointFormat,
    CheckpointShape,
    check_partition,
    partition_config,
)
from kernelpick.plan._config import ModelConfig, read_config
from kernelpick.plan._layers import Linear, ModelLayers, linear_layers
from kernelpick.plan._table import Split

__all__ = ["ModelPlan", "Scheme", "plan_model", "recipe_for"]

_STYLES = {Split.COLUMN: ParallelStyle.COLUMN, Split.QKV: ParallelStyle.COLUMN,
           Split.ROW: ParallelStyle.ROW}  # fmt: skip


@attrs.frozen(eq=False)
class ModelPlan:
    """A model's plan: its ``layers`` (what the config implies), the ``recipe`` they are
    quantized with and where it came from (``source``: "--scheme" or the checkpoint's
    quantization_config), the ``dtype`` they compute in, one ``ModelSummary`` per
    device (``summaries``, in the order the devices were given), and the weights no
    kernel runs (``uncovered``, the same in every summary: their bytes are not counted
    for a pre-quantized checkpoint, which stores them as its quantization_config says)."""

    layers: ModelLayers
    recipe: Recipe
    source: str
    dtype: Dtype
    summaries: tuple[ModelSummary, ...]
    uncovered: tuple[UncoveredWeights, ...]

    @property
    def rejected(self) -> int:
        return sum(summary.rejected for summary in self.summaries)


def recipe_for(
    config: ModelConfig,
    scheme: Scheme | str | None = None,
    *,
    block_size: int | None = None,
    group_size: int | None = None,
    symmetric: bool = True,
) -> tuple[Recipe, Layout | None]:
    """The recipe a plan uses: ``scheme`` (a high-precision checkpoint quantized as it
    loads; a scheme no online quantization makes, such as fp8_per_tensor_static, as a
    pre-quantized checkpoint of it), or with no scheme the checkpoint's own
    ``quantization_config`` and its layout. A config with both, or neither, is refused."""
    qconfig = config.quantization_config
    if scheme is None:
        if qconfig is None:
            raise CheckpointError(
                config.path, QUANTIZATION_CONFIG, "nothing",
                "a quantization_config, or a scheme to plan (--scheme): a high-precision "
                "checkpoint has no scheme of its own",
            )  # fmt: skip
        layout = read_layout(config.path, qconfig)
        return layout.recipe, layout
    if qconfig is not None:
        raise CheckpointError(
            config.path, QUANTIZATION_CONFIG, "a quantization_config beside --scheme",
            "one of them: the checkpoint is already quantized by its quantization_config "
            "(plan it without --scheme), and a scheme plans a high-precision checkpoint",
        )  # fmt: skip
    parsed = Scheme.parse(scheme)
    fmt = (
        CheckpointFormat.HIGH_PRECISION
        if parsed in ONLINE_SCHEMES
        else CheckpointFormat.PRE_QUANTIZED
    )
    recipe = Recipe.of(parsed, checkpoint_format=fmt, block_size=block_size,
                       group_size=group_size, symmetric=symmetric)  # fmt: skip
    return recipe, None


def _role(
    layout: Layout | None, layer: Linear, modules: Mapping[str, torch.nn.Module]
) -> bool | str:
    """True for a layer the recipe quantizes, else why it stays in high precision. A fused
    layer's members must agree, as vLLM runs them as one layer."""
    if layout is None:
        return True
    roles = {m: layout.expected_role(m, modules[m]) for m in layer.members}
    found = {role for role in roles.values()}
    if len(found) > 1:
        raise CheckpointError(
            layout.where, "ignore/modules_to_not_convert",
            f"shards of {layer.name} quantized apart: {roles}",
            "its shards all quantized or all kept: vLLM runs them as one layer",
        )  # fmt: skip
    role = found.pop()
    if role is None:
        return "the checkpoint's quantization_config does not target it"
    return role


def _config(recipe: Recipe, layer: Linear, dtype: Dtype, ranks: int) -> QuantConfig:
    """The layer's config on its rank, after every refusal loading its part would make
    (``check_partition``, as vLLM's loaders read the checkpoint)."""
    shape = layer.part
    config = partition_config(recipe, shape.sizes, shape.k, shape.input_size, dtype,
                              bias=layer.bias)  # fmt: skip
    style = _STYLES.get(layer.split) if layer.split is not None else None
    tp = TensorParallel(style, 0, ranks) if style is not None and ranks > 1 else None
    engine = CheckpointShape.of_engine(shape.sizes, shape.input_size, shape.output_size,
                                       shape.checkpoint)  # fmt: skip
    check_partition(recipe, config, shape.sizes, shape.input_size, shape.output_size,
                    layer.name, tp=tp, engine=engine)  # fmt: skip
    return config


def plan_model(
    where: str | Path,
    devices: Iterable[DeviceCaps],
    scheme: Scheme | str | None = None,
    *,
    block_size: int | None = None,
    group_size: int | None = None,
    symmetric: bool = True,
    tensor_parallel: int = 1,
    dtype: Dtype | str | None = None,
    policy: Policy | None = None,
) -> ModelPlan:
    """What every linear layer of the model whose ``config.json`` is at ``where`` (or a
    directory holding it) runs on each of ``devices``, before any weight is downloaded.
    ``scheme`` (with ``block_size``, ``group_size``, ``symmetric``) or, when None, the
    checkpoint's own ``quantization_config``; ``dtype`` the activations' (None: the
    config's); ``policy`` ``Policy()`` when None. Raises a ``KernelpickError`` for what
    loading would refuse whatever the device (a tensor-parallel size that does not divide
    a layer, shards that would share a block of scales)."""
    config = read_config(where)
    recipe, layout = recipe_for(config, scheme, block_size=block_size, group_size=group_size,
                                symmetric=symmetric)  # fmt: skip
    computes = config.dtype if dtype is None else Dtype.parse(dtype)
    layers = linear_layers(config, tensor_parallel)
    policy = Policy() if policy is None else policy
    quantized: list[tuple[Linear, QuantConfig]] = []
    kept = list(layers.kept)
    stored = config.dtype.itemsize  # bytes are the checkpoint's, whatever --dtype computes in
    # A pre-quantized checkpoint stores its experts as its quantization_config says (FP8 and
    # scales, or high precision where it keeps them): not counted, rather than miscounted.
    uncovered = tuple(u if recipe.online else attrs.evolve(u, dtype=None)
                      for u in layers.uncovered)  # fmt: skip
    for layer in layers.layers:
        role = _role(layout, layer, layers.modules)
        if role is True:
            quantized.append((layer, _config(recipe, layer, computes, layers.tensor_parallel)))
        else:
            kept.append(KeptLayer(layer.name, layer.weight_shape, stored, str(role)))
    summaries = tuple(
        ModelSummary.of(
            recipe.scheme.value, caps,
            [(layer.name, c, choose(caps, c, policy)) for layer, c in quantized],
            kept, tensor_parallel=layers.tensor_parallel, uncovered=uncovered,
            weight_itemsize=stored,
        )
        for caps in devices
    )  # fmt: skip
    source = "--scheme" if layout is None else QUANTIZATION_CONFIG
    return ModelPlan(layers, recipe, source, computes, summaries, uncovered)
