"""How vLLM builds a transformers model's linear layers, as tables: which it fuses into one
layer (q/k/v, gate/up, DeepSeek's q_a/kv_a), how each is split over tensor-parallel ranks,
and which it keeps in high precision whatever the quantization. Read from vLLM's model
code (llama.py, qwen2.py, qwen3.py, qwen3_moe.py, gemma2.py, bert.py, deepseek_v2.py and
linear.py, vocab_parallel_embedding.py; vLLM 0.33).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from kernelpick.core import InvalidValueError

__all__ = [
    "FUSED",
    "KEPT",
    "NOT_BUILT",
    "NOT_BUILT_REASON",
    "QUANTIZED_ROUTERS",
    "ROUTER_KEPT",
    "SPLITS",
    "Fused",
    "Heads",
    "Part",
    "Split",
    "packed_qkv",
    "part",
    "split_of",
]


class Split(enum.Enum):
    """How vLLM splits a layer over ``N`` tensor-parallel ranks."""

    COLUMN = "column"  # ColumnParallelLinear, MergedColumnParallelLinear: each shard's N / N
    ROW = "row"  # RowParallelLinear: K / N
    QKV = "qkv"  # QKVParallelLinear: heads / N; KV heads / N, or one each when fewer
    REPLICATED = "replicated"  # ReplicatedLinear, or a layer built with disable_tp
    VOCAB = "vocab"  # ParallelLMHead: the vocabulary padded to a multiple of 64, then / N

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class Fused:
    """vLLM's one layer ``name`` made of a parent's ``shards`` (in its shard order), split
    as ``split``. It applies only where the parent holds every shard."""

    name: str
    shards: tuple[str, ...]
    split: Split


FUSED = (
    Fused("qkv_proj", ("q_proj", "k_proj", "v_proj"), Split.QKV),  # QKVParallelLinear
    Fused("gate_up_proj", ("gate_proj", "up_proj"), Split.COLUMN),  # MergedColumnParallelLinear
    # DeepSeek-V2/V3 MLA with q_lora_rank: DeepSeekV2FusedQkvAProjLinear, disable_tp=True.
    Fused("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"), Split.REPLICATED),
    Fused("qkv_proj", ("query", "key", "value"), Split.QKV),  # BERT's attention.self
)

# Every other layer by the end of its name (the longest that matches wins).
SPLITS = {
    "o_proj": Split.ROW,
    "down_proj": Split.ROW,
    "q_proj": Split.COLUMN,  # MLA without q_lora_rank
    "q_b_proj": Split.COLUMN,
    "kv_b_proj": Split.COLUMN,
    "kv_a_proj_with_mqa": Split.REPLICATED,  # MLA without q_lora_rank: N = 576 alone
    "attention.output.dense": Split.ROW,  # BERT's BertSelfOutput
    "intermediate.dense": Split.COLUMN,  # BERT's BertIntermediate
    "output.dense": Split.ROW,  # BERT's BertOutput
    "lm_head": Split.VOCAB,
    # GPT-2's Conv1D layers (gpt2.py): q, k and v in one module, its projection, its MLP.
    "attn.c_attn": Split.QKV,
    "attn.c_proj": Split.ROW,
    "mlp.c_fc": Split.COLUMN,
    "mlp.c_proj": Split.ROW,
}

ROUTER_KEPT = (
    "an MoE router: kept in high precision, as vLLM builds this model's routers (GateLinear) "
    "without a quantization config"
)
# vLLM 0.33 gives these routers quant_config: qwen3_moe.py (reused by qwen3_vl_moe.py), lfm2_moe.py
# and qwen3_omni_moe_thinker.py, which builds the thinker on qwen3_moe's Qwen3MoeModel.
QUANTIZED_ROUTERS = frozenset({
    "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Lfm2MoeForCausalLM",
    "Qwen3OmniMoeForConditionalGeneration",
})  # fmt: skip
# The parts of a transformers model vLLM never builds for an architecture: its loader maps
# their weights to None (hf_to_vllm_mapper of qwen2_5_omni_thinker.py and
# qwen3_omni_moe_thinker.py: vLLM serves the thinker alone).
NOT_BUILT = {
    "Qwen2_5OmniForConditionalGeneration": ("talker", "token2wav"),
    "Qwen3OmniMoeForConditionalGeneration": ("talker", "code2wav"),
}
NOT_BUILT_REASON = "parts vLLM does not build for this architecture (its loader drops them)"
# Linears vLLM builds without a quantization config, or as a plain nn.Linear no
# quantization method gets, by the end of their name; routers that are no nn.Linear in
# transformers (its *Router modules) are found by their class, and kept unless their
# architecture is in QUANTIZED_ROUTERS.
KEPT = {
    "shared_expert_gate": ROUTER_KEPT,
    "pooler.dense": "the pooler: vLLM builds it as a plain nn.Linear, which no quantization "
    "method gets",
    # bert.py's BertForSequenceClassification and token classification: ReplicatedLinear(...)
    # with no quant_config.
    "classifier": "a classification head: vLLM builds it without a quantization config",
}

_VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def split_of(name: str) -> Split | None:
    """The split of the layer ``name`` by ``SPLITS`` (None: not in the table)."""
    parts = name.split(".")
    for start in range(len(parts)):
        found = SPLITS.get(".".join(parts[start:]))
        if found is not None:
            return found
    return None


@attrs.frozen
class Heads:
    """The attention heads a QKV layer splits by: query heads and KV heads."""

    heads: int
    kv_heads: int


@attrs.frozen
class Part:
    """One rank's part of a layer: each shard's rows on the rank (``sizes``, vLLM's
    ``output_partition_sizes``), its ``k`` (``input_size_per_partition``), and the
    whole layer's: each shard's rows in the checkpoint (``checkpoint``), ``input_size`` and
    ``output_size``, as vLLM's linear layers state them."""

    sizes: tuple[int, ...]
    k: int
    checkpoint: tuple[int, ...]
    input_size: int
    output_size: int


def _divide(layer: str, what: str, size: int, ranks: int) -> int:
    if size % ranks:
        raise InvalidValueError(
            f"--tensor-parallel for {layer}", ranks,
            f"a divisor of its {what}, {size}: vLLM splits it evenly over the ranks",
        )  # fmt: skip
    return size // ranks


def part(
    layer: str, split: Split, shards: Sequence[int], k: int, ranks: int, heads: Heads | None
) -> Part:
    """``layer``'s part on one of ``ranks`` tensor-parallel ranks (a shard of ``shards``
    rows each, ``k`` inputs), or ``InvalidValueError`` naming the size that does not divide."""
    rows = tuple(shards)
    match split:
        case Split.REPLICATED:
            return Part(rows, k, rows, k, sum(rows))
        case Split.ROW:
            return Part(rows, _divide(layer, "K", k, ranks), rows, k, sum(rows))
        case Split.COLUMN:
            sizes = tuple(_divide(layer, "N", n, ranks) for n in rows)
            return Part(sizes, k, rows, k, sum(sizes) * ranks)
        case Split.VOCAB:
            padded = -(-sum(rows) // _VOCAB_PADDING) * _VOCAB_PADDING
            size = _divide(
                layer, f"vocabulary padded to a multiple of {_VOCAB_PADDING}", padded, ranks
            )
            return Part((size,), k, rows, k, padded)
        case Split.QKV:
            return _qkv(layer, rows, k, ranks, heads)


def packed_qkv(layer: str, rows: int, heads: Heads | None) -> list[int]:
    """The q, k and v rows of ``layer``, one module of ``rows`` rows holding all three
    (GPT-2's c_attn), by its ``heads``."""
    per_head = None if heads is None else heads.heads + 2 * heads.kv_heads
    if heads is None or per_head is None or rows % per_head:
        raise InvalidValueError(f"rows of {layer}", rows,
                                "q, k and v of the config's attention heads")  # fmt: skip
    size = rows // per_head
    return [heads.heads * size, heads.kv_heads * size, heads.kv_heads * size]


def _qkv(layer: str, rows: tuple[int, ...], k: int, ranks: int, heads: Heads | None) -> Part:
    if heads is None or len(rows) != 3 or rows[0] % heads.heads:
        raise InvalidValueError(f"shards of {layer}", list(rows),
                                "q, k and v of the config's attention heads")  # fmt: skip
    size = rows[0] // heads.heads
    if rows[1] != heads.kv_heads * size or rows[2] != rows[1]:
        raise InvalidValueError(
            f"shards of {layer}", list(rows),
            f"k and v of num_key_value_heads ({heads.kv_heads}) x head size {size}",
        )  # fmt: skip
    per_rank = _divide(layer, "attention heads", heads.heads, ranks)
    if heads.kv_heads >= ranks:
        kv = _divide(layer, "KV heads", heads.kv_heads, ranks)
    elif ranks % heads.kv_heads:
        raise InvalidValueError(
            f"--tensor-parallel for {layer}", ranks,
            f"a multiple of its {heads.kv_heads} KV heads: vLLM replicates each KV head "
            "over the same number of ranks when there are fewer KV heads than ranks",
        )  # fmt: skip
    else:  # QKVParallelLinear's num_kv_head_replicas = ranks / kv_heads
        kv = 1
    sizes = (per_rank * size, kv * size, kv * size)
    return Part(sizes, k, rows, k, sum(sizes) * ranks)
