"""inspect_checkpoint says what a checkpoint holds from its headers alone: the format and
scheme, the ignored modules, the tensors and bytes by dtype (checked here against the
tensors themselves), the quantized layers' N x K (against the model they were saved
from), whatever wrote it: save_quantized, the real compressed-tensors package,
transformers' FineGrainedFP8 layout, kernelpick's format_version 1, a sharded index. With a
device, each layer's decision is kp.choose's for the config the layer implies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import safetensors
import safetensors.torch
import torch

import kernelpick as kp
from kernelpick.core import KeptLayer, Rejected, Selected
from kernelpick.integration import (
    CheckpointError,
    CheckpointInfo,
    inspect_checkpoint,
    quantize_model,
    save_quantized,
)
from tests.support.tiny_llama import edit_config, llama
from tests.support.written_checkpoints import (
    finegrained_fp8_checkpoint,
    packed_llama,
    written_by_compressed_tensors,
)

CPU = kp.device_profile("cpu")
H100 = kp.device_profile("h100")
# Tied to the fp32 embedding; the reason is compressed-tensors' rule's, as loading gives it.
HEAD = KeptLayer("lm_head", (128, 128), 4, "the checkpoint keeps it in high precision")
V1_KEPT = "modules_to_not_convert keeps it in high precision"
# scheme, quantize_model's settings, and what inspect reports of them.
SAVED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("fp8_per_channel", {}, {"format": "float-quantized", "block_size": None}),
    ("fp8_block", {}, {"format": "float-quantized", "block_size": 128}),
    ("int4_weight_only", {"group_size": 64, "symmetric": False},
     {"format": "pack-quantized", "group_size": 64, "symmetric": False, "act_order": False}),
]  # fmt: skip


def _linears(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name != "lm_head"}  # fmt: skip


def _read_tallies(directory: Path) -> dict[str, dict[str, dict[str, int]]]:
    """Per file, per dtype: the tensors and their bytes, from the tensors themselves."""
    found: dict[str, dict[str, dict[str, int]]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tallies: dict[str, dict[str, int]] = {}
        with safetensors.safe_open(str(path), framework="pt") as file:
            for key in file.keys():  # noqa: SIM118 (safe_open is no mapping)
                tensor = file.get_tensor(key)
                tally = tallies.setdefault(file.get_slice(key).get_dtype(),
                                           {"tensors": 0, "bytes": 0})  # fmt: skip
                tally["tensors"] += 1
                tally["bytes"] += tensor.numel() * tensor.element_size()
        found[path.name] = tallies
    return found


def _saved(
    directory: Path, scheme: str, settings: dict[str, Any], dtype: torch.dtype = torch.float32
) -> dict[str, tuple[int, int]]:
    """The tiny Llama in ``dtype`` saved by save_quantized; its linears' (N, K) before
    quantization."""
    model = llama(seed=0, dtype=dtype)
    shapes = _linears(model)
    quantize_model(model, scheme, CPU, kp.Policy(), **settings)
    save_quantized(model, directory)
    return shapes


def _layers(info: CheckpointInfo) -> dict[str, tuple[int, int]]:
    return {layer.name: layer.config.weight_shape for layer in info.layers}


@pytest.mark.parametrize(("scheme", "settings", "reported"), SAVED, ids=[s[0] for s in SAVED])
def test_a_checkpoint_save_quantized_wrote_is_reported_as_its_files_hold_it(
    tmp_path: Path, scheme: str, settings: dict[str, Any], reported: dict[str, Any]
) -> None:
    shapes = _saved(tmp_path, scheme, settings)
    record = inspect_checkpoint(tmp_path).to_dict()
    quantization = record["quantization"]
    assert quantization["quant_method"] == "compressed-tensors"
    assert quantization["scheme"] == scheme
    assert {key: quantization[key] for key in reported} == reported
    assert quantization["ignore"] == ["lm_head"]
    assert quantization["activation_dtype"] == "float32"  # the dtype save_quantized wrote
    assert quantization["activation_dtype_source"] == "config.json's dtype"
    tallies = _read_tallies(tmp_path)
    assert {f["name"]: f["by_dtype"] for f in record["files"]} == tallies
    assert record["total"]["bytes"] == sum(
        t["bytes"] for file in tallies.values() for t in file.values()
    )
    info = inspect_checkpoint(tmp_path)
    assert _layers(info) == shapes
    assert info.kept == (HEAD,)
    assert dict(info.aliases) == {"lm_head.weight": "model.embed_tokens.weight"}


@pytest.mark.parametrize(
    ("preset", "scheme", "group", "symmetric"),
    [("W4A16", "int4_weight_only", 128, True), ("W4A16_ASYM", "int4_weight_only", 128, False),
     ("W8A16", "int8_weight_only", 128, True)],
)  # fmt: skip
def test_a_checkpoint_compressed_tensors_wrote_is_read_with_k_from_its_weight_shape(
    tmp_path: Path, preset: str, scheme: str, group: int, symmetric: bool
) -> None:
    written_by_compressed_tensors(tmp_path, preset)
    info = inspect_checkpoint(tmp_path)
    quantization = info.to_dict()["quantization"]
    assert (quantization["scheme"], quantization["group_size"]) == (scheme, group)
    assert (quantization["symmetric"], quantization["shape_source"]) == (symmetric, "weight_shape")
    assert quantization["activation_dtype"] == "float32"  # transformers wrote config's dtype
    assert _layers(info) == _linears(packed_llama(seed=0))
    assert {f.name: {t.dtype: t.bytes for t in f.by_dtype} for f in info.files} == {
        name: {dtype: t["bytes"] for dtype, t in tallies.items()}
        for name, tallies in _read_tallies(tmp_path).items()
    }


def test_a_finegrained_fp8_checkpoint_is_read_as_fp8_block_with_its_block(tmp_path: Path) -> None:
    finegrained_fp8_checkpoint(tmp_path, 32, ["lm_head"])
    record = inspect_checkpoint(tmp_path).to_dict()
    quantization = record["quantization"]
    assert quantization["quant_method"] == "fp8"
    assert (quantization["scheme"], quantization["block_size"]) == ("fp8_block", 32)
    assert quantization["ignore"] == ["lm_head"]
    assert {layer["name"]: tuple(layer["weight_shape"]) for layer in record["layers"]} == (
        _linears(llama(seed=0))
    )
    assert record["kept"] == []  # lm_head is tied, and stored nowhere


def test_a_format_version_1_config_is_read_as_kernelpick_wrote_it(tmp_path: Path) -> None:
    _saved(tmp_path, "fp8_per_channel", {})
    legacy = {"quant_method": "kernelpick", "scheme": "fp8_per_channel", "format_version": 1,
              "modules_to_not_convert": ["lm_head"], "block_size": None, "group_size": None,
              "symmetric": True}  # fmt: skip
    edit_config(tmp_path, lambda c: c.update(quantization_config=legacy))
    info = inspect_checkpoint(tmp_path)
    quantization = info.to_dict()["quantization"]
    assert (quantization["quant_method"], quantization["format_version"]) == ("kernelpick", 1)
    assert quantization["scheme"] == "fp8_per_channel"
    assert _layers(info) == _linears(llama(seed=0))
    # FineGrainedFP8's rule, which format_version 1 shares, says why in its words.
    assert info.kept == (attrs.evolve(HEAD, reason=V1_KEPT),)


def _shard(directory: Path) -> dict[str, str]:
    """The single file of ``directory`` as an index and two shards, keys dealt alternately."""
    single = directory / "model.safetensors"
    with safetensors.safe_open(str(single), framework="pt") as file:
        metadata = file.metadata()
    tensors = safetensors.torch.load_file(str(single))
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {key: names[i % 2] for i, key in enumerate(sorted(tensors))}
    for name in names:
        part = {k: v for k, v in tensors.items() if weight_map[k] == name}
        safetensors.torch.save_file(part, str(directory / name), metadata=metadata)
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    single.unlink()
    return weight_map


def test_a_sharded_checkpoint_reads_each_shard_and_totals_them(tmp_path: Path) -> None:
    _saved(tmp_path, "fp8_per_channel", {})
    whole = inspect_checkpoint(tmp_path).to_dict()
    weight_map = _shard(tmp_path)
    record = inspect_checkpoint(tmp_path).to_dict()
    assert [f["name"] for f in record["files"]] == sorted(set(weight_map.values()))
    assert {f["name"]: f["by_dtype"] for f in record["files"]} == _read_tallies(tmp_path)
    assert [f["tensors"] for f in record["files"]] == [17, 17]
    same = ("tensors", "bytes", "by_dtype")  # the files' sizes differ by a header
    assert {k: record["total"][k] for k in same} == {k: whole["total"][k] for k in same}
    assert sorted(record["layers"], key=str) == sorted(whole["layers"], key=str)
    assert record["kept"] == whole["kept"]


def test_an_index_naming_model_safetensors_alone_agrees_with_it(tmp_path: Path) -> None:
    _saved(tmp_path, "fp8_per_channel", {})
    whole = inspect_checkpoint(tmp_path).to_dict()
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), framework="pt") as file:
        keys = list(file.keys())
    index = {"weight_map": dict.fromkeys(keys, "model.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert inspect_checkpoint(tmp_path).to_dict() == whole


def test_an_empty_index_beside_model_safetensors_is_refused(tmp_path: Path) -> None:
    """An index naming no tensor would read as a checkpoint of none, model.safetensors
    passed over."""
    _saved(tmp_path, "fp8_per_channel", {})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(CheckpointError) as refused:
        inspect_checkpoint(tmp_path)
    assert (refused.value.path, refused.value.key) == (str(index), "weight_map")


def _expected(info: CheckpointInfo, caps: kp.DeviceCaps, name: str) -> kp.Decision:
    """kp.choose for the layer, with its config built here from the reported settings."""
    q = info.to_dict()["quantization"]
    layer = next(layer for layer in info.layers if layer.name == name)
    config = kp.quant_config(
        q["scheme"], weight_shape=layer.config.weight_shape, out_dtype=q["activation_dtype"],
        block_size=q["block_size"], group_size=q["group_size"],
        symmetric=True if q["symmetric"] is None else q["symmetric"],
    )  # fmt: skip
    return kp.choose(caps, config)


@pytest.mark.parametrize(("scheme", "settings", "reported"), SAVED, ids=[s[0] for s in SAVED])
@pytest.mark.parametrize("caps", [CPU, H100], ids=["cpu", "h100"])
def test_on_a_device_each_layer_gets_what_choose_decides_for_it(
    tmp_path: Path, scheme: str, settings: dict[str, Any], reported: dict[str, Any],
    caps: kp.DeviceCaps,
) -> None:  # fmt: skip
    shapes = _saved(tmp_path, scheme, settings, torch.bfloat16)  # as deployed
    info = inspect_checkpoint(tmp_path, caps)
    summary = info.summary
    assert summary is not None
    assert summary.layers == len(info.layers) == 14
    assert summary.kept == (attrs.evolve(HEAD, itemsize=2),)
    for group in summary.groups:
        for name in group.names:
            assert group.decision == _expected(info, caps, name), name
    kernels = {g.decision.kernel for g in summary.groups if isinstance(g.decision, Selected)}
    if (scheme, caps) == ("fp8_per_channel", H100):
        assert kernels == {"cuda_rowwise_scaled_mm"}
    if (scheme, caps) == ("fp8_block", H100):
        # cuda_block_scaled_mm takes whole 128 x 128 blocks; down_proj (K = 192) falls back
        # to a weight-only kernel, and the layers of N = 64 or 192 have none.
        rejected = {n for g in summary.groups if isinstance(g.decision, Rejected) for n in g.names}
        assert rejected == {name for name, (n, _) in shapes.items() if n % 128}
        assert (summary.rejected, summary.degraded) == (8, 2)
