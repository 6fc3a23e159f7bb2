"""inspect says, from the headers alone, what load_quantized does with the same checkpoint:
each module decided by its layout's rule (the kept layers, with load's reasons; a module the
config quantizes stored without its scale refused by both), and the layers' configs made in
the dtype load computes in (the config's, else the stored high-precision tensors' one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch

import kernelpick as kp
from kernelpick.core import Dtype, ModelSummary
from kernelpick.integration import (
    CheckpointError,
    inspect_checkpoint,
    load_quantized,
    model_summary,
    quantize_model,
    save_quantized,
)
from kernelpick.integration.formats import CONV1D_KEPT
from kernelpick.integration.formats.compressed_tensors import to_config as ct_config
from tests.support.tiny_llama import edit_config, llama
from tests.support.written_checkpoints import finegrained_fp8_checkpoint

CPU = kp.device_profile("cpu")
NO_SCALE = "the checkpoint stores no weight_scale_inv for it: high precision"


def _by_name(summary: ModelSummary) -> dict[str, Any]:
    """What a summary says of each layer, and the bytes (its groups list names in the order
    they were read: the file's, or the model's)."""
    record = summary.to_dict()
    return {
        "layers": {name: (group["config"], group["decision"])
                   for group in record["groups"] for name in group["names"]},
        "kept": {k["name"]: (k["weight_shape"], k["bytes"], k["reason"]) for k in record["kept"]},
        "bytes": (record["bytes_before"], record["bytes_after"]),
    }  # fmt: skip


def _loaded(directory: Path, dtype: torch.dtype, intermediate: int) -> dict[str, Any]:
    """What the tiny Llama, built in ``dtype`` and loaded from ``directory``, runs."""
    skeleton = llama(seed=1, intermediate=intermediate, dtype=dtype)
    load_quantized(skeleton, directory, CPU, kp.Policy())
    return _by_name(model_summary(skeleton))


def test_a_finegrained_fp8_checkpoint_keeps_the_linears_stored_without_a_scale(
    tmp_path: Path,
) -> None:
    # Blocks of 128 divide neither k/v's N = 64 nor the MLP's 192: transformers stores them
    # as they were, and loading keeps them in high precision.
    finegrained_fp8_checkpoint(tmp_path, 128)
    info = inspect_checkpoint(tmp_path, CPU)
    assert info.summary is not None
    kept = {k.name: k.reason for k in info.kept}
    assert len(kept) == 10
    assert set(kept.values()) == {NO_SCALE}
    assert info.summary.layers + len(kept) == 14  # every linear but the tied head
    loaded = _loaded(tmp_path, torch.float32, 192)
    del loaded["kept"]["lm_head"]  # tied to the embedding and stored once: no header shows it
    inspected = _by_name(info.summary)
    assert (inspected["layers"], inspected["kept"]) == (loaded["layers"], loaded["kept"])


@pytest.mark.parametrize("scheme", ["fp8_per_channel", "int4_weight_only"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("stated", [True, False], ids=["stated", "inferred"])
def test_a_saved_checkpoint_inspects_as_it_loads_in_its_dtype(
    tmp_path: Path, scheme: str, dtype: torch.dtype, stated: bool
) -> None:
    model = llama(seed=0, intermediate=256, dtype=dtype)
    quantize_model(model, scheme, CPU, kp.Policy())
    save_quantized(model, tmp_path)
    if not stated:  # as a checkpoint another tool wrote
        edit_config(tmp_path, lambda config: config.pop("dtype"))
    info = inspect_checkpoint(tmp_path, CPU)
    assert info.dtype == Dtype.parse(dtype)
    assert info.dtype_source.startswith(
        "config.json's dtype" if stated else "config.json states none"
    )
    assert info.summary is not None
    assert _by_name(info.summary) == _loaded(tmp_path, dtype, 256)


def test_a_module_the_config_quantizes_stored_without_its_scale_is_refused_as_load_does(
    tmp_path: Path,
) -> None:
    model = llama(seed=0, intermediate=256)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    name = "model.layers.0.mlp.down_proj"
    path = tmp_path / "model.safetensors"
    with safetensors.safe_open(str(path), framework="pt") as file:
        metadata = file.metadata()
    state = safetensors.torch.load_file(str(path))
    state[f"{name}.weight"] = torch.zeros(128, 256)
    del state[f"{name}.weight_scale"]
    safetensors.torch.save_file(state, str(path), metadata=metadata)
    with pytest.raises(CheckpointError) as refused:
        inspect_checkpoint(tmp_path)
    assert (refused.value.path, refused.value.key) == (str(path), f"{name}.weight")
    assert refused.value.found == "F32 [128, 256], and no weight_scale"
    assert f"{name}.weight_scale beside it" in refused.value.expected
    with pytest.raises(kp.KernelpickError, match=f"{name}.weight"):
        load_quantized(llama(seed=1, intermediate=256), tmp_path, CPU, kp.Policy())


def _same_as_loaded(directory: Path, skeleton: torch.nn.Module) -> ModelSummary:
    """What inspect says of ``directory``, checked to be what loading it into ``skeleton``
    does (a head tied to the embedding is stored nowhere: no header shows it)."""
    info = inspect_checkpoint(directory, CPU)
    assert info.summary is not None
    loaded = _by_name(load_quantized(skeleton, directory, CPU, kp.Policy()).summary)
    inspected = _by_name(info.summary)
    if "lm_head" not in inspected["kept"]:
        loaded["kept"].pop("lm_head", None)
    assert (inspected["layers"], inspected["kept"]) == (loaded["layers"], loaded["kept"])
    return info.summary


def test_t5s_relative_attention_bias_is_read_as_the_embedding_it_is(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=128, num_layers=1,
                                   num_heads=4, decoder_start_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    torch.manual_seed(1)
    summary = _same_as_loaded(tmp_path, transformers.T5ForConditionalGeneration(config))
    assert summary.layers == 14  # every linear but the two wo, kept in fp32 by T5


def test_gpt_oss_router_beside_fused_experts_is_no_linear(tmp_path: Path) -> None:
    """GPT-OSS stores its experts fused (``mlp.experts.gate_up_proj``, 3-D, no
    ``experts.N`` names): its ``mlp.router`` routes, and is no nn.Linear."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["full_attention"], tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    summary = _same_as_loaded(tmp_path, transformers.GptOssForCausalLM(config))
    assert summary.layers == 4
    assert {layer.name for layer in summary.kept} == {"lm_head"}


@pytest.mark.parametrize("quant_method", ["fp8", "compressed-tensors"])
def test_gpt2s_conv1d_is_kept_with_its_n_by_k_as_load_keeps_it(
    tmp_path: Path, quant_method: str
) -> None:
    """transformers' Conv1D stores its weight K x N and is no nn.Linear: load keeps it, with
    CONV1D_KEPT, and inspect (knowing it by config.json's model type) says the same."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_inner=256,
                                     vocab_size=100, n_positions=32)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    written = config.to_dict()
    written["quantization_config"] = (
        {"quant_method": "fp8", "weight_block_size": [128, 128]} if quant_method == "fp8"
        else ct_config(kp.Scheme.FP8_PER_CHANNEL, ["lm_head"])
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(written))
    summary = _same_as_loaded(tmp_path, transformers.GPT2LMHeadModel(config))
    kept = {layer.name: (layer.weight_shape, layer.reason) for layer in summary.kept}
    assert kept == {
        "transformer.h.0.attn.c_attn": ((192, 64), CONV1D_KEPT),
        "transformer.h.0.attn.c_proj": ((64, 64), CONV1D_KEPT),
        "transformer.h.0.mlp.c_fc": ((256, 64), CONV1D_KEPT),
        "transformer.h.0.mlp.c_proj": ((64, 256), CONV1D_KEPT),
    }


class _Shared(torch.nn.Module):
    """One linear reachable at two paths, ``a`` and ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(128, 128)
        self.b = self.a
        self.c = torch.nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.c(self.b(self.a(x))))


def test_a_linear_at_two_paths_is_one_quantized_layer_as_load_reads_it(tmp_path: Path) -> None:
    """save_quantized stores ``b``'s tensors as aliases of ``a``'s: one layer, at ``a``."""
    torch.manual_seed(0)
    model = _Shared()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    assert dict(inspect_checkpoint(tmp_path).aliases)["b.weight"] == "a.weight"
    summary = _same_as_loaded(tmp_path, _Shared())
    assert (summary.layers, summary.kept) == (2, ())


@pytest.mark.parametrize(
    ("scheme", "extra"),
    [("fp8_per_channel", "input_scale"), ("int4_weight_only", "weight_zero_point")],
)
def test_a_layer_storing_a_tensor_its_scheme_has_not_is_refused_as_load_does(
    tmp_path: Path, scheme: str, extra: str
) -> None:
    """An input_scale under dynamic activations, a zero point under a symmetric scheme:
    read as the config says, the tensor would be dropped or the layer misread."""
    model = llama(seed=0, intermediate=256)
    quantize_model(model, scheme, CPU, kp.Policy())
    save_quantized(model, tmp_path)
    name = f"model.layers.0.mlp.down_proj.{extra}"
    path = tmp_path / "model.safetensors"
    with safetensors.safe_open(str(path), framework="pt") as file:
        metadata = file.metadata()
    state = safetensors.torch.load_file(str(path))
    state[name] = torch.zeros(1, dtype=torch.float32 if extra == "input_scale" else torch.int32)
    safetensors.torch.save_file(state, str(path), metadata=metadata)
    with pytest.raises(CheckpointError) as refused:
        inspect_checkpoint(tmp_path)
    assert (refused.value.path, refused.value.key) == (str(path), name)
    assert refused.value.expected.startswith(f"only what {scheme} stores for it")
    with pytest.raises(CheckpointError, match=name):
        load_quantized(llama(seed=1, intermediate=256), tmp_path, CPU, kp.Policy())
