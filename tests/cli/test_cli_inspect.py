"""``kernelpick inspect DIR``: the record inspect_checkpoint makes, as text or one JSON
record; exit 0, 2 when --device is given and a layer is rejected there, 1 on bad input.
Checkpoints from save_quantized, the transformers quantizer (and kernelpick's
format_version 1 it once wrote) and the real compressed-tensors package."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED
from kernelpick.core import ENV_DISABLED, SCHEMA_VERSION
from kernelpick.engines.transformers import KernelpickConfig
from kernelpick.integration import inspect_checkpoint, quantize_model, save_quantized
from tests.engines.hf_models import as_format_v1, linears, saved
from tests.support.cli_run import run_cli
from tests.support.tiny_llama import llama
from tests.support.written_checkpoints import written_by_compressed_tensors


def _saved(directory: Path, scheme: str, **settings: Any) -> Path:
    """The tiny Llama in bfloat16, as deployed, quantized and saved (with its dtype)."""
    model = llama(seed=0, dtype=torch.bfloat16)
    quantize_model(model, scheme, kp.device_profile("cpu"), kp.Policy(), **settings)
    save_quantized(model, directory)
    return directory


def test_text_says_the_format_the_scheme_the_layers_and_the_tensors(tmp_path: Path) -> None:
    status, out, err = run_cli("inspect", str(_saved(tmp_path, "fp8_block")))
    assert (status, err) == (EXIT_SELECTED, "")
    lines = out.splitlines()
    assert "format: compressed-tensors, format float-quantized" in lines
    assert "scheme: fp8_block, blocks of 128 x 128" in lines
    assert "kept by the config: lm_head" in lines
    assert "quantized layers: 14 (N x K: each layer's weight)" in lines
    assert any(line.split()[:3] == ["2", "128", "x"] and "mlp.down_proj" in line for line in lines)
    assert "kept in high precision: lm_head (128 x 128): the checkpoint keeps it in high" in out
    total = inspect_checkpoint(tmp_path).to_dict()["total"]
    assert any(line.split()[:3] == ["total", "34", f"{total['bytes']:,}"] for line in lines)


def test_json_is_the_record_with_its_schema_version(tmp_path: Path) -> None:
    _saved(tmp_path, "int4_weight_only", group_size=64)
    status, out, _ = run_cli("inspect", str(tmp_path), "--json")
    record = json.loads(out)
    assert status == EXIT_SELECTED
    assert record["schema_version"] == SCHEMA_VERSION
    assert record == json.loads(json.dumps(inspect_checkpoint(tmp_path).to_dict()))
    assert record["summary"] is None


@pytest.mark.parametrize(
    ("scheme", "device", "status", "kernels"),
    [("fp8_per_channel", "h100", EXIT_SELECTED, {"cuda_rowwise_scaled_mm"}),
     ("fp8_per_channel", "cpu", EXIT_SELECTED, None),
     ("fp8_block", "h100", EXIT_REJECTED, None)],
)  # fmt: skip
def test_with_a_device_each_layer_is_decided_and_a_rejection_exits_2(
    tmp_path: Path, scheme: str, device: str, status: int, kernels: set[str] | None
) -> None:
    _saved(tmp_path, scheme)
    got, out, _ = run_cli("inspect", str(tmp_path), "--device", device, "--json")
    summary = json.loads(out)["summary"]
    expected = inspect_checkpoint(tmp_path, kp.device_profile(device)).summary
    assert expected is not None
    assert got == status
    assert summary == json.loads(json.dumps(expected.to_dict()))
    assert (summary["rejected"] > 0) == (status == EXIT_REJECTED)
    if kernels is not None:
        assert {g["decision"]["kernel"] for g in summary["groups"]} == kernels
    text_status, text, _ = run_cli("inspect", str(tmp_path), "--device", device)
    assert text_status == status
    assert f'quantization="{scheme}" on ' in text
    assert "kept in high precision: lm_head" in text


def test_the_policy_comes_from_the_environment(tmp_path: Path) -> None:
    _saved(tmp_path, "fp8_per_channel")
    env = {ENV_DISABLED: "cuda_rowwise_scaled_mm"}
    _, out, _ = run_cli("inspect", str(tmp_path), "--device", "h100", "--json", env=env)
    kernels = {g["decision"]["kernel"] for g in json.loads(out)["summary"]["groups"]}
    assert "cuda_rowwise_scaled_mm" not in kernels


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["inspect", "{tmp}/nothing"], "nothing: directory: found no such directory"),
     (["inspect", "{tmp}"], "config.json: : found no such file"),
     (["inspect", "{tmp}/ckpt", "--device", "h1000"], "h1000"),
     (["inspect"], "DIR")],
)  # fmt: skip
def test_bad_input_exits_1_naming_it(tmp_path: Path, argv: list[str], named: str) -> None:
    _saved(tmp_path / "ckpt", "fp8_per_channel")
    status, out, err = run_cli(*(arg.format(tmp=tmp_path) for arg in argv))
    assert (status, out) == (EXIT_BAD_INPUT, "")
    assert named in err


def test_a_checkpoint_the_transformers_quantizer_saved(tmp_path: Path) -> None:
    config = KernelpickConfig(
        "int8_per_channel", ["lm_head", "down_proj"], caps=kp.device_profile("cpu")
    )  # no kernel to build for this CPU
    out, model = saved(tmp_path, config)
    status, text, _ = run_cli("inspect", str(out), "--json", "--device", "cpu")
    record = json.loads(text)
    quantization = record["quantization"]
    assert status == EXIT_SELECTED
    assert (quantization["quant_method"], quantization["scheme"]) == (
        "compressed-tensors", "int8_per_channel",
    )  # fmt: skip
    assert quantization["activation_dtype"] == "float32"  # from_pretrained's, in config.json
    quantized = linears(model, type(model.get_submodule("model.layers.0.self_attn.q_proj")))
    assert sorted(layer["name"] for layer in record["layers"]) == sorted(quantized)
    kept = {layer["name"] for layer in record["kept"]}
    assert kept == {"lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    assert set(linears(model, torch.nn.Linear)) == kept
    assert record["summary"]["layers"] == len(quantized)

    v1 = as_format_v1(out, config)  # what an earlier kernelpick's save_pretrained wrote
    _, text, _ = run_cli("inspect", str(v1), "--json")
    legacy = json.loads(text)
    assert legacy["quantization"]["quant_method"] == "kernelpick"
    assert legacy["quantization"]["format_version"] == 1
    assert legacy["quantization"]["ignore"] == ["lm_head", "down_proj"]
    assert legacy["layers"] == record["layers"]
    # Each format's rule says why in its own words, as loading does.
    assert [(k["name"], k["weight_shape"]) for k in legacy["kept"]] == [
        (k["name"], k["weight_shape"]) for k in record["kept"]
    ]


def test_a_checkpoint_compressed_tensors_wrote(tmp_path: Path) -> None:
    written_by_compressed_tensors(tmp_path, "W4A16_ASYM")
    status, text, _ = run_cli("inspect", str(tmp_path), "--device", "cpu")
    assert status == EXIT_SELECTED
    assert "scheme: int4_weight_only, groups of 128 along K, asymmetric (zero points)" in text
    assert "N x K: each layer's weight_shape tensor" in text
    assert "14 quantized layer(s): 0 degraded, 0 rejected" in text


def test_the_readme_shows_what_inspect_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "tiny-llama-int4", "int4_weight_only", group_size=64, symmetric=False)
    status, out, _ = run_cli("inspect", "tiny-llama-int4", "--device", "h100")
    command = "$ kernelpick inspect tiny-llama-int4 --device h100\n"
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = re.search(re.escape(command) + r"(.*?)```", readme, re.DOTALL)
    assert status == EXIT_SELECTED
    assert shown is not None
    assert shown.group(1) == out
