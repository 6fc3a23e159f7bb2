"""What a module is from its name alone: the experts vLLM runs in FusedMoE (an ``experts``
part followed by an expert's index), and the module a stored weight is read as (an
embedding, an MoE block's router, GPT-2's Conv1D by its model type, or a linear)."""

from __future__ import annotations

import pytest
import torch

from kernelpick.integration.formats import (
    Conv1D,
    conv1d_names,
    experts_module,
    is_conv1d,
    moe_block,
    stand_in,
)

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
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias", torch.nn.Embedding),  # T5
    ("transformer.h.0.attn.c_attn", torch.nn.Linear),  # no Conv1D in this model type
]


@pytest.mark.parametrize(("name", "kind"), STAND_INS, ids=[name for name, _ in STAND_INS])
def test_a_stored_weight_is_read_as_the_module_its_name_says(
    name: str, kind: type[torch.nn.Module]
) -> None:
    assert type(stand_in(name, BLOCKS)) is kind


def test_gpt2s_names_are_conv1d_in_its_model_types_only() -> None:
    """transformers' GPT-2 family builds c_attn, q_attn, c_proj and c_fc as Conv1D; other
    models (gpt_bigcode, starcoder2) build nn.Linear of the same names."""
    family: list[dict[str, object]] = [
        {"model_type": "gpt2"}, {"model_type": "openai-gpt"},
        {"model_type": "vision-encoder-decoder", "decoder": {"model_type": "gpt2"}},
    ]  # fmt: skip
    for config in family:
        names = conv1d_names(config)
        for name in ("transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_proj"):
            assert is_conv1d(stand_in(name, BLOCKS, names))
        assert type(stand_in("lm_head", BLOCKS, names)) is torch.nn.Linear
    others: list[dict[str, object]] = [
        {"model_type": "gpt_bigcode"}, {"model_type": "starcoder2"}, {}, {"model_type": ["gpt2"]},
    ]  # fmt: skip
    for config in others:
        assert type(stand_in("transformer.h.0.attn.c_attn", BLOCKS, conv1d_names(config))) is (
            torch.nn.Linear
        )
    assert type(stand_in("h.0.attn.c_attn", BLOCKS, conv1d_names({"model_type": "gpt2"}))) is (
        Conv1D
    )


MOE_BLOCKS = [
    ("model.layers.0.mlp.experts.3.gate_proj.weight", 2, "model.layers.0.mlp"),
    ("model.layers.0.mlp.experts.gate_up_proj", 3, "model.layers.0.mlp"),  # GPT-OSS, fused
    ("model.layers.0.mlp.experts.gate_up_proj_bias", 2, None),  # 2-D: no stored experts
    ("model.layers.0.mlp.router.weight", 2, None),
    ("model.layers.0.conv.weight", 3, None),  # no experts part
    ("experts.down_proj", 3, ""),  # the model's root holds them
]


@pytest.mark.parametrize(("name", "dims", "block"), MOE_BLOCKS, ids=[n for n, _, _ in MOE_BLOCKS])
def test_an_moe_block_holds_stored_experts_one_by_one_or_fused(
    name: str, dims: int, block: str | None
) -> None:
    assert moe_block(name, dims) == block
