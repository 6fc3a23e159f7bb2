"""The linear method of ``kernelpick.engines.vllm`` (made by ``KernelpickConfig``).

It wraps one ``kernelpick.integration.Fp8LinearMethod`` per layer: kernelpick selects,
checks, quantizes and runs, and vLLM loads. The parameters kernelpick registers are
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

import kernelpick as kp
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._schemes import DEFAULT_BLOCK_SIZE
from kernelpick.integration import Fp8LinearMethod, ParallelStyle, TensorParallel

if TYPE_CHECKING:
    from kernelpick.engines.vllm._config import KernelpickConfig

__all__ = ["KernelpickLinearMethod"]


@register_weight_loader_v2_supported_method
class KernelpickLinearMethod(LinearMethodBase):
    """One layer's kernelpick method (made by ``KernelpickConfig.get_quant_method``)."""

    def __init__(self, config: KernelpickConfig, prefix: str = "") -> None:
        self.config = config
        self.prefix = prefix
        self._method: Fp8LinearMethod | None = None

    @property
    def method(self) -> Fp8LinearMethod:
        """kernelpick's method for this layer, once ``create_weights`` has made it."""
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
        sizes, k = output_partition_sizes, input_size_per_partition
        tp = _tensor_parallel(config, layer, sizes, k, params_dtype)
        method = Fp8LinearMethod(
            config.scheme, config.caps, config.policy, checkpoint_format=config.checkpoint_format,
            block_size=config.block_size, tensor_parallel=tp,
        )  # fmt: skip
        loader = None if engine_loader is None else _shard_call(engine_loader)
        method.create_weights(
            layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
            params_dtype, prefix=self.prefix, weight_loader=loader,
            checkpoint_shards=_checkpoint_shards(layer, sizes), **extra_weight_attrs,
        )  # fmt: skip
        if config.scheme is kp.Scheme.FP8_BLOCK:
            # vLLM's fused loaders place a shard's block scales by the layer's block size.
            size = DEFAULT_BLOCK_SIZE if config.block_size is None else config.block_size
            setattr(layer, "weight_block_size", [size, size])  # noqa: B010  # a plain attribute
        if engine_loader is not None:
            for name, param in list(layer.named_parameters(recurse=False)):
                if name in ("weight", "weight_scale", "input_scale"):
                    layer.register_parameter(name, _as_vllm_parameter(name, param))
        self._method = method

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.method.process_weights_after_loading(layer)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.method.apply(layer, x, bias)


def _tensor_parallel(
    config: KernelpickConfig,
    layer: torch.nn.Module,
    sizes: Sequence[int],
    k: int,
    dtype: torch.dtype,
) -> TensorParallel | None:
    """kernelpick's view of the layer's tensor-parallel split, where its weight scales must
    be agreed over vLLM's group (see ``TensorParallel.reduces``); None where each rank's
    scales are its own (vLLM's loaders narrow the tensors either way). A split whose
    scale blocks would straddle two ranks is refused by ``create_weights`` for every
    engine that splits a layer itself, from the whole shape it is handed."""
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

    tp = TensorParallel.of(style, get_tp_group().device_group)
    shape = (sum(sizes), k)
    quant = kp.quant_config(
        config.scheme, weight_shape=shape, out_dtype=str(dtype).removeprefix("torch."),
        block_size=config.block_size,
    )  # fmt: skip
    return tp if tp.reduces(quant) else None


def _checkpoint_shards(layer: torch.nn.Module, sizes: Sequence[int]) -> list[int] | None:
    """Each shard's rows in the checkpoint, which vLLM's loaders narrow to this rank's part,
    where they are not this rank's times the world size: a QKV layer's K and V replicate
    their heads when the world is larger than the KV head count. None: the default
    (``Fp8LinearMethod.create_weights``) holds."""
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


def _as_vllm_parameter(name: str, param: torch.nn.Parameter) -> torch.nn.Parameter:
    """``param`` (same storage, same dims, same loader) as the vLLM parameter class its
    dims call for: the weight, block scales (both dims), per-channel scales (the output
    dim) or per-tensor scales (one per shard)."""
    out, into = getattr(param, "output_dim", None), getattr(param, "input_dim", None)
    kwargs = {"data": param.data, "weight_loader": getattr(param, "weight_loader")}  # noqa: B009
    made: torch.nn.Parameter
    if name == "weight":
        made = ModelWeightParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None and into is not None:
        made = BlockQuantScaleParameter(output_dim=out, input_dim=into, **kwargs)
    elif out is not None:
        made = ChannelQuantScaleParameter(output_dim=out, **kwargs)
    else:
        made = PerTensorScaleParameter(**kwargs)
    return made
