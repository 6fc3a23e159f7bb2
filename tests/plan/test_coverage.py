"""Every 2-D weight of a model is in a planned layer, a kept layer or an embedding, or is
listed as not covered: GPT-2's Conv1D layers are planned as vLLM's gpt2.py builds them,
and a 2-D weight no rule places is listed with its class, never dropped silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from kernelpick.integration import CheckpointError
from kernelpick.plan import Split, _layers, linear_layers, meta_model, read_config
from kernelpick.plan._table import NOT_BUILT_REASON, ROUTER_KEPT
from tests.support.model_configs import (
    CONFIGS,
    fixture_data,
    small_gpt2,
    small_llama,
    small_llava,
    small_qwen3_moe,
    write_config,
)


@pytest.mark.parametrize("ranks", [1, 2])
def test_gpt2s_conv1d_layers_are_planned_as_vllm_builds_them(tmp_path: Path, ranks: int) -> None:
    """Conv1D stores its weight K x N; vLLM builds c_attn as a QKVParallelLinear (q, k and
    v of 4 heads of 16 in one module), c_proj row- and c_fc column-parallel."""
    layers = linear_layers(write_config(tmp_path, small_gpt2()), ranks)
    h = "transformer.h.0"
    first = {layer.name: (layer.split, layer.part.sizes, layer.part.k, layer.bias)
             for layer in layers.layers if layer.name.startswith(f"{h}.")}  # fmt: skip
    assert first == {
        f"{h}.attn.c_attn": (Split.QKV, (64 // ranks,) * 3, 64, True),
        f"{h}.attn.c_proj": (Split.ROW, (64,), 64 // ranks, True),
        f"{h}.mlp.c_fc": (Split.COLUMN, (256 // ranks,), 64, True),
        f"{h}.mlp.c_proj": (Split.ROW, (64,), 256 // ranks, True),
    }
    assert len(layers.layers) == 8
    assert [layer.name for layer in layers.kept] == ["lm_head"]
    assert layers.uncovered == ()


def test_a_2d_weight_no_rule_places_is_listed_with_its_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Mixer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.empty(8, 32))

    with torch.device("meta"):
        model = torch.nn.ModuleDict({
            "embed_tokens": torch.nn.Embedding(100, 32), "attn": torch.nn.MultiheadAttention(32, 4),
            "mixers": torch.nn.ModuleList([Mixer(), Mixer()]), "proj": torch.nn.Linear(32, 64),
        })  # fmt: skip
    monkeypatch.setattr(_layers, "meta_model", lambda config: model)
    layers = linear_layers(write_config(tmp_path, small_llama()))
    # The attention's out_proj is an nn.Linear: a layer like any.
    assert [layer.name for layer in layers.layers] == ["attn.out_proj", "proj"]
    found = {u.names: (u.elements, u.reason.split(" modules")[0]) for u in layers.uncovered}
    assert found == {
        ("attn",): (3 * 32 * 32, "weights of MultiheadAttention"),
        ("mixers.0", "mixers.1"): (2 * 8 * 32, "weights of Mixer"),
    }


def test_a_routers_own_linear_is_the_router_and_3d_parameters_are_experts_only_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Afmoe's router holds its gate as an nn.Linear (vLLM: one GateLinear without a
    quant_config): kept as a router, not planned. A ViT's cls_token is 3-D and no expert:
    listed by its class, not as MoE experts."""

    class AfmoeTokenChoiceRouter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(32, 8, bias=False)

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(8, 128, 32))

    class VisionEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cls_token = torch.nn.Parameter(torch.empty(1, 1, 32))

    with torch.device("meta"):
        mlp = torch.nn.ModuleDict({"router": AfmoeTokenChoiceRouter(), "experts": Experts()})
        model = torch.nn.ModuleDict({"mlp": mlp, "embeddings": VisionEmbeddings()})
    monkeypatch.setattr(_layers, "meta_model", lambda config: model)
    layers = linear_layers(write_config(tmp_path, small_llama()))
    assert layers.layers == ()
    assert [(k.name, k.reason) for k in layers.kept] == [("mlp.router.gate", ROUTER_KEPT)]
    found = {u.names: u.reason.split(" modules")[0][:40] for u in layers.uncovered}
    assert found == {("mlp.experts",): _layers.EXPERTS[:40],
                     ("embeddings",): "weights of VisionEmbeddings"}  # fmt: skip


def test_the_abstract_base_of_a_model_is_refused_not_planned_empty(tmp_path: Path) -> None:
    where = write_config(tmp_path, small_llama(architectures=["LlamaPreTrainedModel"]))
    with pytest.raises(CheckpointError, match="not the abstract base") as caught:
        linear_layers(where)
    assert caught.value.key == "architectures"


def test_a_classification_head_vllm_builds_without_quant_config_is_kept(tmp_path: Path) -> None:
    data = {**fixture_data("all-minilm-l6-v2"), "architectures": ["BertForSequenceClassification"]}
    layers = linear_layers(write_config(tmp_path, data))
    kept = {k.name: k.reason for k in layers.kept}
    assert kept["classifier"].startswith("a classification head")
    assert "classifier" not in {layer.name for layer in layers.layers}


def _small(name: str) -> dict[str, Any]:
    return {"llama": small_llama, "gpt2": small_gpt2, "llava": small_llava,
            "qwen3_moe": small_qwen3_moe}[name]()  # fmt: skip


@pytest.mark.parametrize("name", ["llama", "gpt2", "llava", "qwen3_moe", "bert"])
def test_every_2d_weight_is_a_layer_a_kept_layer_an_embedding_or_not_covered(
    tmp_path: Path, name: str
) -> None:
    where = CONFIGS / "all-minilm-l6-v2" if name == "bert" else write_config(tmp_path, _small(name))
    layers = linear_layers(where)
    placed = {member for layer in layers.layers for member in layer.members}
    placed |= {layer.name for layer in layers.kept}
    placed |= {module for weights in layers.uncovered for module in weights.names}
    model = meta_model(read_config(where))
    for module_name, module in model.named_modules():
        matrices = [p for p in module.parameters(recurse=False) if p.dim() == 2]
        if not matrices or isinstance(module, torch.nn.Embedding):
            continue
        within = any(module_name.startswith(f"{held}.") for held in placed)  # an expert's
        assert module_name in placed or within, module_name


def test_the_parts_vllm_does_not_build_are_listed_apart_never_planned(tmp_path: Path) -> None:
    """vLLM serves Qwen3-Omni's thinker alone (its loader drops talker. and code2wav.):
    their layers are no plan's, but their weights are listed, not dropped."""
    small = {
        "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64,
        "moe_intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128,
        "shared_expert_intermediate_size": 32,
    }  # fmt: skip
    data = {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe", "enable_audio_output": True,
        "thinker_config": {
            "text_config": small,
            "audio_config": {"num_hidden_layers": 1, "encoder_layers": 1, "d_model": 64,
                             "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                             "output_dim": 64},
            "vision_config": {"depth": 1, "hidden_size": 64, "intermediate_size": 64,
                              "num_heads": 2, "out_hidden_size": 64},
        },
        "talker_config": {"text_config": small, "code_predictor_config": small,
                          "thinker_hidden_size": 64, "spatial_merge_size": 2},
        "code2wav_config": {"hidden_size": 64, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "intermediate_size": 64},
    }  # fmt: skip
    layers = linear_layers(write_config(tmp_path, data))
    assert {layer.name.split(".")[0] for layer in layers.layers} == {"thinker"}
    assert {k.name.split(".")[0] for k in layers.kept} <= {"thinker"}
    [apart] = [u for u in layers.uncovered if u.reason == NOT_BUILT_REASON]
    assert apart.names == ("talker", "code2wav")
    assert apart.elements > 0
