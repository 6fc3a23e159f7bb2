"""Block-FP8 and int8 checkpoints kernelpick did not write: compressed-tensors' own (the
real package compresses a model with its FP8_BLOCK and W8A8 presets) and transformers'
FineGrainedFP8 layout (``weight`` and ``weight_scale_inv``, quantized by transformers' own
quantize op where it can) load through load_quantized and run on the CPU within the
format's accuracy of the high-precision model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file
from transformers.quantizers.quantizers_utils import should_convert_module

import kernelpick as kp
from kernelpick.integration import CheckpointError, QuantizedLinear, layer_state, load_quantized
from kernelpick.kernels._canonical import dequantize_weight
from tests.support.emulation import relative_error
from tests.support.tiny_llama import (
    FP8_BOUND,
    INT8_BOUND,
    edit_config,
    llama,
    logits,
    refused_and_unchanged,
)
from tests.support.written_checkpoints import finegrained_fp8_checkpoint

CPU = kp.device_profile("cpu")
K_PROJ = "model.layers.0.self_attn.k_proj"  # N = 64: half a block of 128 rows


def _block_min_max(weight: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each size x size tile's min and max (edge tiles padded with zeros)."""
    n, k = weight.shape
    rows, cols = -(-n // size), -(-k // size)
    tiles = F.pad(weight, (0, cols * size - k, 0, rows * size - n))
    tiles = tiles.reshape(rows, size, cols, size)
    return tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3))


def _compressed_tensors_checkpoint(directory: Path, preset: str, intermediate: int) -> None:
    """compressed-tensors quantizes and writes the model, its scales from min/max
    calibration (per 128 x 128 block, or per channel) through its own calculate_qparams."""
    model = llama(seed=0, intermediate=intermediate)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))  # fmt: skip
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            weight = module.get_parameter("weight").detach()
            if preset == "FP8_BLOCK":
                low, high = _block_min_max(weight, 128)
            else:
                low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
            args = module.__dict__["quantization_scheme"].weights
            scale, _ = calculate_qparams(low, high, args)
            module.get_parameter("weight_scale").data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(str(directory))


def _decompressed(directory: Path, intermediate: int) -> torch.nn.Module:
    """compressed-tensors' own reading: its config applied to a fresh model, the stored
    tensors loaded, then decompressed (its forward still quantizes activations)."""
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    qconfig = QuantizationConfig.model_validate(config)
    model = llama(seed=99, intermediate=intermediate)
    apply_quantization_config(model, qconfig)
    compressor = ModelCompressor(quantization_config=qconfig)
    compressor.compress_model(model)
    model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    compressor.decompress_model(model)
    return model


def _dequantized(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            weight, scale = module.get_parameter("weight"), module.get_parameter("weight_scale")
            out[name] = dequantize_weight(weight, scale, layer_state(module).config)
    return out


@pytest.mark.parametrize(
    ("preset", "scheme", "intermediate", "bound"),
    # FP8_BLOCK with K = 256: compressed-tensors' own forward quantizes activations in
    # groups of 128 only where K divides into them.
    [("FP8_BLOCK", "fp8_block", 256, FP8_BOUND), ("W8A8", "int8_per_channel", 192, INT8_BOUND)],
)
def test_a_checkpoint_compressed_tensors_writes_loads_and_runs(
    tmp_path: Path, preset: str, scheme: str, intermediate: int, bound: float
) -> None:
    _compressed_tensors_checkpoint(tmp_path, preset, intermediate)
    skeleton = llama(seed=1, intermediate=intermediate)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert (report.scheme, len(report.layers)) == (scheme, 14)
    reference = _decompressed(tmp_path, intermediate)
    for name, weight in _dequantized(skeleton).items():
        assert torch.equal(weight, reference.get_submodule(name).get_parameter("weight")), name
    original = llama(seed=0, intermediate=intermediate)
    assert relative_error(logits(skeleton), logits(original)) <= bound
    if preset == "FP8_BLOCK":
        # The same FP8 math as compressed-tensors' forward: per-128-group activations.
        assert relative_error(logits(skeleton), logits(reference)) <= 1e-5
    else:  # its int8 range is -128..127 (scale amax / 127.5), and -128 loads as it is
        weights = [
            m.get_parameter("weight") for m in skeleton.modules() if isinstance(m, QuantizedLinear)
        ]
        assert any(int(w.detach().min()) == -128 for w in weights)


def test_a_finegrained_fp8_checkpoint_loads_with_weight_scale_inv_as_the_multiplier(
    tmp_path: Path,
) -> None:
    finegrained_fp8_checkpoint(tmp_path, 32, ["lm_head"])
    written = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert (written["quant_method"], written["weight_block_size"]) == ("fp8", [32, 32])
    stored = load_file(str(tmp_path / "model.safetensors"))
    skeleton = llama(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert (report.scheme, len(report.layers)) == ("fp8_block", 14)
    assert [s.name for s in report.skipped] == ["lm_head"]
    for name, weight in _dequantized(skeleton).items():
        # transformers dequantizes weight * weight_scale_inv, each scale over its block
        scale = stored[f"{name}.weight_scale_inv"].repeat_interleave(32, 0)
        want = stored[f"{name}.weight"].float() * scale.repeat_interleave(32, 1)
        assert torch.equal(weight, want), name
        assert layer_state(skeleton.get_submodule(name)).config.weight_block == (32, 32)
    assert relative_error(logits(skeleton), logits(llama(seed=0))) <= FP8_BOUND


def _hand_quantized(weight: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weight and weight_scale_inv for a shape transformers' quantize op passes over."""
    low, high = _block_min_max(weight, size)
    scale_inv = torch.maximum(-low, high) / 448.0
    per_row = scale_inv.repeat_interleave(size, 0)[: weight.shape[0]]
    full = per_row.repeat_interleave(size, 1)[:, : weight.shape[1]]
    return (weight / full).clamp(-448, 448).to(torch.float8_e4m3fn), scale_inv


def test_a_finegrained_layer_of_half_a_block_loads_and_one_without_scales_stays_high(
    tmp_path: Path,
) -> None:
    # k_proj and v_proj (N = 64), down_proj (K = 192) pass through
    finegrained_fp8_checkpoint(tmp_path, 128)
    stored = load_file(str(tmp_path / "model.safetensors"))
    original = llama(seed=0).get_submodule(K_PROJ).get_parameter("weight").detach()
    weight, scale_inv = _hand_quantized(original, 128)
    assert tuple(scale_inv.shape) == (1, 1)
    stored[f"{K_PROJ}.weight"], stored[f"{K_PROJ}.weight_scale_inv"] = weight, scale_inv
    save_file(stored, str(tmp_path / "model.safetensors"))
    skeleton = llama(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    quantized = {layer.name for layer in report.layers}
    assert K_PROJ in quantized
    assert "model.layers.0.self_attn.v_proj" not in quantized
    kept = {s.name: s.reason for s in report.skipped}
    assert "no weight_scale_inv" in kept["model.layers.0.mlp.down_proj"]
    assert type(skeleton.get_submodule("model.layers.0.mlp.down_proj")) is torch.nn.Linear
    loaded = _dequantized(skeleton)[K_PROJ]
    assert relative_error(loaded, original) <= FP8_BOUND / 2  # one operand's rounding
    assert relative_error(logits(skeleton), logits(llama(seed=0))) <= FP8_BOUND


HF_UNREAD: list[tuple[str, Callable[[dict[str, object]], None], str]] = [
    ("static activations", lambda c: c.update(activation_scheme="static"), "activation_scheme"),
    ("non-square blocks", lambda c: c.update(weight_block_size=[128, 64]), "square blocks"),
    ("per tensor", lambda c: c.update(weight_block_size=None), "per-tensor"),
    ("ue8m0 scales", lambda c: c.update(scale_fmt="ue8m0"), "scale_fmt"),
    ("e5m2 weights", lambda c: c.update(fmt="e5m2"), "fmt: found 'e5m2'"),
    ("an unknown setting", lambda c: c.update(weight_dtype="fp4"), "weight_dtype"),
    ("embeddings", lambda c: c.update(modules_to_convert=["embed_tokens"]), "modules_to_conv"),
    ("kept yet quantized", lambda c: c.update(modules_to_not_convert=["mlp.down_proj"]),
     "a pattern keeping model.layers.0.mlp.down_proj"),
    ("another method", lambda c: c.update(quant_method="awq"), "quant_method: found 'awq'"),
]  # fmt: skip


# quantization_config exactly as DeepSeek-V3/R1's and Qwen3-8B-FP8's config.json ship it.
SHIPPED = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
           "weight_block_size": [128, 128]}  # fmt: skip


def test_the_config_deepseek_and_qwen3_ship_loads(tmp_path: Path) -> None:
    finegrained_fp8_checkpoint(tmp_path, 128)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"] = dict(SHIPPED)
    path.write_text(json.dumps(config))
    skeleton = llama(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert report.scheme == "fp8_block"
    assert report.layers
    assert relative_error(logits(skeleton), logits(llama(seed=0))) <= FP8_BOUND


@pytest.mark.parametrize(("case", "change", "named"), HF_UNREAD, ids=[c[0] for c in HF_UNREAD])
def test_a_finegrained_variant_kernelpick_does_not_read_is_named_and_nothing_changes(
    tmp_path: Path, case: str, change: Callable[[dict[str, object]], None], named: str
) -> None:
    finegrained_fp8_checkpoint(tmp_path, 32)
    edit_config(tmp_path, lambda config: change(config["quantization_config"]))
    assert "config.json" in str(refused_and_unchanged(tmp_path, named, CheckpointError))


@pytest.mark.parametrize(
    ("pattern", "name", "kept"),
    [
        ("model.layers.1", "model.layers.1.mlp.up_proj", True),  # a prefix, to a boundary
        ("model.layers.1", "model.layers.11.mlp.up_proj", False),
        (r"model\.layers\.\d+\.mlp", "model.layers.7.mlp.up_proj", True),  # a regex
        ("mlp.gate", "model.layers.0.mlp.gate_proj", False),
        ("gate_proj", "model.layers.0.mlp.gate_proj", True),  # a suffix
        ("lm_head", "lm_head", True),
    ],
)
def test_modules_to_not_convert_match_as_transformers_matches_them(
    pattern: str, name: str, kept: bool
) -> None:
    from kernelpick.integration.formats.fine_grained_fp8 import from_hf_config

    layout = from_hf_config("config.json", {"quant_method": "fp8",
                                            "modules_to_not_convert": [pattern]})  # fmt: skip
    linear = torch.nn.Linear(2, 2)
    role = layout.role(name, linear, lambda _: False)
    assert (role == "modules_to_not_convert keeps it in high precision") is kept
    assert should_convert_module(name, [pattern]) is not kept  # transformers' own answer
