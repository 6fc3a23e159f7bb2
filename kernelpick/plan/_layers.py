"""A model's linear layers as vLLM builds them, from transformers' modules on the meta
device (sorted by ``walk``): fused by ``FUSED``, split by their ``Split`` over the
tensor-parallel ranks, the ones vLLM keeps in high precision apart, and the weights no
linear method runs (the MoE experts vLLM runs in FusedMoE, 2-D weights no table places)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import torch

from kernelpick.core import Dtype, InvalidValueError, KeptLayer, UncoveredWeights, positive_int
from kernelpick.integration.formats import EXPERT_LINEARS, FUSED_MOE, output_heads
from kernelpick.plan._config import ModelConfig, read_config
from kernelpick.plan._meta import meta_model
from kernelpick.plan._table import (
    FUSED,
    NOT_BUILT,
    NOT_BUILT_REASON,
    QUANTIZED_ROUTERS,
    Heads,
    Part,
    Split,
    packed_qkv,
    part,
    split_of,
)
from kernelpick.plan._walk import Walk, walk

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


def _groups(
    linears: Mapping[str, torch.nn.Linear], splits: Mapping[str, Split]
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


def _stray(walked: Walk, dtype: Dtype) -> Iterator[UncoveredWeights]:
    for cls, modules in walked.stray.items():
        why = (f"weights of {cls} modules, which no table of kernelpick plan says how "
               "vLLM builds: no kernel is chosen for them")  # fmt: skip
        yield UncoveredWeights(tuple(modules), sum(modules.values()), dtype, why)


def linear_layers(where: str | Path | ModelConfig, tensor_parallel: int = 1) -> ModelLayers:
    """The linear layers of the model whose ``config.json`` is at ``where`` (or a directory
    holding it), as vLLM builds them on one of ``tensor_parallel`` ranks. Every 2-D weight
    of the model is in a layer, a kept layer, an embedding or ``uncovered``."""
    ranks = positive_int("--tensor-parallel", tensor_parallel, "a positive int")
    config = where if isinstance(where, ModelConfig) else read_config(where)
    model = meta_model(config)
    heads = output_heads(model)
    architecture = config.architectures[0]
    skip = NOT_BUILT.get(architecture, ())
    walked = walk(model, heads, architecture in QUANTIZED_ROUTERS, skip)
    linears, scope = walked.linears, walked.heads
    kept = []
    for name, n, k, reason in walked.kept:
        style = Split.VOCAB if name in heads else split_of(name) or Split.REPLICATED
        shape = _part(name, style, [n], k, ranks, scope[name])
        kept.append(KeptLayer(name, (sum(shape.sizes), shape.k), config.dtype.itemsize, reason))
    layers = []
    for name, members, split in _groups(linears, walked.splits):
        shards = [linears[m].out_features for m in members]
        if split is Split.QKV and len(members) == 1:  # q, k and v in one module: GPT-2's c_attn
            shards = packed_qkv(name, shards[0], scope[name])
        k = linears[members[0]].in_features
        if any(linears[m].in_features != k for m in members):
            inputs = [linears[m].in_features for m in members]
            raise InvalidValueError(f"inputs (K) of the shards of {name}", inputs,
                                    "one K: vLLM fuses them into one layer")  # fmt: skip
        bias = any(linears[m].bias is not None for m in members)
        layers.append(Linear(name, members, split,
                             _part(name, split, shards, k, ranks, scope[members[0]]),
                             bias))  # fmt: skip
    uncovered = [
        UncoveredWeights(tuple(modules), sum(modules.values()), config.dtype, reason)
        for modules, reason in ((walked.experts, EXPERTS), (walked.expert_linears, EXPERT_LINEARS))
        if modules
    ]  # fmt: skip
    uncovered += _stray(walked, config.dtype)
    if walked.not_built:
        parts = walked.not_built
        uncovered.append(UncoveredWeights(tuple(parts), sum(parts.values()), config.dtype,
                                          NOT_BUILT_REASON))  # fmt: skip
    return ModelLayers(config, ranks, tuple(layers), tuple(kept), tuple(uncovered), dict(linears))
