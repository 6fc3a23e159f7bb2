"""compressed-tensors' own reading of a checkpoint, for the tests that check what kernelpick
writes against the real package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
from safetensors.torch import load_file

__all__ = ["read_by_compressed_tensors"]

Model = TypeVar("Model", bound=torch.nn.Module)


def read_by_compressed_tensors(directory: Path, skeleton: Model) -> Model:
    """``skeleton`` (a fresh model of the checkpoint's architecture, with its head tied to the
    embedding) as compressed-tensors reads the checkpoint in ``directory``: its config
    applied, the compressed tensors loaded, then decompressed to high precision."""
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    qconfig = QuantizationConfig.model_validate(config)
    apply_quantization_config(skeleton, qconfig)
    compressor = ModelCompressor(quantization_config=qconfig)
    compressor.compress_model(skeleton)
    stored = load_file(str(directory / "model.safetensors"))
    result = skeleton.load_state_dict(stored, strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys == ["lm_head.weight"]  # tied: saved once, as the embedding
    compressor.decompress_model(skeleton)
    return skeleton
