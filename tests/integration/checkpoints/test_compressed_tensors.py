"""Interoperability with the real compressed-tensors package (the test extra installs it):
its API writes a checkpoint that kernelpick loads, and reads one that kernelpick writes.

The model is a small Llama from transformers, with its head tied to the embedding, as the
FP8-dynamic checkpoints people deploy are quantized: every Linear but ``lm_head``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import LlamaConfig, LlamaForCausalLM

import kernelpick as kp
from kernelpick.integration import (
    QuantizedLinear,
    layer_state,
    load_quantized,
    quantize_model,
    save_quantized,
)
from kernelpick.kernels._canonical import dequantize_weight
from tests.support.ct_reader import read_by_compressed_tensors
from tests.support.emulation import relative_error

CPU = kp.device_profile("cpu")
CONFIG = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=True,
)  # fmt: skip


def _llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(CONFIG)
    model.train(False)
    return model


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids).logits
    return out


def test_a_checkpoint_compressed_tensors_writes_loads_through_load_quantized(
    tmp_path: Path,
) -> None:
    model = _llama(seed=0)
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))  # fmt: skip
    for module in model.modules():  # calibration: per-channel min/max, its own qparams
        if hasattr(module, "weight_scale"):
            weight = module.get_parameter("weight").detach()
            low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
            scale, _ = calculate_qparams(low, high, module.__dict__["quantization_scheme"].weights)
            module.get_parameter("weight_scale").data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(tmp_path)
    compressor.update_config(str(tmp_path))

    skeleton = _llama(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert len(report.layers) == 14
    assert [s.name for s in report.skipped] == ["lm_head"]
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight  # still tied
    reference = read_by_compressed_tensors(tmp_path, _llama(seed=99))
    for name, module in skeleton.named_modules():
        if isinstance(module, QuantizedLinear):
            weight = dequantize_weight(
                module.get_parameter("weight"), module.get_parameter("weight_scale"),
                layer_state(module).config,
            )  # fmt: skip
            assert torch.equal(weight, reference.get_submodule(name).get_parameter("weight")), name
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    # Both quantize activations per token in the forward: the same FP8 math.
    assert relative_error(_logits(skeleton, ids), _logits(reference, ids)) <= 1e-5


def test_a_checkpoint_kernelpick_writes_is_read_and_decompressed_by_compressed_tensors(
    tmp_path: Path,
) -> None:
    model = _llama(seed=0)
    original = _llama(seed=0)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    reference = read_by_compressed_tensors(tmp_path, _llama(seed=99))
    quantized = 0
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            quantized += 1
            weight = dequantize_weight(
                module.get_parameter("weight"), module.get_parameter("weight_scale"),
                layer_state(module).config,
            )  # fmt: skip
            decompressed = reference.get_submodule(name).get_parameter("weight")
            assert torch.equal(decompressed, weight), name
            # and within FP8 accuracy of the unquantized weight
            unquantized = original.get_submodule(name).get_parameter("weight")
            assert relative_error(weight, unquantized) <= 0.05, name
    assert quantized == 14
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    assert relative_error(_logits(reference, ids), _logits(model, ids)) <= 1e-5
