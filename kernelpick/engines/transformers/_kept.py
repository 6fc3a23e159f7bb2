"""Which linears the transformers quantizer keeps in high precision, and why.

First the rules every conversion shares (``kept_reason``: what a swap would drop, the
output head, the model's fp32 modules), then ``modules_to_not_convert``, then a weight tied
to a module that stays. ``modules_to_not_convert`` None is the one default for the head:
the model's output heads stay (``output_heads``: ``get_output_embeddings()`` and
``lm_head``, whatever the head is called); a list, even an empty one, is used as given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernelpick.integration.convert import kept_reason
from kernelpick.integration.formats import fp32_modules, kept, output_heads

__all__ = ["Keep", "keep_rule"]

# Why a linear (by name) stays in high precision; None: it is quantized.
Keep = Callable[[str, torch.nn.Module], str | None]


def _tied(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter transformers ties (both ends), with why its linear is kept: the
    weight is shared with a module that stays in high precision, as ``quantize_model``
    keeps such a linear (it has no untie here)."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    reasons = {}
    for target, source in ((str(k), str(v)) for k, v in tied.items()):
        reasons[target] = f"its weight is tied to {source}, which stays in high precision"
        reasons[source] = f"its weight is tied to {target}, which stays in high precision"
    return reasons


def keep_rule(model: torch.nn.Module, patterns: Sequence[str] | None) -> Keep:
    """The rule for ``model`` (its meta skeleton) and the config's ``modules_to_not_convert``
    (``patterns``; None: the default, see the module)."""
    heads = output_heads(model) if patterns is None else set()
    fp32 = fp32_modules(model)
    tied = _tied(model)

    def reason(name: str, module: torch.nn.Module) -> str | None:
        why = kept_reason(name, module, heads, fp32)
        if why is None:
            matched = [pattern for pattern in patterns or () if kept(name, (pattern,))]
            why = f"modules_to_not_convert keeps it ({matched[0]!r})" if matched else None
        return why or tied.get(f"{name}.weight")

    return reason
