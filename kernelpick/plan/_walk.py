"""Every module of a transformers model on the meta device, sorted by what vLLM makes of it:
a linear layer (an ``nn.Linear``, or the linear vLLM builds for GPT-2's ``Conv1D`` and
for a router it quantizes), a layer it keeps in high precision, MoE experts it runs in
FusedMoE, an embedding, or a 2-D weight no table here places, which is never dropped
silently: ``Walk.stray`` lists it."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from kernelpick.integration.formats import OUTPUT_HEAD_KEPT, experts_module, is_conv1d
from kernelpick.plan._table import KEPT, ROUTER_KEPT, Heads, Split

__all__ = ["Walk", "walk"]


@attrs.frozen(eq=False)  # holds modules, compared by identity
class Walk:
    """A model's modules by what vLLM makes of them: ``linears`` (by name, the linear vLLM
    builds; ``splits`` for those whose split their kind says, not their name), ``kept``
    (name, N, K, why), ``experts`` and ``expert_linears`` (each experts module's weights),
    ``stray`` (each class's modules holding 2-D weights no rule places, and their
    weights), ``heads``, each module's attention heads (its config's, or its parent's),
    and ``not_built``, the parts ``walk``'s ``skip`` names, with their weights."""

    linears: Mapping[str, torch.nn.Linear]
    splits: Mapping[str, Split]
    kept: tuple[tuple[str, int, int, str], ...]
    experts: Mapping[str, int]
    expert_linears: Mapping[str, int]
    stray: Mapping[str, Mapping[str, int]]
    heads: Mapping[str, Heads | None]
    not_built: Mapping[str, int]  # each part vLLM does not build, and its weights


def _own_heads(module: torch.nn.Module) -> Heads | None:
    """The heads of the config ``module`` holds, if it holds one that has them: a LLaVA's
    vision tower and language model each hold their own sub-config."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return Heads(heads, kv) if isinstance(heads, int) and isinstance(kv, int) else None


def _router(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Router")  # transformers' MoE routers (no nn.Linear)


def _experts(name: str, module: torch.nn.Module) -> bool:
    # Fused experts by their class or name (MixtralExperts, GraniteMoeParallelExperts,
    # mlp.experts); other 3-D parameters (a ViT's cls_token, SigLIP's probe) are no experts.
    return "expert" in type(module).__name__.lower() or "expert" in name.rpartition(".")[2]


def _ends(name: str, tail: str) -> bool:
    return name == tail or name.endswith("." + tail)


def _kept_reason(name: str, router: bool, heads: set[str], routers_quantized: bool) -> str | None:
    if name in heads:
        return OUTPUT_HEAD_KEPT
    if router and not routers_quantized:
        return ROUTER_KEPT
    return next((why for tail, why in KEPT.items() if _ends(name, tail)), None)


def _meta_linear(weight: torch.Tensor, bias: object) -> torch.nn.Linear:
    """The linear vLLM builds for a module that is no nn.Linear in transformers, from its
    (N, K) ``weight``: what a checkpoint's layout matches its patterns against."""
    n, k = weight.shape
    return torch.nn.Linear(k, n, bias=isinstance(bias, torch.Tensor), device="meta")


def _linear(
    module: torch.nn.Module, matrix: torch.Tensor | None, router: bool, routers_quantized: bool
) -> torch.nn.Linear | None:
    """The linear vLLM builds for ``module``, or None: GPT-2's Conv1D layers are its
    QKVParallelLinear, Column- and RowParallelLinear (gpt2.py, which transposes their
    weights as it loads them), a router of QUANTIZED_ROUTERS its GateLinear."""
    if isinstance(module, torch.nn.Linear):
        return module
    if matrix is None:
        return None
    if is_conv1d(module):
        return _meta_linear(matrix.T, getattr(module, "bias", None))
    if routers_quantized and router:
        return _meta_linear(matrix, getattr(module, "bias", None))
    return None


def walk(
    model: torch.nn.Module, heads: set[str], routers_quantized: bool, skip: tuple[str, ...] = ()
) -> Walk:
    """``model``'s modules sorted (see ``Walk``); ``heads`` its output heads,
    ``routers_quantized`` whether vLLM builds its MoE routers with quant_config, and
    ``skip`` the top-level parts vLLM does not build (``NOT_BUILT``)."""
    linears: dict[str, torch.nn.Linear] = {}
    splits: dict[str, Split] = {}
    kept: list[tuple[str, int, int, str]] = []
    experts: dict[str, int] = {}
    expert_linears: dict[str, int] = {}
    stray: dict[str, dict[str, int]] = {}
    scope: dict[str, Heads | None] = {}
    routers: set[str] = set()
    not_built = {part: 0 for part in skip}
    for name, module in model.named_modules():
        part = name.partition(".")[0]
        if part in not_built:
            not_built[part] += sum(p.numel() for p in module.parameters(recurse=False))
            continue
        parent = name.rpartition(".")[0]
        scope[name] = _own_heads(module) or scope.get(parent)
        # A router's own linear (Afmoe's router.gate, LongcatFlash's router.classifier) is
        # the router: vLLM builds the whole as its GateLinear.
        router = _router(module) or (bool(name) and parent in routers)
        if router:
            routers.add(name)
        # A model's own module with 3-D weights; torch's (convolutions) have them too.
        own = not type(module).__module__.startswith("torch.")
        big = [p for p in module.parameters(recurse=False) if p.dim() >= 3] if own else []
        if big and _experts(name, module):
            experts[name] = sum(p.numel() for p in big)
        elif big:
            stray.setdefault(type(module).__name__, {})[name] = sum(p.numel() for p in big)
        reason = _kept_reason(name, router, heads, routers_quantized) if name else None
        weight = getattr(module, "weight", None)
        matrix = weight if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
        linear = _linear(module, matrix, router, routers_quantized)
        if reason is not None and matrix is not None:
            n, k = matrix.shape
            kept.append((name, n, k, reason))
        elif linear is not None:
            held = experts_module(name)
            if held is None:
                linears[name] = linear
                if router:
                    splits[name] = Split.REPLICATED  # GateLinear is a ReplicatedLinear
            else:  # one expert's: vLLM runs it in FusedMoE
                expert_linears[held] = expert_linears.get(held, 0) + linear.weight.numel()
        elif name not in experts and not isinstance(module, torch.nn.Embedding):
            matrices = [p.numel() for p in module.parameters(recurse=False) if p.dim() == 2]
            if matrices:
                of_class = stray.setdefault(type(module).__name__, {})
                of_class[name] = of_class.get(name, 0) + sum(matrices)
    built = {part: count for part, count in not_built.items() if count}
    return Walk(linears, splits, tuple(kept), experts, expert_linears, stray, scope, built)
