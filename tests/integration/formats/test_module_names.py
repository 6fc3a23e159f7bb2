"""What a module is from its name alone: the experts vLLM runs in FusedMoE (an ``experts``
part followed by an expert's index), and the module a stored weight is read as (an
embedding, an MoE block's router, or a linear)."""

from __future__ import annotations

import pytest
import torch

from kernelpick.integration.formats import experts_module, stand_in

EXPERTS = [
    ("model.layers.0.mlp.experts.3.gate_proj", "model.layers.0.mlp.experts"),
    ("model.layers.0.mlp.experts.3.gate_proj.weight_scale", "model.layers.0.mlp.experts"),
    ("model.layers.7.block_sparse_moe.experts.12.w1.weight",
     "model.layers.7.block_sparse_moe.experts"),  # Mixtral's
    ("model.layers.0.mlp.experts.0", "model.layers.0.mlp.experts"),
    ("model.layers.0.mlp.shared_experts.gate_proj", None),  # DeepSeek's: plain linears
    ("model.layers.0.mlp.shared_expert.gate_proj", None),  # Qwen2-MoE's
    ("model.layers.0.mlp.experts.gate_up_proj", None),  # no expert's index
    ("model.layers.0.mlp.experts", None),
    ("model.layers.0.mlp.experts.٣.w1", None),  # an Arabic-Indic digit is no index
    ("model.layers.0.experts_proj.0.w1", None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "held"), EXPERTS, ids=[name for name, _ in EXPERTS])
def test_an_experts_part_followed_by_an_index_is_one_experts(name: str, held: str | None) -> None:
    assert experts_module(name) == held


BLOCKS = {"model.layers.0.mlp", "model.layers.0.block_sparse_moe"}
STAND_INS = [
    ("model.embed_tokens", torch.nn.Embedding),
    ("transformer.wte", torch.nn.Embedding),
    ("bert.embeddings.word_embeddings", torch.nn.Embedding),
    ("model.layers.0.mlp.gate", torch.nn.Module),  # a router beside stored experts
    ("model.layers.0.block_sparse_moe.gate", torch.nn.Module),
    ("model.layers.1.mlp.gate", torch.nn.Linear),  # no experts beside it
    ("model.layers.0.mlp.shared_expert_gate", torch.nn.Linear),
    ("model.layers.0.mlp.down_proj", torch.nn.Linear),
    ("lm_head", torch.nn.Linear),
    ("model.embed_proj", torch.nn.Linear),  # not an embedding's name: read as a linear
]


@pytest.mark.parametrize(("name", "kind"), STAND_INS, ids=[name for name, _ in STAND_INS])
def test_a_stored_weight_is_read_as_the_module_its_name_says(
    name: str, kind: type[torch.nn.Module]
) -> None:
    assert type(stand_in(name, BLOCKS)) is kind
