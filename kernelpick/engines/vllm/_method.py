"""The linear method of ``kernelpick.engines.vllm`` (made by ``KernelpickConfig``).

Every layer shares its config's one ``kernelpick.integration.QuantizedLinearMethod`` (the
device probed and the policy read once), at the layer's tensor-parallel place; the
per-layer object holds only the prefix and, once made, the layer's plan. kernelpick
selects, checks, quantizes and runs, and vLLM loads. The parameters kernelpick registers are
re-registered as vLLM's parameter classes (same storage, same dims), each with vLLM's
``weight_loader_v2`` behind kernelpick's shard bookkeeping, so vLLM narrows each tensor to
this rank's part and kernelpick still refuses a layer with shards never loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearMethodBase,
    QKVParallelLinear,
    RowParallelLinear,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import (
    BlockQuantScaleParameter,
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

from kernelpick.core import InvalidValueError
from kernelpick.integration import (
    ParallelStyle,
    QuantizedLinearMethod,
    TensorParallel,
    layer_state,
)
from kernelpick.integration.layer import LayerPlan, Param, WeightLoader

if TYPE_CHECKING:
    from kernelpick.engines.vllm._config import KernelpickConfig

__all__ = ["KernelpickLinearMethod"]


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
            parameter=None if loader is None else _vllm_parameter, **extra_weight_attrs,
        )  # fmt: skip
        self.plan = plan = layer_state(layer).plan
        if plan.config.weight.scale.group.rows != -1:  # scales in blocks along K too
            # vLLM's fused loaders place a shard's block scales by the layer's block size
            # ([rows, columns] of weight per scale: fp8_block's b x b, mxfp8's 1 x 32).
            setattr(layer, "weight_block_size", list(plan.config.weight_block))  # noqa: B010
        self._method = method

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.method.process_weights_after_loading(layer)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.method.apply(layer, x, bias)


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


def _vllm_parameter(spec: Param, data: torch.Tensor, loader: WeightLoader) -> torch.nn.Parameter:
    """The vLLM parameter class a planned parameter's dims call for, over ``data`` and
    carrying kernelpick's checking ``loader``: the weight, block scales (both dims),
    per-channel scales (the output dim) or per-tensor scales (one per shard)."""
    out, into = spec.dims.get("output_dim"), spec.dims.get("input_dim")
    kwargs = {"data": data, "weight_loader": loader}
    made: torch.nn.Parameter
    if spec.name == "weight":
        made = ModelWeightParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None and into is not None:
        made = BlockQuantScaleParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None:
        made = ChannelQuantScaleParameter(output_dim=out, **kwargs)
    else:
        made = PerTensorScaleParameter(**kwargs)
    return made
