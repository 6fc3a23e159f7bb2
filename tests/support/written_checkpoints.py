"""Checkpoints other tools write, for the tests that read them: compressed-tensors' own
pack-quantized presets (W4A16, W4A16_ASYM, W8A16) and transformers' FineGrainedFP8 layout.

Both quantize tests/support/tiny_llama's model. The pack-quantized one has an MLP of
``PACKED_INTERMEDIATE``, so K = 128 and 256 and the presets' 128-column groups divide every
layer, as compressed-tensors requires; build its skeletons with ``packed_llama``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import save_file
from transformers import FineGrainedFP8Config, LlamaForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Quantize

from tests.support.tiny_llama import llama

__all__ = [
    "PACKED_INTERMEDIATE",
    "finegrained_fp8_checkpoint",
    "packed_llama",
    "written_by_compressed_tensors",
]

PACKED_INTERMEDIATE = 256


def packed_llama(seed: int) -> LlamaForCausalLM:
    """The model ``written_by_compressed_tensors`` quantizes (K = 128 and 256)."""
    return llama(seed, intermediate=PACKED_INTERMEDIATE)


def written_by_compressed_tensors(directory: Path, preset: str) -> LlamaForCausalLM:
    """A checkpoint compressed-tensors' own API writes: the preset applied, each group's
    min/max calibrated with its qparams, compressed, saved and its config written."""
    model = packed_llama(seed=0)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    for module in model.modules():
        if not hasattr(module, "weight_scale"):
            continue
        args = module.__dict__["quantization_scheme"].weights
        weight = module.get_parameter("weight").detach()
        grouped = weight.view(weight.shape[0], -1, args.group_size or weight.shape[1])
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
        module.get_parameter("weight_scale").data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.get_parameter("weight_zero_point").data.copy_(
                zero.reshape(module.weight_zero_point.shape)
            )
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(str(directory))
    return model


def finegrained_fp8_checkpoint(
    directory: Path, block: int, not_convert: list[str] | None = None
) -> None:
    """A FineGrainedFP8 checkpoint: every linear but lm_head quantized by transformers' own
    Fp8Quantize (which passes shapes its blocks do not divide through unquantized), its
    config written by transformers beside the tensors."""
    model = llama(seed=0)
    fp8 = FineGrainedFP8Config(weight_block_size=(block, block),
                               modules_to_not_convert=not_convert)  # fmt: skip
    quantize = Fp8Quantize(SimpleNamespace(quantization_config=fp8))  # type: ignore[no-untyped-call]
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to the embedding: stored once
        if ".mlp." in key or ".self_attn." in key:
            state.update(quantize.convert({key: tensor}))  # type: ignore[arg-type]
        else:
            state[key] = tensor
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    model.config.quantization_config = fp8
    model.config.save_pretrained(directory)
