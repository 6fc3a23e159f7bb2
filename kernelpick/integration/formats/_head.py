"""The output head: the one default every engine applies to it. It stays in high precision
unless asked otherwise, in ``quantize_model`` (``quantize_head=True``), the transformers
quantizer (``modules_to_not_convert``) and the vLLM plugin (whose ``ParallelLMHead`` is no
linear layer a quantization method gets), because llmcompressor's presets ignore
``lm_head``, and the head's logits feed sampling directly."""

from __future__ import annotations

import torch

from kernelpick.integration.formats._patterns import kept

__all__ = ["HEAD_PATTERNS", "OUTPUT_HEAD_KEPT", "output_heads"]

# transformers' modules_to_not_convert default, read by its pattern rule (``kept``).
HEAD_PATTERNS = ("lm_head",)

OUTPUT_HEAD_KEPT = (
    "the output head, kept in high precision by default (quantize_head=True, or an "
    "engine config's modules_to_not_convert without it, quantizes it)"
)


def output_heads(model: torch.nn.Module) -> set[str]:
    """The names of ``model``'s output head: the module a transformers model's
    ``get_output_embeddings()`` returns, at every path it is reachable by, and every
    module ``HEAD_PATTERNS`` keep."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    names = set()
    for name, module in model.named_modules(remove_duplicate=False):
        if (head is not None and module is head) or (name and kept(name, HEAD_PATTERNS)):
            names.add(name)
    return names
