"""The fusing and splitting table of kernelpick.plan (_table), by example: which layers vLLM
fuses, how each is split over tensor-parallel ranks, and the sizes refused."""

from __future__ import annotations

import pytest

from kernelpick.core import InvalidValueError
from kernelpick.plan import FUSED, Heads, Part, Split
from kernelpick.plan._table import part, split_of


@pytest.mark.parametrize(
    ("shards", "fused", "split"),
    [
        (("q_proj", "k_proj", "v_proj"), "qkv_proj", Split.QKV),
        (("gate_proj", "up_proj"), "gate_up_proj", Split.COLUMN),
        (("q_a_proj", "kv_a_proj_with_mqa"), "fused_qkv_a_proj", Split.REPLICATED),
        (("query", "key", "value"), "qkv_proj", Split.QKV),
    ],
)
def test_the_fusing_table_says_what_vllm_fuses(
    shards: tuple[str, ...], fused: str, split: Split
) -> None:
    assert any(row.shards == shards and row.name == fused and row.split is split for row in FUSED)


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("model.layers.0.self_attn.o_proj", Split.ROW),
        ("model.layers.0.mlp.down_proj", Split.ROW),
        ("model.layers.0.self_attn.q_b_proj", Split.COLUMN),
        ("model.layers.0.self_attn.kv_b_proj", Split.COLUMN),
        ("model.layers.0.self_attn.kv_a_proj_with_mqa", Split.REPLICATED),
        ("encoder.layer.0.attention.output.dense", Split.ROW),  # the longest ending wins
        ("encoder.layer.0.intermediate.dense", Split.COLUMN),
        ("encoder.layer.0.output.dense", Split.ROW),
        ("lm_head", Split.VOCAB),
        ("model.layers.0.mlp.experts_proj", None),
    ],
)
def test_each_layer_is_split_by_the_end_of_its_name(name: str, split: Split | None) -> None:
    assert split_of(name) is split


LLAMA_8B = Heads(32, 8)


def test_qkv_splits_heads_and_kv_heads_per_rank() -> None:
    got = part("qkv", Split.QKV, [4096, 1024, 1024], 4096, 2, LLAMA_8B)
    assert got == Part((2048, 512, 512), 4096, (4096, 1024, 1024), 4096, 6144)


def test_qkv_replicates_kv_heads_when_fewer_than_the_ranks() -> None:
    # 8 KV heads on 16 ranks: one KV head each (QKVParallelLinear's num_kv_head_replicas 2).
    got = part("qkv", Split.QKV, [4096, 1024, 1024], 4096, 16, LLAMA_8B)
    assert got.sizes == (256, 128, 128)
    assert got.checkpoint == (4096, 1024, 1024)


def test_row_parallel_splits_k_column_parallel_every_shard_and_replicated_nothing() -> None:
    assert part("o", Split.ROW, [4096], 4096, 4, None).k == 1024
    assert part("gu", Split.COLUMN, [14336, 14336], 4096, 4, None).sizes == (3584, 3584)
    assert part("r", Split.REPLICATED, [2112], 7168, 4, None) == Part(
        (2112,), 7168, (2112,), 7168, 2112
    )


def test_the_vocabulary_is_padded_to_64_then_split() -> None:
    assert part("lm_head", Split.VOCAB, [151655], 896, 2, None).sizes == (75840,)


@pytest.mark.parametrize(
    ("split", "shards", "k", "ranks", "heads", "what"),
    [
        (Split.QKV, [3584, 512, 512], 3584, 8, Heads(28, 4), "attention heads, 28"),
        (Split.QKV, [4096, 1536, 1536], 4096, 8, Heads(32, 12), "KV heads, 12"),
        (Split.QKV, [4096, 768, 768], 4096, 4, Heads(32, 6), "KV heads, 6"),
        (Split.QKV, [4096, 384, 384], 4096, 4, Heads(32, 3), "3 KV heads"),
        (Split.ROW, [3584], 18944, 3, None, "K, 18944"),
        (Split.COLUMN, [18944, 18944], 3584, 3, None, "N, 18944"),
    ],
)
def test_a_size_that_does_not_divide_is_refused_naming_the_layer_and_sizes(
    split: Split, shards: list[int], k: int, ranks: int, heads: Heads | None, what: str
) -> None:
    with pytest.raises(InvalidValueError, match=what) as caught:
        part("model.layers.0.x", split, shards, k, ranks, heads)
    assert "model.layers.0.x" in str(caught.value)
