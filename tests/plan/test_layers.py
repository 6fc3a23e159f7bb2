"""kernelpick.plan.linear_layers: a model's layers as vLLM builds them, from its config on
the meta device: fused, split per rank, the kept ones with their reasons, the experts not
covered, and the configs refused (remote code, no transformers, keys given twice)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from kernelpick.core import InvalidValueError
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import EXPERT_LINEARS, OUTPUT_HEAD_KEPT
from kernelpick.plan import (
    EXPERTS,
    KEPT,
    ROUTER_KEPT,
    Split,
    TransformersUnavailableError,
    _layers,
    linear_layers,
)
from tests.support.model_configs import (
    CONFIGS,
    fixture_data,
    small_llama,
    small_llava,
    small_qwen3_moe,
    write_config,
)


def _shapes(where: Path | str, ranks: int = 1) -> dict[str, tuple[int, int]]:
    return {layer.name: layer.weight_shape for layer in linear_layers(where, ranks).layers}


@pytest.mark.slow
def test_llama_on_two_ranks_has_each_ranks_shapes() -> None:
    layers = linear_layers(CONFIGS / "llama-3-8b", 2)
    shapes = {layer.name: layer.weight_shape for layer in layers.layers}
    heads, kv_heads, head, hidden, inter = 32, 8, 128, 4096, 14336
    attn = "model.layers.0.self_attn"
    assert shapes[f"{attn}.qkv_proj"] == ((heads // 2 + 2 * kv_heads // 2) * head, hidden)
    assert shapes[f"{attn}.o_proj"] == (hidden, heads * head // 2)
    assert shapes["model.layers.0.mlp.gate_up_proj"] == (2 * inter // 2, hidden)
    assert shapes["model.layers.0.mlp.down_proj"] == (hidden, inter // 2)
    qkv = next(layer for layer in layers.layers if layer.name == f"{attn}.qkv_proj")
    assert qkv.part.sizes == (2048, 512, 512)
    assert qkv.part.checkpoint == (4096, 1024, 1024)
    assert len(layers.layers) == 4 * 32
    (head_layer,) = layers.kept
    assert (head_layer.name, head_layer.weight_shape) == ("lm_head", (128256 // 2, hidden))
    assert head_layer.reason == OUTPUT_HEAD_KEPT


def test_a_tensor_parallel_size_that_does_not_divide_is_refused(tmp_path: Path) -> None:
    where = write_config(tmp_path, small_llama())  # 4 heads, 2 KV heads
    with pytest.raises(InvalidValueError, match="attention heads, 4") as caught:
        linear_layers(where, 8)
    assert "model.layers.0.self_attn.qkv_proj" in str(caught.value)


def test_a_small_llama_fuses_qkv_and_gate_up_in_order(tmp_path: Path) -> None:
    layers = linear_layers(write_config(tmp_path, small_llama()))
    first = [(layer.name, layer.members, layer.split) for layer in layers.layers[:4]]
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    assert first == [
        (f"{attn}.qkv_proj", tuple(f"{attn}.{s}" for s in ("q_proj", "k_proj", "v_proj")),
         Split.QKV),
        (f"{attn}.o_proj", (f"{attn}.o_proj",), Split.ROW),
        (f"{mlp}.gate_up_proj", (f"{mlp}.gate_proj", f"{mlp}.up_proj"), Split.COLUMN),
        (f"{mlp}.down_proj", (f"{mlp}.down_proj",), Split.ROW),
    ]  # fmt: skip
    assert layers.layers[0].part.sizes == (256, 128, 128)
    assert layers.uncovered == ()


@pytest.mark.slow
def test_deepseek_v3_fuses_q_a_and_kv_a_keeps_routers_and_counts_its_experts() -> None:
    layers = linear_layers(CONFIGS / "deepseek-v3", 8)
    by_name = {layer.name: layer for layer in layers.layers}
    fused = by_name["model.layers.0.self_attn.fused_qkv_a_proj"]
    assert fused.split is Split.REPLICATED  # disable_tp=True: whole on every rank
    assert fused.part.sizes == (1536, 512 + 64)
    assert by_name["model.layers.0.self_attn.q_b_proj"].weight_shape == (128 * 192 // 8, 1536)
    assert by_name["model.layers.0.self_attn.o_proj"].weight_shape == (7168, 128 * 128 // 8)
    routers = [k for k in layers.kept if k.reason == ROUTER_KEPT]
    assert [k.name for k in routers] == [f"model.layers.{i}.mlp.gate" for i in range(3, 61)]
    assert {k.weight_shape for k in routers} == {(256, 7168)}
    (experts,) = layers.uncovered
    assert experts.reason == EXPERTS
    assert experts.names == tuple(f"model.layers.{i}.mlp.experts" for i in range(3, 61))
    assert experts.elements == 58 * 256 * 3 * 2048 * 7168  # gate_up [2I, H] and down [H, I]


def _mla(q_lora_rank: int | None) -> dict[str, object]:
    """DeepSeek-V3's attention and MoE sizes over two layers and eight experts."""
    data = fixture_data("deepseek-v3")
    data.pop("quantization_config")
    return {**data, "num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 8,
            "n_group": 1, "topk_group": 1, "q_lora_rank": q_lora_rank}  # fmt: skip


def test_without_q_lora_rank_kv_a_proj_stands_alone_at_576(tmp_path: Path) -> None:
    layers = linear_layers(write_config(tmp_path, _mla(None)))
    by_name = {layer.name: layer for layer in layers.layers}
    alone = by_name["model.layers.0.self_attn.kv_a_proj_with_mqa"]
    assert (alone.weight_shape, alone.split) == ((576, 7168), Split.REPLICATED)
    assert by_name["model.layers.0.self_attn.q_proj"].split is Split.COLUMN
    assert not any("fused_qkv_a_proj" in name for name in by_name)


def test_bert_fuses_query_key_value_and_keeps_its_pooler() -> None:
    layers = linear_layers(CONFIGS / "all-minilm-l6-v2", 2)
    first = layers.layers[0]
    assert first.name == "encoder.layer.0.attention.self.qkv_proj"
    assert (first.part.sizes, first.bias) == ((192, 192, 192), True)
    splits = {layer.name.split(".", 3)[-1]: layer.split for layer in layers.layers[:4]}
    assert splits == {"attention.self.qkv_proj": Split.QKV,
                      "attention.output.dense": Split.ROW,
                      "intermediate.dense": Split.COLUMN, "output.dense": Split.ROW}  # fmt: skip
    assert [(k.name, k.reason) for k in layers.kept] == [("pooler.dense", KEPT["pooler.dense"])]


def _mlp(k: int, n: int) -> torch.nn.ModuleDict:
    linear = torch.nn.Linear
    return torch.nn.ModuleDict(
        {"gate_proj": linear(k, n), "up_proj": linear(k, n), "down_proj": linear(n, k)}
    )


def test_experts_built_one_linear_each_are_not_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose experts are an nn.Linear each (as transformers built them before 5,
    and as checkpoints store them): vLLM runs them in FusedMoE all the same."""
    with torch.device("meta"):
        moe = torch.nn.ModuleDict({"experts": torch.nn.ModuleList([_mlp(64, 32) for _ in range(4)]),
                                   "shared_expert": _mlp(64, 96)})  # fmt: skip
        model = torch.nn.ModuleDict({"model": torch.nn.ModuleDict(
            {"layers": torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": moe})])})})  # fmt: skip
    monkeypatch.setattr(_layers, "meta_model", lambda config: model)
    layers = linear_layers(write_config(tmp_path, small_llama()))
    mlp = "model.layers.0.mlp"
    assert [layer.name for layer in layers.layers] == [
        f"{mlp}.shared_expert.gate_up_proj", f"{mlp}.shared_expert.down_proj",
    ]  # fmt: skip
    (experts,) = layers.uncovered
    assert (experts.names, experts.reason) == ((f"{mlp}.experts",), EXPERT_LINEARS)
    assert experts.elements == 4 * 3 * 64 * 32


def test_without_transformers_the_refusal_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = write_config(tmp_path, small_llama())
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    with pytest.raises(
        TransformersUnavailableError, match=r"pip install 'kernelpick\[transformers\]'"
    ):
        linear_layers(where)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        (
            {"model_type": "my_model", "auto_map": {"AutoModel": "modeling_my.MyModel"}},
            "model_type",
        ),
        ({"architectures": ["MyModelForCausalLM"]}, "architectures"),
        ({"architectures": ["AutoTokenizer"]}, "architectures"),  # a transformers name, no model
    ],
)
def test_a_model_transformers_does_not_implement_is_refused_never_run(
    tmp_path: Path, changes: dict[str, object], key: str
) -> None:
    where = write_config(tmp_path, small_llama(**changes))
    with pytest.raises(CheckpointError, match="trust_remote_code") as caught:
        linear_layers(where)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{"model_type": "llama", "model_type": "mistral"}', "given twice"),
        ("[1, 2]", "list"),
        ('{"architectures": ["LlamaForCausalLM"]}', "None"),
        (
            '{"model_type": "llama", "architectures": ["LlamaForCausalLM"], '
            '"torch_dtype": "float8_e4m3fn"}',
            "float8_e4m3fn",
        ),
    ],
)
def test_a_config_that_could_be_read_two_ways_or_not_at_all_is_refused(
    tmp_path: Path, text: str, found: str
) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=found):
        linear_layers(tmp_path)


@pytest.mark.parametrize("architectures", [None, [], [""]])
def test_a_config_naming_no_architecture_is_refused_not_built_as_a_bare_backbone(
    tmp_path: Path, architectures: list[str] | None
) -> None:
    data = small_llama(architectures=architectures)
    if architectures is None:
        data.pop("architectures")
    where = write_config(tmp_path, data)
    with pytest.raises(CheckpointError, match="LlamaForCausalLM") as caught:
        linear_layers(where)
    assert (caught.value.key, str(where) in str(caught.value)) == ("architectures", True)


def test_each_sub_model_splits_its_qkv_by_its_own_configs_heads(tmp_path: Path) -> None:
    """A LLaVA's vision tower has 4 heads and no KV heads of its own; its language model 2
    KV heads for 4: each qkv_proj is split by its own sub-config, not the text config's."""
    layers = linear_layers(write_config(tmp_path, small_llava()))
    parts = {layer.name: layer.part.sizes for layer in layers.layers if "qkv" in layer.name}
    assert parts == {
        "model.vision_tower.encoder.layers.0.self_attn.qkv_proj": (64, 64, 64),
        "model.language_model.layers.0.self_attn.qkv_proj": (256, 128, 128),
    }


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_router_vllm_gives_the_quant_config_is_a_replicated_layer(
    tmp_path: Path, ranks: int
) -> None:
    """Qwen3-MoE's routers: vLLM builds them (GateLinear, replicated) with the model's
    quant_config, so they are planned as layers; DeepSeek's it builds without one."""
    layers = linear_layers(write_config(tmp_path, small_qwen3_moe()), ranks)
    routers = [(layer.name, layer.split, layer.weight_shape) for layer in layers.layers
               if layer.name.endswith(".gate")]  # fmt: skip
    assert routers == [(f"model.layers.{i}.mlp.gate", Split.REPLICATED, (4, 256)) for i in (0, 1)]
    assert [layer.name for layer in layers.kept] == ["lm_head"]
    deepseek = linear_layers(write_config(tmp_path / "deepseek", _mla(1536)), ranks)
    assert [(k.name, k.reason) for k in deepseek.kept if k.name.endswith(".gate")] == [
        ("model.layers.1.mlp.gate", ROUTER_KEPT)
    ]
    assert not [layer for layer in deepseek.layers if layer.name.endswith(".gate")]
