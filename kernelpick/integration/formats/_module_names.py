"""What a module is from its name alone, where no model is at hand to ask: a checkpoint's
headers hold tensor names, not modules (``kernelpick inspect``).

- ``experts_module``: the one fact ``kernelpick plan`` (on a model's modules) and
  ``inspect`` (on a checkpoint's names) share: the linears inside an MoE ``experts``
  module, one per expert (``mlp.experts.3.gate_proj``, Mixtral's
  ``block_sparse_moe.experts.3.w1``), are what vLLM runs in FusedMoE, which takes no
  linear method, so kernelpick chooses no kernel for them (``FUSED_MOE``).
- ``stand_in``: the module a stored 2-D weight is read as, for a ``Layout``'s ``role``:
  an embedding by the names transformers' models give them (``EMBEDDINGS``), an MoE
  block's router (``gate``, ``router`` beside its ``experts``: transformers' routers are
  no ``nn.Linear``), GPT-2's ``Conv1D`` by the names its model type gives them
  (``conv1d_names``), and an ``nn.Linear`` for any other. A name outside these rules is
  read as a linear: a compressed-tensors checkpoint that targets it and stores no scale
  for it is then refused, never passed over.
"""

from __future__ import annotations

from collections.abc import Container

import torch

from kernelpick.integration.formats._conv1d import Conv1D

__all__ = [
    "EMBEDDINGS",
    "EXPERT_LINEARS",
    "FUSED_MOE",
    "ROUTERS",
    "experts_module",
    "moe_block",
    "stand_in",
]

FUSED_MOE = (
    "vLLM runs them in FusedMoE, which takes no linear method, so kernelpick chooses no "
    "kernel for them"
)
EXPERT_LINEARS = f"MoE experts stored one linear layer per expert: {FUSED_MOE}"
_EXPERTS = "experts"
# The last part of an nn.Embedding's name in transformers' models: Llama's embed_tokens,
# GPT-2's wte and wpe, BERT's word, position and token-type embeddings, GPT-NeoX's embed_in,
# T5's shared and relative_attention_bias, Gemma 3n's embed_tokens_per_layer, SigLIP's
# position_embedding.
EMBEDDINGS = frozenset({
    "embed_tokens", "embed_positions", "embed_in", "embed_tokens_per_layer", "tok_embeddings",
    "word_embeddings", "position_embeddings", "token_type_embeddings", "position_embedding",
    "wte", "wpe", "shared", "relative_attention_bias",
})  # fmt: skip
# The last part of an MoE block's router, beside the block's experts.
ROUTERS = frozenset({"gate", "router"})


def _index(part: str) -> bool:
    return part.isascii() and part.isdigit()


def experts_module(name: str) -> str | None:
    """The MoE ``experts`` module that holds the module or tensor ``name`` as one expert's
    (an ``experts`` part followed by the expert's index), or None."""
    parts = name.split(".")
    for at in range(len(parts) - 1):
        if parts[at] == _EXPERTS and _index(parts[at + 1]):
            return ".".join(parts[: at + 1])
    return None


def moe_block(name: str, dims: int) -> str | None:
    """The MoE block (the parent of its ``experts``) a stored tensor ``name`` of ``dims``
    dimensions shows: one expert's (``experts_module``), or one of 3 or more dimensions
    under an ``experts`` part, all the experts fused in one (GPT-OSS's
    ``mlp.experts.gate_up_proj``, no ``experts.N`` names); None for any other."""
    held = experts_module(name)
    parts = name.split(".")[:-1]
    if held is None and dims >= 3 and _EXPERTS in parts:
        held = ".".join(parts[: parts.index(_EXPERTS) + 1])
    return None if held is None else held.rpartition(".")[0]


def _meta(module: type[torch.nn.Module], *sizes: int) -> torch.nn.Module:
    with torch.device("meta"):
        return module(*sizes)


# Read only for their classes (a role never changes a module): made once, with no data.
_EMBEDDING = _meta(torch.nn.Embedding, 1, 1)
_LINEAR = _meta(torch.nn.Linear, 1, 1)
_OTHER = torch.nn.Module()
_CONV1D = Conv1D()


def stand_in(
    name: str, moe_blocks: Container[str], conv1d: Container[str] = frozenset()
) -> torch.nn.Module:
    """The module the stored 2-D ``weight`` of module ``name`` is read as (see the module);
    ``moe_blocks`` are the modules that hold stored experts (the parents of
    ``experts_module``'s, or of an ``experts`` module storing them fused), ``conv1d`` the
    last parts of the names that are ``Conv1D`` in the model (``conv1d_names``)."""
    parent, _, last = name.rpartition(".")
    if last in EMBEDDINGS:
        return _EMBEDDING
    if last in ROUTERS and parent in moe_blocks:
        return _OTHER
    if last in conv1d:
        return _CONV1D
    return _LINEAR
