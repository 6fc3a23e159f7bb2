"""kernelpick as a transformers quantizer (``kernelpick.engines.transformers``), against the
installed transformers: quantize on load, save, reload pre-quantized, and refusals.

The tiny-Llama tests run in a second or two each; the all-MiniLM ones (the ``e2e`` extra
ships the model, so they run offline) are slow: a real model and a fresh process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, LlamaForCausalLM
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    AutoQuantizationConfig,
)

import kernelpick as kp
from kernelpick.engines.transformers import KernelpickConfig, KernelpickHfQuantizer
from kernelpick.integration import (
    CheckpointError,
    Fp8Linear,
    KernelSelectionError,
    ModelConversionError,
)
from tests.engines.hf_models import (
    EMBED,
    ROOT,
    embed_function,
    linears,
    llama_dir,
    load,
    minilm,
    saved,
)
from tests.tiny_llama import FP8_BOUND, llama, logits

# -- registration and config ---------------------------------------------------------------


def test_import_registers_kernelpick_and_kernelpick_alone_imports_no_transformers() -> None:
    assert AUTO_QUANTIZATION_CONFIG_MAPPING["kernelpick"] is KernelpickConfig
    assert AUTO_QUANTIZER_MAPPING["kernelpick"] is KernelpickHfQuantizer
    code = "import sys, kernelpick, kernelpick.engines; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_round_trips_through_its_dict() -> None:
    config = KernelpickConfig("fp8_block", ["mlp"], 64)
    saved = config.to_dict()
    assert saved == {
        "quant_method": "kernelpick", "scheme": "fp8_block", "modules_to_not_convert": ["mlp"],
        "block_size": 64, "format_version": 1,
    }  # fmt: skip
    again = AutoQuantizationConfig.from_dict(json.loads(json.dumps(saved)))
    assert isinstance(again, KernelpickConfig)
    assert again.to_dict() == saved
    default = KernelpickConfig()
    assert (default.scheme, default.modules_to_not_convert) == ("fp8_per_channel", ["lm_head"])
    assert default.caps is None
    assert default.policy is None
    assert "caps" not in KernelpickConfig(caps=kp.device_profile("cpu")).to_dict()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"scheme": "fp8_per_tensor_static"}, "fp8_per_tensor_static"),
        ({"scheme": "int4"}, "int4"),
        ({"scheme": "fp8_per_channel", "block_size": 64}, "block_size"),
        ({"scheme": "fp8_block", "block_size": 0}, "block_size"),
        ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
        ({"quant_method": "fp8"}, "quant_method"),
        ({"format_version": 2}, "format_version"),
        ({"weight_block_size": [128, 128]}, "weight_block_size"),
        ({"caps": "a100"}, "caps"),
    ],
)
def test_bad_config_values_are_refused(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(kp.KernelpickError, match=named):
        KernelpickConfig(**kwargs)


# -- quantize on load ----------------------------------------------------------------------


def test_lm_head_stays_high_precision_by_default(tmp_path: Path) -> None:
    path = llama_dir(tmp_path)
    reference = load(path)
    model = load(path, quantization_config=KernelpickConfig())
    assert linears(model, torch.nn.Linear) == ["lm_head"]
    assert len(linears(model, Fp8Linear)) == 14  # 2 layers x (4 attention + 3 MLP)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    error = torch.linalg.norm(logits(model) - logits(reference)) / torch.linalg.norm(
        logits(reference)
    )
    assert float(error) < FP8_BOUND


def test_modules_to_not_convert_are_honoured(tmp_path: Path) -> None:
    path = llama_dir(tmp_path)
    # transformers' patterns: a suffix, and a prefix ending at a module boundary
    skip = ["down_proj", "model.layers.1.mlp"]
    model = load(path, quantization_config=KernelpickConfig(modules_to_not_convert=skip))
    assert sorted(linears(model, torch.nn.Linear)) == [
        "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj",
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
    ]  # fmt: skip
    assert "lm_head" in linears(model, Fp8Linear)  # an explicit list replaces the default


def test_a_rejected_device_raises_before_any_weight_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = llama_dir(tmp_path)
    from transformers import modeling_utils

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights loaded before the kernel was selected")

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "_load_pretrained_model", no_loading)
    config = KernelpickConfig(caps=kp.device_profile("a100"), policy=kp.Policy())
    with pytest.raises(KernelSelectionError) as info:
        load(path, quantization_config=config)
    text = str(info.value)
    assert text.startswith('quantization="fp8_per_channel": ')
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert f"\n  - {kernel}: " in text


def test_a_weight_that_cannot_be_quantized_fails_theload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers reports a conversion error and raises once its report is out; the
    # quantizer would raise it itself (ModelConversionError) if transformers only logged.
    path = llama_dir(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    with pytest.raises((RuntimeError, ModelConversionError)):
        load(path, quantization_config=KernelpickConfig())
    report = caplog.text
    assert "model.layers.1.mlp.up_proj.weight" in report
    assert "row 3 has NaN or Inf" in report


# -- save and reload -----------------------------------------------------------------------


def test_save_then_reload_is_the_same_model(tmp_path: Path) -> None:
    out, model = saved(tmp_path)
    written = json.loads((out / "config.json").read_text())["quantization_config"]
    assert written["quant_method"] == "kernelpick"
    stored = load_file(out / "model.safetensors")
    assert stored["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.layers.0.self_attn.q_proj.weight_scale"].dtype == torch.float32
    again = load(out)
    assert again.hf_quantizer.pre_quantized
    assert linears(again, torch.nn.Linear) == ["lm_head"]
    assert torch.equal(logits(again), logits(model))
    for key, value in model.state_dict().items():
        other = again.state_dict()[key]
        assert other.dtype == value.dtype
        assert torch.equal(other.view(torch.uint8), value.view(torch.uint8)), key


def test_a_missing_quantized_tensor_is_refused(tmp_path: Path) -> None:
    out, _ = saved(tmp_path)
    tensors = load_file(out / "model.safetensors")
    del tensors["model.layers.1.self_attn.o_proj.weight_scale"]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelConversionError, match=r"o_proj\.weight_scale"):
        load(out)


def test_quantized_bytes_for_a_high_precision_module_are_refused(tmp_path: Path) -> None:
    # Saved with every linear quantized, reloaded keeping the MLP: transformers would cast
    # the FP8 bytes into fp32 linears without their scales.
    out, _ = saved(tmp_path)
    file = out / "config.json"
    config = json.loads(file.read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["lm_head", "up_proj"]
    file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"mlp\.up_proj\.weight"):
        load(out)


# -- all-MiniLM-L6-v2 ----------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_quantize_save_and_reload_in_a_fresh_process(tmp_path: Path) -> None:
    embed = embed_function()
    reference = embed(AutoModel.from_pretrained(minilm()))
    model = AutoModel.from_pretrained(minilm(), quantization_config=KernelpickConfig())
    assert len(linears(model, Fp8Linear)) == 37
    assert not linears(model, torch.nn.Linear)
    quantized = embed(model)
    cosine = torch.nn.functional.cosine_similarity(quantized, reference)
    assert float(cosine.min()) >= 0.99, cosine
    out = tmp_path / "minilm-kernelpick"
    model.save_pretrained(out)
    state = {k: v.contiguous().view(torch.uint8) for k, v in model.state_dict().items()}
    script = EMBED + textwrap.dedent(
        """
        import kernelpick.engines.transformers  # registers "kernelpick" before loading
        from safetensors.torch import save_file
        model = AutoModel.from_pretrained(sys.argv[1])
        assert model.hf_quantizer.pre_quantized, "not the pre-quantized path"
        state = {k: v.contiguous().view(torch.uint8) for k, v in model.state_dict().items()}
        state["__embeddings__"] = embed(model).contiguous().view(torch.uint8)
        save_file(state, sys.argv[2])
        """
    )
    result = tmp_path / "fresh.safetensors"
    subprocess.run(
        [sys.executable, "-c", script, str(out), str(result)], check=True, cwd=ROOT, timeout=300
    )
    fresh = load_file(result)
    assert torch.equal(fresh.pop("__embeddings__"), quantized.contiguous().view(torch.uint8))
    assert fresh.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(fresh[key], value), key


@pytest.mark.parametrize(
    ("scheme", "dtype"),
    [
        ("fp8_per_tensor", torch.float32),
        ("fp8_weight_only", torch.float32),
        ("fp8_block", torch.float32),
        ("int8_per_channel", torch.float32),
        ("fp8_per_channel", torch.bfloat16),
    ],
)
def test_every_online_scheme_saves_and_reloads(
    tmp_path: Path, scheme: str, dtype: torch.dtype
) -> None:
    path = llama_dir(tmp_path)
    reference = logits(load(path, dtype=dtype)).float()
    model = load(path, dtype=dtype, quantization_config=KernelpickConfig(scheme))
    stored = torch.int8 if scheme == "int8_per_channel" else torch.float8_e4m3fn
    assert model.model.layers[0].mlp.gate_proj.weight.dtype == stored
    got = logits(model).float()
    assert float(torch.linalg.norm(got - reference) / torch.linalg.norm(reference)) < FP8_BOUND
    out = tmp_path / "quantized"
    model.save_pretrained(out)
    again = load(out, dtype=dtype)
    assert again.model.layers[0].mlp.gate_proj.kernelpick_decision == (
        model.model.layers[0].mlp.gate_proj.kernelpick_decision
    )
    assert torch.equal(logits(again), logits(model))


def test_a_head_tied_to_the_embedding_stays_high_precision(tmp_path: Path) -> None:
    # tests/tiny_llama.py's model ties lm_head to embed_tokens, which stays high precision
    llama(seed=0).save_pretrained(tmp_path / "tied")
    model = load(tmp_path / "tied", quantization_config=KernelpickConfig(modules_to_not_convert=[]))
    assert linears(model, torch.nn.Linear) == ["lm_head"]
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_bad_value_set_after_the_config_was_made_is_refused() -> None:
    config = KernelpickConfig()
    config.scheme = "fp8_per_tensor_static"  # as transformers' update() sets it: no __init__
    with pytest.raises(kp.InvalidValueError, match="fp8_per_tensor_static"):
        KernelpickHfQuantizer(config, pre_quantized=False)


@pytest.mark.slow
def test_without_the_import_transformers_loads_the_checkpoint_silently_wrong(
    tmp_path: Path,
) -> None:
    # Why docs/engines.md says to import kernelpick.engines.transformers first: without it,
    # transformers only warns about the unknown quant_method and casts the FP8 bytes into
    # plain linears with no scales. If this starts failing, transformers refuses by itself.
    out, _ = saved(tmp_path)
    script = textwrap.dedent(
        """
        import sys, torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
        linear = model.model.layers[0].mlp.gate_proj
        print(type(linear).__name__, linear.weight.dtype)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(out)], capture_output=True, text=True, cwd=ROOT,
        timeout=300, check=True,
    )  # fmt: skip
    assert run.stdout.split() == ["Linear", "torch.float32"]
    assert "kernelpick" in run.stderr  # the only sign: a warning naming the unknown method


@pytest.mark.parametrize("attribute", ["_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"])
def test_modules_the_model_keeps_in_fp32_are_not_quantized(tmp_path: Path, attribute: str) -> None:
    # transformers loads these in fp32 whatever dtype the model gets, apart from kernelpick.
    path = llama_dir(tmp_path)
    keeps: Any = type("KeepsUp", (LlamaForCausalLM,), {attribute: ["up_proj"]})
    model = keeps.from_pretrained(
        path, dtype=torch.bfloat16, quantization_config=KernelpickConfig(caps=kp.probe("cpu"))
    )
    up = model.model.layers[0].mlp.up_proj
    assert type(up) is torch.nn.Linear
    assert type(model.model.layers[0].mlp.gate_proj) is Fp8Linear
