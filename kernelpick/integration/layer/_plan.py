"""The plan: what select-before-allocate decided for one layer, as data.

A plan holds the layer's config, the decision and the device it was made for, its shards
and tensor-parallel place, and the parameters to register (name, shape, dtype, and the
dimensions an engine narrows each by). The linear method's ``create_weights``, the
transformers quantizer and ``load_quantized`` all read their shapes from it, so no path
computes a parameter's shape on its own.
"""

from __future__ import annotations

import attrs
import torch

from kernelpick.core import DeviceCaps, QuantConfig, Selected
from kernelpick.integration.layer._int_form import int_params, is_weight_only_int
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.integration.layer._param import Param
from kernelpick.integration.layer._shards import per_tensor, scale_shape
from kernelpick.kernels import canonical_dtype, canonical_scale_dtype, torch_dtype

__all__ = ["LayerPlan", "Param", "param_dims"]


def param_dims(config: QuantConfig, name: str) -> dict[str, int]:
    """The ``output_dim`` and ``input_dim`` of a layer's parameter ``name``, the attributes
    engines narrow it by: the weight has both; a weight scale has each dimension its
    groups do not span (per block both, per channel the output, per tensor neither)."""
    if name == "weight":
        return {"output_dim": 0, "input_dim": 1}
    if name != "weight_scale" or per_tensor(config):
        return {}
    group = config.weight.scale.group  # over the GEMM's [K, N]: rows are K, columns N
    dims = {"output_dim": 0} if group.cols != -1 else {}
    return dims | ({"input_dim": 1} if group.rows != -1 else {})


@attrs.frozen(eq=False)
class LayerPlan:
    """One layer, planned: its config, the decision and the device it was made for, its
    prefix, the rows of each shard, its tensor-parallel place (None: the whole layer) and
    the parameters it registers. Made by ``LayerSteps.plan``."""

    config: QuantConfig
    decision: Selected
    caps: DeviceCaps
    prefix: str
    shards: tuple[int, ...]
    parallel: TensorParallel | None
    params: tuple[Param, ...]

    @staticmethod
    def params_of(
        config: QuantConfig, shards: tuple[int, ...], dtype: torch.dtype, *, online: bool
    ) -> tuple[Param, ...]:
        """What a layer registers: online, the high-precision ``weight [N, K]`` in
        ``dtype``; pre-quantized, an integer weight-only layer's pack-quantized tensors
        (``_int_form``), else the canonical ``weight``, ``weight_scale`` (one per shard
        per tensor, which processing merges; else the config's shape) and, for a static
        scheme, ``input_scale`` (one per shard)."""
        weight = Param("weight", config.weight_shape, dtype, param_dims(config, "weight"))
        if online:
            return (weight,)
        if is_weight_only_int(config):
            return int_params(config)
        weight = attrs.evolve(weight, dtype=torch_dtype(canonical_dtype(config)))
        scale = Param(
            "weight_scale", scale_shape(config, shards), canonical_scale_dtype(config),
            param_dims(config, "weight_scale"),
        )  # fmt: skip
        act = config.activation
        if act is None or not act.scale.static:
            return (weight, scale)
        return (weight, scale, Param("input_scale", (len(shards),), torch.float32))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(param.name for param in self.params)

    def param(self, name: str) -> Param:
        return next(param for param in self.params if param.name == name)
