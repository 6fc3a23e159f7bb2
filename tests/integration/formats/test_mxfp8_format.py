"""mxfp8 in compressed-tensors' checkpoint format: the config kernelpick writes is the one
the real package's MXFP8 preset writes (and picks its MXFP8 compressor for), it reads back
as mxfp8 and nothing near it does, and an E8M0 scale is stored as compressed-tensors stores
it, uint8 exponent bytes, converted both ways without changing a value."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.compressors.mx_utils import compress_mx_scale, decompress_mx_scale
from compressed_tensors.compressors.mxfp8 import MXFP8QuantizationCompressor
from compressed_tensors.config import CompressionFormat
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from safetensors import safe_open

import kernelpick as kp
from kernelpick.integration import CheckpointError, load_quantized, quantize_model, save_quantized
from kernelpick.integration.formats import check_e8m0_dtype
from kernelpick.integration.formats.compressed_tensors import SCHEMES, from_config, to_config
from kernelpick.integration.layer import scale_check
from kernelpick.kernels import E8M0_STORED, stored_scale
from tests.support.ct_reader import read_by_compressed_tensors
from tests.support.tiny_llama import llama, logits

CPU = kp.device_profile("cpu")
MX = kp.Scheme.MXFP8
WHERE = "config.json"
# An mxfp8 layer of 15 rows, K = 17 * 32: its weight scale is [15, 17].
LAYER = kp.quant_config("mxfp8", weight_shape=(15, 17 * 32))


def decode(label: str, stored: torch.Tensor) -> torch.Tensor:
    """What every ingest path makes of a stored mxfp8 weight scale (the one accept)."""
    return scale_check(LAYER)(label, stored, tuple(stored.shape))


def _preset(ignore: list[str]) -> dict[str, Any]:
    """What compressed-tensors writes for its MXFP8 preset, compressed (the group's format
    set as its ``infer_model_format`` sets it)."""
    scheme = preset_name_to_scheme("MXFP8", ["Linear"])
    scheme.format = CompressionFormat.mxfp8_quantized.value
    config = QuantizationConfig(
        config_groups={"group_0": scheme}, format=scheme.format,
        quantization_status="compressed", ignore=ignore,
    )  # fmt: skip
    dumped: dict[str, Any] = json.loads(json.dumps(config.model_dump(mode="json")))
    return dumped


def _group(config: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = config["config_groups"]["group_0"]
    return group


def test_kernelpick_writes_what_the_mxfp8_preset_writes() -> None:
    ours = to_config(MX, ["lm_head"])
    assert ours["format"] == "mxfp8-quantized"
    weights = _group(ours)["weights"]
    assert (weights["strategy"], weights["group_size"], weights["scale_dtype"]) == (
        "group", 32, "torch.uint8",
    )  # fmt: skip
    preset, parsed = _preset(["lm_head"]), QuantizationConfig.model_validate(ours)
    dumped = _group(parsed.model_dump(mode="json"))
    for key in ("weights", "input_activations", "output_activations", "format", "targets"):
        assert dumped[key] == _group(preset)[key], key
    assert (parsed.format, parsed.ignore) == (preset["format"], preset["ignore"])


def test_compressed_tensors_picks_its_mxfp8_compressor_for_it() -> None:
    scheme = QuantizationConfig.model_validate(to_config(MX, [])).config_groups["group_0"]
    assert MXFP8QuantizationCompressor.can_compress(torch.nn.Linear, scheme)
    assert infer_module_format(torch.nn.Linear, scheme) is CompressionFormat.mxfp8_quantized
    assert BaseCompressor.get_value_from_registry(str(scheme.format)) is (
        MXFP8QuantizationCompressor
    )
    # fp8_block, the other scheme quantizing activations in groups, is not taken for it.
    block = QuantizationConfig.model_validate(to_config(kp.Scheme.FP8_BLOCK, []))
    assert not MXFP8QuantizationCompressor.can_compress(
        torch.nn.Linear, block.config_groups["group_0"]
    )


@pytest.mark.parametrize("spelling", ["torch.uint8", "uint8"])
def test_the_config_and_the_presets_read_back_as_mxfp8(spelling: str) -> None:
    preset = _preset(["lm_head"])
    for args in ("weights", "input_activations"):
        _group(preset)[args]["scale_dtype"] = spelling  # compressed-tensors reads both
    for config in (to_config(MX, ["lm_head"]), preset):
        layout = from_config(WHERE, config)
        assert (layout.scheme, layout.block_size, layout.scale_name) == (
            MX, None, "weight_scale",
        )  # fmt: skip
        assert layout.ignore == ("lm_head",)
    for scheme in SCHEMES:  # and every other row still reads as itself
        if scheme is not MX:
            assert from_config(WHERE, to_config(scheme, [])).scheme is scheme


Edit = Callable[[dict[str, Any]], object]


def _weights(edit: Edit) -> Edit:
    return lambda config: edit(_group(config)["weights"])


def _inputs(edit: Edit) -> Edit:
    return lambda config: edit(_group(config)["input_activations"])


FP8_BLOCK = kp.Scheme.FP8_BLOCK
REFUSED: list[tuple[str, kp.Scheme, Edit, str]] = [
    ("weights in groups of 16", MX, _weights(lambda w: w.update(group_size=16)),
     r"weights: group_size: found 16; expected 32"),
    ("activations in groups of 16", MX, _inputs(lambda a: a.update(group_size=16)),
     r"input_activations: group_size: found 16; expected 32"),
    ("fp32 scales", MX, _weights(lambda w: w.update(scale_dtype="torch.float32")),
     r"scale_dtype: found 'torch.float32'; expected None or 'torch.uint8'"),
    ("e8m0 scale_dtype, which compressed-tensors' MXFP8 compressor does not write", MX,
     _weights(lambda w: w.update(scale_dtype="torch.float8_e8m0fnu")),
     r"scale_dtype: found 'torch.float8_e8m0fnu'"),
    ("FP8 groups without E8M0 scales", MX, _weights(lambda w: w.pop("scale_dtype")),
     r"weights: scale_dtype: found None; expected 'torch.uint8'"),
    ("activation scales not E8M0", MX, _inputs(lambda a: a.pop("scale_dtype")),
     r"input_activations: scale_dtype: found None; expected 'torch.uint8'"),
    ("E8M0 scales on fp8_block", FP8_BLOCK,
     _weights(lambda w: w.update(scale_dtype="torch.uint8")),
     r"weights: scale_dtype: found 'torch.uint8'; expected None: fp8_block"),
    ("static activations", MX, _inputs(lambda a: a.update(dynamic=False)),
     r"weights/input_activations: found \('float', 'group', \('group', False\)\)"),
    ("another format", MX, lambda c: c.update(format="float-quantized"),
     r"format: found 'float-quantized'; expected 'mxfp8-quantized'"),
    ("a 4-bit MX preset", MX, _weights(lambda w: w.update(num_bits=4)), r"num_bits: found 4"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "scheme", "edit", "named"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_config_near_mxfp8_is_refused_by_name(
    case: str, scheme: kp.Scheme, edit: Edit, named: str
) -> None:
    config = to_config(scheme, [])
    edit(config)
    with pytest.raises(CheckpointError, match=named):
        from_config(WHERE, config)


def _e8m0(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_an_e8m0_scale_is_stored_as_its_bytes_and_read_back_unchanged() -> None:
    scale = torch.arange(255, dtype=torch.uint8).reshape(15, 17).view(torch.float8_e8m0fnu)
    stored = stored_scale(scale)
    assert stored.dtype == E8M0_STORED == torch.uint8
    assert torch.equal(stored, torch.arange(255, dtype=torch.uint8).reshape(15, 17))
    for kept in (stored, scale):  # uint8 bytes, or a checkpoint storing E8M0 natively
        decoded = decode("layer.weight_scale", kept)
        assert decoded.dtype == torch.float8_e8m0fnu
        assert torch.equal(decoded.view(torch.uint8), stored)
    # The bytes are compressed-tensors': its MXFP8 helpers read and write the same values.
    values = scale.float()
    assert torch.equal(compress_mx_scale(values, torch.uint8), stored)
    assert torch.equal(decompress_mx_scale(stored).float(), values)
    ones = torch.ones(2, 2)
    assert stored_scale(ones) is ones  # any other scale is stored as it is


def test_a_scale_of_another_dtype_or_a_nan_byte_is_refused_by_name() -> None:
    where = "model.safetensors: layer.weight_scale"
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn):
        with pytest.raises(CheckpointError, match=rf"layer.weight_scale: dtype: found {dtype};"
                           r" expected torch.uint8 .* or torch.float8_e8m0fnu"):  # fmt: skip
            check_e8m0_dtype(where, dtype)
        with pytest.raises(kp.KernelInputError, match=r"expected dtype float8_e8m0fnu or uint8"):
            decode("layer.weight_scale", torch.ones(15, 17).to(dtype))
    with pytest.raises(CheckpointError, match=r"dtype: found F4"):
        check_e8m0_dtype(where, "F4")  # safetensors' name for a dtype torch lacks
    check_e8m0_dtype(where, torch.uint8)
    nan = torch.full((15, 17), 127, dtype=torch.uint8)
    nan[1, 2] = 255
    for stored in (nan, nan.view(torch.float8_e8m0fnu)):
        with pytest.raises(kp.KernelInputError, match=r"E8M0 scales without NaN \(byte 0xFF\)"):
            decode("layer.weight_scale", stored)


def test_a_scale_compressed_tensors_stores_decodes_to_its_values() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 16, bias=False))
    config = QuantizationConfig.model_validate(to_config(MX, []))
    apply_quantization_config(model, config)
    exponents = torch.randint(-8, 3, (16, 2), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model[0].get_parameter("weight_scale").copy_(2.0**exponents)
    ModelCompressor(quantization_config=config).compress_model(model)
    stored = model.state_dict()["0.weight_scale"]
    assert stored.dtype == torch.uint8
    mx = kp.quant_config("mxfp8", weight_shape=(16, 64))
    decoded = scale_check(mx)("0.weight_scale", stored, (16, 2))
    assert torch.equal(decoded.float(), 2.0**exponents)


# Lands with the mxfp8 layer lifecycle (quantize_model and load_quantized taking mxfp8).
def test_an_mxfp8_model_saves_as_compressed_tensors_does_and_loads_back(tmp_path: Path) -> None:
    model = llama(seed=0)
    quantize_model(model, "mxfp8", CPU, kp.Policy())
    assert model.config.quantization_config == to_config(MX, ["lm_head"])  # record's
    save_quantized(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config == to_config(MX, ["lm_head"])
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as stored:
        scales = [key for key in stored.keys() if key.endswith(".weight_scale")]  # noqa: SIM118
        assert len(scales) == 14  # every Linear but the tied lm_head
        for key in scales:
            scale = stored.get_tensor(key)
            assert scale.dtype == torch.uint8, key
            canonical = model.get_parameter(key)  # E8M0; its state dict holds the bytes
            assert canonical.dtype == torch.float8_e8m0fnu, key
            assert torch.equal(scale, canonical.view(torch.uint8)), key
            assert torch.equal(scale, model.state_dict()[key]), key
    skeleton = llama(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert (report.scheme, len(report.layers)) == ("mxfp8", 14)
    for key, tensor in model.state_dict().items():
        loaded = skeleton.state_dict()[key]
        assert loaded.dtype == tensor.dtype, key
        assert torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8)), key
    assert torch.equal(logits(skeleton), logits(model))
    # compressed-tensors decompresses the same weights kernelpick's layers hold.
    reference, state = read_by_compressed_tensors(tmp_path, llama(seed=99)), model.state_dict()
    for key in scales:
        name = key.removesuffix(".weight_scale")
        weight = state[f"{name}.weight"].float()
        scale = model.get_parameter(key).float().repeat_interleave(32, dim=1)[:, : weight.shape[1]]
        decompressed = reference.get_submodule(name).get_parameter("weight").float()
        assert torch.equal(weight * scale, decompressed), name
