"""GPT-2's linears: transformers' ``Conv1D`` (``transformers.pytorch_utils``) computes
``x @ weight + bias`` with its weight stored K x N, transposed from ``nn.Linear``'s. vLLM
builds these layers as its own linears (``gpt2.py`` transposes the weights as it loads
them), so ``kernelpick plan`` plans them; kernelpick's conversions (``quantize_model``, the
transformers quantizer) swap exact ``nn.Linear`` only, so they keep each one and say why,
rather than passing it over in silence.
"""

from __future__ import annotations

import torch

__all__ = ["CONV1D_KEPT", "is_conv1d"]

CONV1D_KEPT = (
    "a transformers Conv1D (its weight stored K x N): kernelpick's conversions take "
    "nn.Linear only, so it stays in high precision (vLLM quantizes it)"
)


def is_conv1d(module: torch.nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D``, known by its class (transformers is
    not imported for it)."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")
