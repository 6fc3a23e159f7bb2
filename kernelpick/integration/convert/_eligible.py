"""Which linears of a model ``quantize_model`` converts: every exact ``nn.Linear`` at every
path it is reachable by, less the ones kept in high precision (the output head, ``skip``,
a transformers model's fp32 modules, a weight tied to a module that stays), each kept one
with its reason."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from kernelpick.integration.convert._report import SkippedLayer
from kernelpick.integration.convert._swap import dropped_by_swap
from kernelpick.integration.formats import (
    CONV1D_KEPT,
    OUTPUT_HEAD_KEPT,
    fp32_modules,
    is_conv1d,
    output_heads,
)
from kernelpick.integration.formats import kept as kept_by

__all__ = ["Found", "Skip", "eligible_linears", "kept_reason", "weight_groups"]

Skip = Callable[[str, torch.nn.Module], bool]

Found = tuple[torch.nn.Linear, tuple[str, ...]]  # a linear, and every path to it


def kept_reason(
    name: str, linear: torch.nn.Module, heads: Collection[str], fp32: Sequence[str]
) -> str | None:
    """Why every conversion leaves ``linear`` (at ``name``) in high precision, by the rules
    they all share, first match first: it is transformers' ``Conv1D``, which no swap takes
    (``CONV1D_KEPT``), it holds what a swap would drop, it is an output head kept
    (``heads``: ``output_heads`` of the model, or none), or the model keeps it in fp32
    (``fp32``: ``fp32_modules``). None where none of them keeps it."""
    if is_conv1d(linear):
        return CONV1D_KEPT
    extra = dropped_by_swap(linear)
    if extra:
        return f"it also holds {', '.join(extra)}, which a QuantizedLinear would drop"
    if name in heads:
        return OUTPUT_HEAD_KEPT
    if fp32 and kept_by(name, fp32):
        return "the model keeps it in fp32 (_keep_in_fp32_modules)"
    return None


def eligible_linears(
    model: torch.nn.Module, skip: Skip | None, quantize_head: bool
) -> tuple[list[Found], list[SkippedLayer]]:
    """Each eligible linear with every path to it, and the linears kept: the output head
    (unless ``quantize_head``), those ``skip`` keeps and those a transformers model keeps
    in fp32. Only exact ``nn.Linear``: subclasses such as MultiheadAttention's
    ``out_proj`` are read by their owners as linears; transformers' ``Conv1D`` (GPT-2's
    linears) is kept (``kept_reason``). A module kept at one path is kept at all of
    them."""
    found: dict[int, tuple[torch.nn.Linear, list[str]]] = {}
    kept: set[int] = set()
    skipped: list[SkippedLayer] = []
    fp32 = fp32_modules(model)
    heads = set() if quantize_head else output_heads(model)
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module) is not torch.nn.Linear and not is_conv1d(module):
            continue
        why = kept_reason(name, module, heads, fp32)
        if not why and skip is not None and skip(name, module):
            why = "skip() kept it"
        if why:
            kept.add(id(module))
            skipped.append(SkippedLayer(name, why))
        else:
            found.setdefault(id(module), (module, []))[1].append(name)
    linears = [(module, tuple(paths)) for key, (module, paths) in found.items() if key not in kept]
    return linears, skipped


def _weight_owners(model: torch.nn.Module) -> dict[int, list[tuple[str, torch.nn.Module]]]:
    """For each parameter, every module holding it and the path it is held by."""
    owners: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for key, param in module._parameters.items():
            if param is not None:
                path = f"{name}.{key}" if name else key
                owners.setdefault(id(param), []).append((path, module))
    return owners


def weight_groups(
    model: torch.nn.Module, linears: list[Found], untie: bool
) -> tuple[list[list[Found]], list[SkippedLayer]]:
    """The linears grouped by the weight they share (one group per weight), and the groups
    left alone because a module that stays in high precision shares their weight."""
    owners = _weight_owners(model)
    by_weight: dict[int, list[Found]] = {}
    for found in linears:
        by_weight.setdefault(id(found[0].weight), []).append(found)
    groups: list[list[Found]] = []
    skipped: list[SkippedLayer] = []
    for key, group in by_weight.items():
        members = {id(module) for module, _ in group}
        others = [(path, m) for path, m in owners[key] if id(m) not in members]
        if others and not untie:
            path, other = others[0]
            reason = (
                f"its weight is tied to {path} ({type(other).__name__}), which stays in high "
                "precision; untie=True converts a separate FP8 copy"
            )
            skipped.extend(SkippedLayer(paths[0], reason) for _, paths in group)
        else:
            groups.append(group)
    return groups, skipped
