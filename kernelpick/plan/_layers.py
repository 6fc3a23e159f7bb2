"""A model's linear layers as vLLM builds them, from transformers' modules on the meta
device: fused by ``FUSED``, split by their ``Split`` over the tensor-parallel ranks, the
ones vLLM keeps in high precision apart, and the MoE experts vLLM runs in FusedMoE."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import torch

from kernelpick.core import InvalidValueError, KeptLayer, UncoveredWeights, positive_int
from kernelpick.integration.formats import (
    EXPERT_LINEARS,
    FUSED_MOE,
    OUTPUT_HEAD_KEPT,
    experts_module,
    output_heads,
)
from kernelpick.plan._config import ModelConfig, read_config
from kernelpick.plan._meta import meta_model
from kernelpick.plan._table import (
    FUSED,
    KEPT,
    QUANTIZED_ROUTERS,
    ROUTER_KEPT,
    Heads,
    Part,
    Split,
    part,
    split_of,
)

__all__ = ["EXPERTS", "Linear", "ModelLayers", "linear_layers"]

EXPERTS = f"MoE experts stored as 3-D parameters, not nn.Linear layers: {FUSED_MOE}"


@attrs.frozen
class Linear:
    """One layer as vLLM builds it: its ``name`` (a fused one's, such as ``qkv_proj``), the
    transformers modules it is made of (``members``, in shard order), its ``split`` (None:
    not in the table), this rank's ``part``, and whether it has a bias."""

    name: str
    members: tuple[str, ...]
    split: Split | None
    part: Part
    bias: bool

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (sum(self.part.sizes), self.part.k)


@attrs.frozen(eq=False)  # holds modules, compared by identity
class ModelLayers:
    """A model's linear layers on one of ``tensor_parallel`` ranks: those a quantization
    applies to (``layers``), those vLLM keeps in high precision whatever it is (``kept``),
    the MoE experts it runs in FusedMoE (``uncovered``), and each member's module (what a
    checkpoint's layout matches its patterns against)."""

    config: ModelConfig
    tensor_parallel: int
    layers: tuple[Linear, ...]
    kept: tuple[KeptLayer, ...]
    uncovered: tuple[UncoveredWeights, ...]
    modules: Mapping[str, torch.nn.Module]


def _own_heads(module: torch.nn.Module) -> Heads | None:
    """The heads of the config ``module`` holds, if it holds one that has them: a LLaVA's
    vision tower and language model each hold their own sub-config."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return Heads(heads, kv) if isinstance(heads, int) and isinstance(kv, int) else None


def _ends(name: str, tail: str) -> bool:
    return name == tail or name.endswith("." + tail)


def _router(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Router")  # transformers' MoE routers (no nn.Linear)


def _kept_reason(
    name: str, module: torch.nn.Module, heads: set[str], routers_quantized: bool
) -> str | None:
    if name in heads:
        return OUTPUT_HEAD_KEPT
    if _router(module) and not routers_quantized:
        return ROUTER_KEPT
    return next((why for tail, why in KEPT.items() if _ends(name, tail)), None)


def _stand_in(weight: torch.Tensor, bias: object) -> torch.nn.Linear:
    """The linear vLLM builds for a module that is no nn.Linear in transformers, from its
    (N, K) ``weight``: what a checkpoint's layout matches its patterns against."""
    n, k = weight.shape
    return torch.nn.Linear(k, n, bias=isinstance(bias, torch.Tensor), device="meta")


def _groups(
    linears: dict[str, torch.nn.Linear], splits: Mapping[str, Split]
) -> Iterator[tuple[str, tuple[str, ...], Split | None]]:
    """(vLLM's name, members, split) of every layer, fused ones where the parent holds
    every shard, in the order of each layer's first member; ``splits`` those known from
    what the module is rather than its name."""
    taken: set[str] = set()
    for name in linears:
        if name in taken:
            continue
        parent, _, last = name.rpartition(".")
        prefix = f"{parent}." if parent else ""
        for fused in FUSED:
            members = tuple(prefix + shard for shard in fused.shards)
            if last in fused.shards and all(m in linears for m in members):
                taken.update(members)
                yield prefix + fused.name, members, fused.split
                break
        else:
            yield name, (name,), splits.get(name) or split_of(name)


def _part(name: str, split: Split | None, shards: list[int], k: int, ranks: int,
          heads: Heads | None) -> Part:  # fmt: skip
    if split is None:
        if ranks > 1:
            raise InvalidValueError(
                f"--tensor-parallel for {name}", ranks,
                "1: kernelpick plan's table does not say how vLLM splits this layer",
            )  # fmt: skip
        split = Split.REPLICATED
    return part(name, split, shards, k, ranks, heads)


def linear_layers(where: str | Path | ModelConfig, tensor_parallel: int = 1) -> ModelLayers:
    """The linear layers of the model whose ``config.json`` is at ``where`` (or a directory
    holding it), as vLLM builds them on one of ``tensor_parallel`` ranks."""
    ranks = positive_int("--tensor-parallel", tensor_parallel, "a positive int")
    config = where if isinstance(where, ModelConfig) else read_config(where)
    model = meta_model(config)
    heads = output_heads(model)
    itemsize = config.dtype.itemsize
    scope: dict[str, Heads | None] = {}  # each module's heads: its own config's, or its parent's
    linears: dict[str, torch.nn.Linear] = {}
    splits: dict[str, Split] = {}
    routers_quantized = config.architectures[0] in QUANTIZED_ROUTERS
    kept: list[KeptLayer] = []
    experts: list[tuple[str, int]] = []
    expert_linears: dict[str, int] = {}  # each experts module's weights
    for name, module in model.named_modules():
        scope[name] = _own_heads(module) or scope.get(name.rpartition(".")[0])
        # A model's own module with 3-D weights holds experts; torch's (convolutions) do not.
        own = not type(module).__module__.startswith("torch.")
        big = [p for p in module.parameters(recurse=False) if p.dim() >= 3] if own else []
        if big:
            experts.append((name, sum(p.numel() for p in big)))
        reason = _kept_reason(name, module, heads, routers_quantized) if name else None
        weight = getattr(module, "weight", None)
        matrix = weight if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
        if reason is not None and matrix is not None:
            n, k = matrix.shape
            style = Split.VOCAB if name in heads else split_of(name) or Split.REPLICATED
            shape = _part(name, style, [n], k, ranks, scope[name])
            kept.append(KeptLayer(name, (sum(shape.sizes), shape.k), itemsize, reason))
        elif routers_quantized and _router(module) and matrix is not None:
            linears[name] = _stand_in(matrix, getattr(module, "bias", None))
            splits[name] = Split.REPLICATED  # GateLinear is a ReplicatedLinear
        elif isinstance(module, torch.nn.Linear):
            held = experts_module(name)
            if held is None:
                linears[name] = module
            else:  # one expert's: vLLM runs it in FusedMoE
                expert_linears[held] = expert_linears.get(held, 0) + module.weight.numel()
    layers = []
    for name, members, split in _groups(linears, splits):
        shards = [linears[m].out_features for m in members]
        k = linears[members[0]].in_features
        if any(linears[m].in_features != k for m in members):
            inputs = [linears[m].in_features for m in members]
            raise InvalidValueError(f"inputs (K) of the shards of {name}", inputs,
                                    "one K: vLLM fuses them into one layer")  # fmt: skip
        bias = any(linears[m].bias is not None for m in members)
        layers.append(Linear(name, members, split,
                             _part(name, split, shards, k, ranks, scope[members[0]]),
                             bias))  # fmt: skip
    uncovered = []
    for modules, reason in ((dict(experts), EXPERTS), (expert_linears, EXPERT_LINEARS)):
        if modules:
            elements = sum(modules.values())
            uncovered.append(UncoveredWeights(tuple(modules), elements, config.dtype, reason))
    return ModelLayers(config, ranks, tuple(layers), tuple(kept), tuple(uncovered), dict(linears))
