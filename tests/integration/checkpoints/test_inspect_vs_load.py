"""inspect says, from the headers alone, what load_quantized does with the same checkpoint:
each module decided by its layout's rule (the kept layers, with load's reasons; a module the
config quantizes stored without its scale refused by both), and the layers' configs made in
the dtype load computes in (the config's, else the stored high-precision tensors' one)."""

from __future__ import annotations

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
