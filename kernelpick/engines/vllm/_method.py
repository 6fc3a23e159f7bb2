"""The linear method of ``kernelpick.engines.vllm`` (made by ``KernelpickConfig``).

Every layer shares its config's one ``kernelpick.integration.QuantizedLinearMethod`` (the
device probed and the policy read once), at the layer's tensor-parallel place; the
per-layer object holds only the prefix and, once made, the layer's plan. kernelpick
selects, checks, quantizes and runs, and vLLM loads. The parameters kernelpick registers are
re-registered as vLLM's parameter classes (same storage, same dims), each with vLLM's
``weight_loader_v2`` behind kernelpick's shard bookkeeping, so vLLM narrows each tensor to
this rank's part and kernelpick still refuses a layer with shards never loaded.

Each selection is logged to kernelpick's logger and to vLLM's (``LOGGER``, a child of the
``vllm`` logger, the only one ``vllm serve`` configures): once per (device, config) each,
INFO, or WARNING for a degraded choice or one with speed warnings.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearMethodBase,
    QKVParallelLinear,
    RowParallelLinear,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    BlockQuantScaleParameter,
    ChannelQuantScaleParameter,
    GroupQuantScaleParameter,
    ModelWeightParameter,
    PackedColumnParameter,
    PackedvLLMParameter,
    PerTensorScaleParameter,
    RowvLLMParameter,
)

from kernelpick.core import INTEGER_WEIGHT_ONLY, InvalidValueError, Scheme
from kernelpick.integration import (
    SELECTIONS_LOGGER,
    ParallelStyle,
    QuantizedLinearMethod,
    TensorParallel,
    layer_state,
)
from kernelpick.integration.layer import (
    ALL_SHARDS,
    CheckpointShape,
    LayerPlan,
    LayerState,
    Param,
    ParameterFactory,
    WeightLoader,
    check_shape,
    is_weight_only_int,
    shard_index,
)

if TYPE_CHECKING:
    from kernelpick.engines.vllm._config import KernelpickConfig

__all__ = ["LOGGER", "KernelpickLinearMethod"]

# vLLM gives its own logger a handler and stops it propagating; in ``vllm serve`` nothing
# shows kernelpick's records (but Python's last resort, which prints warnings bare). A
# child of vLLM's logger is where its users read which kernel each layer got, beside
# vLLM's own "Selected %s for %s".
LOGGER = init_logger("vllm.plugins.kernelpick")


def _quiet_last_resort() -> None:
    """Give the integration's logger, whose selections vLLM's logger carries (below), a
    ``NullHandler``: without one, its WARNING records went to logging's last resort too, so
    ``vllm serve`` printed them twice. Only that logger: kernelpick's other warnings (a
    build lock waited for, an ISA level that did not compile) still reach stderr. Records
    still propagate to any handler the application configures."""
    selections = logging.getLogger(SELECTIONS_LOGGER)
    if not any(isinstance(handler, logging.NullHandler) for handler in selections.handlers):
        selections.addHandler(logging.NullHandler())


_quiet_last_resort()


@register_weight_loader_v2_supported_method
class KernelpickLinearMethod(LinearMethodBase):
    """One layer's kernelpick method (made by ``KernelpickConfig.get_quant_method``)."""

    def __init__(self, config: KernelpickConfig, prefix: str = "") -> None:
        self.config = config
        self.prefix = prefix
        self._method: QuantizedLinearMethod | None = None
        self.plan: LayerPlan | None = None

    @property
    def method(self) -> QuantizedLinearMethod:
        """kernelpick's method for this layer, once ``create_weights`` has run."""
        if self._method is None:
            raise InvalidValueError(
                "layer", self.prefix or "(unnamed)", "a layer whose create_weights ran"
            )
        return self._method

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Select for this rank's partition (raising ``KernelSelectionError`` before any
        parameter exists), then register vLLM parameters that vLLM's loaders fill."""
        config = self.config
        engine_loader = extra_weight_attrs.pop("weight_loader", None)
        method = config.method.with_tensor_parallel(_tensor_parallel(layer))
        loader = None if engine_loader is None else _shard_call(engine_loader)
        method.create_weights(
            layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
            params_dtype, prefix=self.prefix, weight_loader=loader,
            checkpoint_shards=_checkpoint_shards(layer, output_partition_sizes),
            parameter=None if loader is None else _parameter_factory(config.scheme),
            **extra_weight_attrs,
        )  # fmt: skip
        self.plan = plan = layer_state(layer).plan
        integer = is_weight_only_int(plan.config)
        if integer and not config.recipe.online:
            shards = _checkpoint_shards(layer, output_partition_sizes)
            whole = CheckpointShape.of_engine(
                output_partition_sizes, input_size, output_size, shards
            )
            _weight_shape(layer, layer_state(layer), whole)
        elif not integer and plan.config.weight.scale.group.rows != -1:  # blocks along K too
            # vLLM's fused loaders place a shard's block scales by the layer's block size
            # ([rows, columns] of weight per scale: fp8_block's b x b, mxfp8's 1 x 32).
            setattr(layer, "weight_block_size", list(plan.config.weight_block))  # noqa: B010
        self._method = method
        _log_to_vllm(method, layer_state(layer))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.method.process_weights_after_loading(layer)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.method.apply(layer, x, bias)


def _log_to_vllm(method: QuantizedLinearMethod, state: LayerState) -> None:
    """The selection, on vLLM's logger too (kernelpick's got it when the layer was planned).
    Only the first rank of the world logs it, as vLLM logs its own kernels' choices
    (``scope="global"``): every rank selects alike for its equal partition, and ``vllm
    serve`` prints each worker's records."""
    from vllm.distributed import is_global_first_rank

    if is_global_first_rank():
        method.steps.log(state, LOGGER)


def _tensor_parallel(layer: torch.nn.Module) -> TensorParallel | None:
    """kernelpick's view of the layer's tensor-parallel split over vLLM's group; None for a
    layer vLLM does not split. vLLM's loaders narrow the tensors themselves, so the method
    uses it only where the weight scales must be agreed over the group (its
    ``create_weights`` says when, from the plan's config)."""
    world = int(getattr(layer, "tp_size", 1))
    if world <= 1:
        return None
    if isinstance(layer, RowParallelLinear):
        style = ParallelStyle.ROW
    elif isinstance(layer, ColumnParallelLinear):
        style = ParallelStyle.COLUMN
    else:
        return None
    from vllm.distributed import get_tp_group

    return TensorParallel.of(style, get_tp_group().device_group)


def _checkpoint_shards(layer: torch.nn.Module, sizes: Sequence[int]) -> list[int] | None:
    """Each shard's rows in the checkpoint, which vLLM's loaders narrow to this rank's part,
    where they are not this rank's times the world size: a QKV layer's K and V replicate
    their heads when the world is larger than the KV head count. None: the default
    (``QuantizedLinearMethod.create_weights``) holds."""
    if not isinstance(layer, QKVParallelLinear) or len(sizes) != 3:
        return None
    heads, kv_heads = layer.total_num_heads, layer.total_num_kv_heads
    return [heads * layer.head_size, kv_heads * layer.head_size, kv_heads * layer.v_head_size]


def _shard_call(loader: Callable[..., Any]) -> Callable[[torch.Tensor, torch.Tensor, Any], None]:
    """vLLM's loader as kernelpick calls it: ``(param, tensor, shard_id)``. vLLM's column
    and row loaders take no shard id; its fused ones take one."""

    def call(param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: Any) -> None:
        if shard_id is None:
            loader(param, loaded_weight)
        else:
            loader(param, loaded_weight, shard_id)

    return call


def _weight_shape(layer: torch.nn.Module, state: LayerState, whole: CheckpointShape) -> None:
    """The ``weight_shape`` a pack-quantized checkpoint stores beside each layer (vLLM's
    model loaders look a parameter up for every key): each shard's is checked to be its
    ``[rows, K]`` in the ``whole`` layer, and nothing is kept (the plan holds the shape)."""

    def weight_loader(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
        index = shard_index(state, shard_id)
        rows = sum(whole.shards) if index == ALL_SHARDS else whole.shards[index]
        name = "weight_shape" if shard_id is None else f"weight_shape[shard {shard_id}]"
        stored = attrs.evolve(state.config, weight_shape=(rows, whole.k), k_parts=1)
        check_shape(stored, state.label(name), loaded)

    param = BasevLLMParameter(data=torch.empty(2, dtype=torch.int64), weight_loader=weight_loader)
    layer.register_parameter("weight_shape", param)


def _parameter_factory(scheme: Scheme) -> ParameterFactory:
    """The parameter factory for a layer of ``scheme``: ``_vllm_parameter``, told how many
    values a word packs for an integer scheme (vLLM's ``packed_factor``)."""
    width = INTEGER_WEIGHT_ONLY.get(scheme)
    per_word = None if width is None else 32 // width[0].bits
    return functools.partial(_vllm_parameter, per_word=per_word)


def _vllm_parameter(
    spec: Param, data: torch.Tensor, loader: WeightLoader, *, per_word: int | None = None
) -> torch.nn.Parameter:
    """The vLLM parameter class a planned parameter's dims call for, over ``data`` and
    carrying kernelpick's checking ``loader``: the weight, block scales (both dims),
    per-channel scales (the output dim) or per-tensor scales (one per shard); for an
    integer layer (``per_word`` values a word), its packed weight and zero points (vLLM
    narrows their words), its group or channel scales (a row per output row, never
    block-placed) and its g_idx."""
    out, into = spec.dims.get("output_dim"), spec.dims.get("input_dim")
    kwargs = {"data": data, "weight_loader": loader}
    made: torch.nn.Parameter
    if spec.name == "weight":  # FP8 or int8, or the float weight an online layer quantizes
        made = ModelWeightParameter(output_dim=out, input_dim=into, **kwargs)
    elif per_word is not None and "packed_dim" in spec.dims and into is None:
        # One column along K (per channel): every row-parallel part loads all of it.
        made = PackedColumnParameter(
            output_dim=out, packed_dim=spec.dims["packed_dim"], packed_factor=per_word, **kwargs
        )
    elif per_word is not None and "packed_dim" in spec.dims:
        made = PackedvLLMParameter(
            output_dim=out, input_dim=into, packed_dim=spec.dims["packed_dim"],
            packed_factor=per_word, **kwargs,
        )  # fmt: skip
    elif per_word is not None and spec.name == "weight_g_idx":
        made = RowvLLMParameter(input_dim=into, **kwargs)
    elif per_word is not None and into is not None:
        made = GroupQuantScaleParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None and into is not None:
        made = BlockQuantScaleParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None:
        made = ChannelQuantScaleParameter(output_dim=out, **kwargs)
    else:
        made = PerTensorScaleParameter(**kwargs)
    return made
