"""Block FP8 and int8 through quantize_model, save_quantized and load_quantized: round
trips, the compressed-tensors fields written, and refusals that leave the model alone.

The model is tests/support/tiny_llama's: N = 64 and N = K = 192 layers, so block scales cover
partial blocks at both edges.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import safetensors.torch
import torch

import kernelpick as kp
from kernelpick.integration import (
    CheckpointError,
    ModelConversionError,
    QuantizedLinear,
    layer_state,
    load_quantized,
    quantize_model,
    save_quantized,
)
from kernelpick.kernels._canonical import dequantize_weight
from tests.support.ct_reader import read_by_compressed_tensors
from tests.support.emulation import relative_error
from tests.support.snapshots import snapshot
from tests.support.tiny_llama import (
    FP8_BOUND,
    INT8_BOUND,
    edit_config,
    llama,
    logits,
    refused_and_unchanged,
)

CPU = kp.device_profile("cpu")
GATE = "model.layers.0.mlp.gate_proj"  # N = 192, K = 128: block scales [2, 1]


def _quantized(scheme: str, block_size: int | None = None) -> torch.nn.Module:
    model = llama(seed=0)
    quantize_model(model, scheme, CPU, kp.Policy(), block_size=block_size)
    return model


def _saved(tmp_path: Path, scheme: str, block_size: int | None = None) -> torch.nn.Module:
    model = _quantized(scheme, block_size)
    save_quantized(model, tmp_path)
    return model


def _group(tmp_path: Path) -> dict[str, object]:
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    group: dict[str, object] = config["config_groups"]["group_0"]
    assert config["format"] == group["format"]
    return group


@pytest.mark.parametrize(
    ("scheme", "weights", "activations", "fmt"),
    [
        ("fp8_block", {"type": "float", "strategy": "block", "block_structure": [128, 128]},
         {"type": "float", "strategy": "group", "group_size": 128, "dynamic": True},
         "float-quantized"),
        ("int8_per_channel", {"type": "int", "strategy": "channel", "symmetric": True},
         {"type": "int", "strategy": "token", "dynamic": True}, "int-quantized"),
    ],
)  # fmt: skip
def test_a_checkpoint_round_trips_with_the_compressed_tensors_fields(
    tmp_path: Path,
    scheme: str,
    weights: dict[str, object],
    activations: dict[str, object],
    fmt: str,
) -> None:
    model = _saved(tmp_path, scheme)
    group = _group(tmp_path)
    assert group["format"] == fmt
    assert group["weights"] == {**group["weights"], **weights, "num_bits": 8}  # type: ignore[dict-item]
    assert group["input_activations"] == {**group["input_activations"], **activations}  # type: ignore[dict-item]
    skeleton = llama(seed=1)  # other weights: everything must come from the checkpoint
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert report.scheme == scheme
    assert len(report.layers) == 14
    assert [s.name for s in report.skipped] == ["lm_head"]
    for key, tensor in model.state_dict().items():
        loaded = skeleton.state_dict()[key]
        assert loaded.dtype == tensor.dtype, key
        assert torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8)), key
    assert torch.equal(logits(skeleton), logits(model))


def test_compressed_tensors_decompresses_what_kernelpick_writes(tmp_path: Path) -> None:
    for scheme in ("fp8_block", "int8_per_channel"):
        directory = tmp_path / scheme
        model = _saved(directory, scheme)
        reference = read_by_compressed_tensors(directory, llama(seed=99))
        for name, module in model.named_modules():
            if isinstance(module, QuantizedLinear):
                weight = dequantize_weight(
                    module.get_parameter("weight"), module.get_parameter("weight_scale"),
                    layer_state(module).config,
                )  # fmt: skip
                decompressed = reference.get_submodule(name).get_parameter("weight")
                assert torch.equal(weight, decompressed), (scheme, name)


@pytest.mark.parametrize(("scheme", "bound"), [("fp8_block", FP8_BOUND),
                                               ("int8_per_channel", INT8_BOUND)])  # fmt: skip
def test_quantize_model_stays_within_the_formats_accuracy(scheme: str, bound: float) -> None:
    original, model = llama(seed=0), _quantized(scheme)
    error = relative_error(logits(model), logits(original))
    assert 0 < error <= bound
    gate = model.get_submodule(GATE)
    weight, scale = gate.get_parameter("weight"), gate.get_parameter("weight_scale")
    if scheme == "int8_per_channel":
        assert (weight.dtype, tuple(scale.shape)) == (torch.int8, (192, 1))
        assert int(weight.detach().abs().max()) <= 127
    else:
        assert (weight.dtype, tuple(scale.shape)) == (torch.float8_e4m3fn, (2, 1))


def test_another_block_size_is_written_and_read_back(tmp_path: Path) -> None:
    model = _saved(tmp_path, "fp8_block", block_size=64)
    scale = model.get_submodule("model.layers.0.mlp.down_proj").get_parameter("weight_scale")
    assert tuple(scale.shape) == (2, 3)  # [ceil(128 / 64), ceil(192 / 64)]
    group = _group(tmp_path)
    assert group["weights"]["block_structure"] == [64, 64]  # type: ignore[index]
    assert group["input_activations"]["group_size"] == 64  # type: ignore[index]
    skeleton = llama(seed=1)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert layer_state(skeleton.get_submodule(GATE)).config.weight_block == (64, 64)
    assert torch.equal(logits(skeleton), logits(model))


def test_save_refuses_layers_of_two_block_sizes(tmp_path: Path) -> None:
    model = torch.nn.Sequential(llama(seed=0).model)  # a module with no config of its own
    quantize_model(model, "fp8_block", CPU, kp.Policy(), skip=lambda n, _: "mlp" in n)
    quantize_model(model, "fp8_block", CPU, kp.Policy(), block_size=64)
    with pytest.raises(kp.InvalidValueError, match=r"block sizes.*\[64, 128\]"):
        save_quantized(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_transformers_model_takes_no_second_block_size() -> None:
    """Its save_pretrained writes one quantization_config, which describes one block size:
    the second conversion is refused before the model changes."""
    model = llama(seed=0)
    quantize_model(model, "fp8_block", CPU, kp.Policy(), skip=lambda n, _: "mlp" in n)
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match=r"block sizes.*\[64, 128\]"):
        quantize_model(model, "fp8_block", CPU, kp.Policy(), block_size=64)
    assert snapshot(model) == before


def _rewrite(tmp_path: Path, key: str, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors[key] = change(tensors[key]).contiguous()
    safetensors.torch.save_file(tensors, str(path))


CORRUPT: list[tuple[str, str, str, Callable[[torch.Tensor], torch.Tensor], str]] = [
    ("block grid transposed", "fp8_block", f"{GATE}.weight_scale", lambda s: s.t(),
     r"gate_proj\.weight_scale: got shape \[1, 2\].*shape \[2, 1\]"),
    ("per-channel scale for blocks", "fp8_block", f"{GATE}.weight_scale",
     lambda s: torch.ones(192, 1), r"got shape \[192, 1\]"),
    ("zero block scale", "fp8_block", f"{GATE}.weight_scale", lambda s: s * 0,
     "positive, finite"),
    ("fp8 weight for int8", "int8_per_channel", f"{GATE}.weight",
     lambda w: w.float().to(torch.float8_e4m3fn), r"expected int8 \[192, 128\]"),
    ("scale per block for int8", "int8_per_channel", f"{GATE}.weight_scale",
     lambda s: s[:2, :1], r"got shape \[2, 1\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "scheme", "key", "change", "named"), CORRUPT, ids=[c[0] for c in CORRUPT]
)
def test_a_corrupted_checkpoint_is_refused_by_name_and_the_model_is_unchanged(
    tmp_path: Path,
    case: str,
    scheme: str,
    key: str,
    change: Callable[[torch.Tensor], torch.Tensor],
    named: str,
) -> None:
    _saved(tmp_path, scheme)
    _rewrite(tmp_path, key, change)
    refused_and_unchanged(tmp_path, named)


Change = Callable[[dict[str, object]], object]


def _weights(change: Change) -> Change:
    return lambda group: change(group["weights"])  # type: ignore[arg-type]


def _inputs(change: Change) -> Change:
    return lambda group: change(group["input_activations"])  # type: ignore[arg-type]


UNREAD: list[tuple[str, str, Change, str]] = [
    ("non-square blocks", "fp8_block", _weights(lambda w: w.update(block_structure=[128, 64])),
     r"block_structure: found \[128, 64\]; expected square blocks"),
    ("groups unlike the blocks", "fp8_block", _inputs(lambda a: a.update(group_size=64)),
     "group_size: found 64; expected 128"),
    ("a block strategy without blocks", "fp8_block",
     _weights(lambda w: w.pop("block_structure")), "block_structure: found None"),
    ("float activations on int8 weights", "int8_per_channel",
     _inputs(lambda a: a.update(type="float")), "type: found 'float', with 'int' weights"),
    ("int8 in a float-quantized checkpoint", "int8_per_channel",
     lambda g: g.update(format="float-quantized"), "format: found 'float-quantized'"),
    ("int8 per tensor", "int8_per_channel", _weights(lambda w: w.update(strategy="tensor")),
     r"weights/input_activations: found \('int', 'tensor'"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "scheme", "change", "named"), UNREAD, ids=[c[0] for c in UNREAD])
def test_a_config_outside_the_table_is_refused_by_name_and_nothing_changes(
    tmp_path: Path, case: str, scheme: str, change: Change, named: str
) -> None:
    _saved(tmp_path, scheme)
    edit_config(
        tmp_path, lambda config: change(config["quantization_config"]["config_groups"]["group_0"])
    )
    assert "config.json" in str(refused_and_unchanged(tmp_path, named, CheckpointError))


@pytest.mark.parametrize("scheme", ["fp8_block", "int8_per_channel"])
def test_a_failed_conversion_or_load_leaves_the_model_as_it_was(
    tmp_path: Path, scheme: str
) -> None:
    model = llama(seed=0)
    with torch.no_grad():
        model.get_submodule(GATE).get_parameter("weight")[5, 7] = float("nan")
    before = snapshot(model)
    with pytest.raises(ModelConversionError, match=r"gate_proj.*row 5 has NaN") as info:
        quantize_model(model, scheme, CPU, kp.Policy())
    assert [name for name, _ in info.value.failures] == [GATE]
    assert snapshot(model) == before
    # No CPU kernel left for the scheme: every layer is named, and nothing changes.
    everything = tuple(kp.default_catalog().ids_for("cpu"))
    with pytest.raises(ModelConversionError) as info:
        quantize_model(llama(seed=0), scheme, CPU, kp.Policy(disabled=everything))
    assert len(info.value.failures) == 14
    _saved(tmp_path, scheme)
    skeleton = llama(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(ModelConversionError) as info:
        load_quantized(skeleton, tmp_path, CPU, kp.Policy(disabled=everything))
    assert len(info.value.failures) == 14
    assert snapshot(skeleton) == before


def test_mxfp8_converts_runs_casts_and_reloads_through_the_integration() -> None:
    # The integration refused mxfp8 while each ingest path checked tensors its own way;
    # with one accept its E8M0 scales go through every path (tests/integration/formats has
    # its checkpoint round trip).
    reference, model = llama(seed=0), _quantized("mxfp8")
    assert relative_error(logits(model), logits(reference)) < 0.1
    layer = model.get_submodule(GATE)
    assert layer.get_parameter("weight_scale").dtype == torch.float8_e8m0fnu
    assert layer.get_parameter("weight_scale").shape == (192, 4)  # one per 32 of K = 128
    other = _quantized("fp8_per_channel")
    again = llama(seed=5)
    quantize_model(again, "mxfp8", CPU, kp.Policy())
    again.load_state_dict(model.state_dict())
    assert torch.equal(logits(again), logits(model))
    with pytest.raises(kp.KernelInputError, match="float8_e8m0fnu"):
        again.load_state_dict(other.state_dict())  # an fp32 per-channel scale is not E8M0
    assert torch.equal(logits(again), logits(model))
    model.to(torch.bfloat16)
    assert layer.get_parameter("weight_scale").dtype == torch.float8_e8m0fnu


@pytest.mark.parametrize(("scheme", "stored"), [("fp8_block", torch.float8_e4m3fn),
                                                ("int8_per_channel", torch.int8)])  # fmt: skip
def test_casts_and_load_state_dict_keep_the_quantized_weight(
    scheme: str, stored: torch.dtype
) -> None:
    model, same = _quantized(scheme), _quantized(scheme)
    want = logits(model)
    other = llama(seed=5)
    quantize_model(other, scheme, CPU, kp.Policy())
    other.load_state_dict(model.state_dict())
    assert torch.equal(logits(other), want)
    state = model.state_dict()
    wrong = torch.int8 if stored is torch.float8_e4m3fn else torch.float8_e4m3fn
    for dtype in (torch.float32, wrong):  # a cast would drop the scale, or misread the bytes
        bad = {**state, f"{GATE}.weight": state[f"{GATE}.weight"].to(dtype)}
        with pytest.raises(kp.KernelInputError, match=f"expected dtype {str(stored)[6:]}"):
            other.load_state_dict(bad)
    same.to(torch.bfloat16)
    gate = same.get_submodule(GATE)
    assert gate.get_parameter("weight").dtype == stored
    assert gate.get_parameter("weight_scale").dtype == torch.float32
    bound = FP8_BOUND if stored is torch.float8_e4m3fn else INT8_BOUND
    assert relative_error(logits(same).float(), want) <= bound  # bf16 activations
