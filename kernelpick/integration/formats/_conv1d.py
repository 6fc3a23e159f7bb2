"""GPT-2's linears: transformers' ``Conv1D`` (``transformers.pytorch_utils``) computes
``x @ weight + bias`` with its weight stored K x N, transposed from ``nn.Linear``'s. vLLM
builds these layers as its own linears (``gpt2.py`` transposes the weights as it loads
them), so ``kernelpick plan`` plans them; kernelpick's conversions (``quantize_model``, the
transformers quantizer, ``load_quantized``) swap exact ``nn.Linear`` only, so they keep
each one and say why (``CONV1D_KEPT``), rather than passing it over in silence.
``inspect``, which has names and a config.json but no modules, knows them by the model
type (``conv1d_names``) and reads each as ``Conv1D``, a stand-in of the same class name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["CONV1D_KEPT", "Conv1D", "conv1d_names", "is_conv1d"]

CONV1D_KEPT = (
    "a transformers Conv1D (its weight stored K x N): kernelpick's conversions take "
    "nn.Linear only, so it stays in high precision (vLLM quantizes it)"
)
# The model types whose modules of these names are Conv1D (transformers' modeling_gpt2.py,
# modeling_openai.py, modeling_imagegpt.py, modeling_decision_transformer.py and
# modeling_clvp.py's decoder MLP): other models use the same names for nn.Linear
# (gpt_bigcode, starcoder2), so a name alone does not say it.
CONV1D_MODELS = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer", "clvp",
                           "clvp_decoder"})  # fmt: skip
CONV1D_NAMES = frozenset({"c_attn", "q_attn", "c_proj", "c_fc"})


class Conv1D(torch.nn.Module):
    """Stands in for transformers' ``Conv1D`` where only its name is known (``inspect``):
    named as it is, so a compressed-tensors target naming the class matches both alike."""


def is_conv1d(module: torch.nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D``, known by its class (transformers is
    not imported for it), or its stand-in."""
    cls = type(module)
    named = cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")
    return cls is Conv1D or named


def _model_types(config: Mapping[str, object]) -> set[str]:
    """The ``model_type`` of a config.json and of each sub-config in it (an encoder-decoder's
    ``decoder``, a multimodal model's ``text_config``), walked without recursion: the
    config is untrusted and may nest deeply."""
    types: set[str] = set()
    pending: list[Mapping[str, object]] = [config]
    while pending:
        mapping = pending.pop()
        kind = mapping.get("model_type")
        types |= {kind} if isinstance(kind, str) else set()
        pending += (value for value in mapping.values() if isinstance(value, Mapping))
    return types


def conv1d_names(config: Mapping[str, object]) -> frozenset[str]:
    """The last parts of the module names that are ``Conv1D`` in the model config.json
    ``config`` describes: ``CONV1D_NAMES`` where it (or a sub-config) is of a Conv1D model
    type, none otherwise."""
    return CONV1D_NAMES if _model_types(config) & CONV1D_MODELS else frozenset()
