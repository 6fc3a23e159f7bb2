"""Checkpoints: ``save_quantized`` writes a quantized model in compressed-tensors' format
(safetensors files and the config, replaced as a whole or not at all), and
``load_quantized`` reads one (or transformers' FineGrainedFP8 block layout) into a skeleton,
checking every name, dtype, shape and kernel choice before the model changes.
``inspect_checkpoint`` says what a checkpoint directory holds from its headers alone
(``CheckpointInfo``), and what its layers would run on a device."""

from kernelpick.integration.checkpoints._inspect import CheckpointInfo, inspect_checkpoint
from kernelpick.integration.checkpoints._save_load import load_quantized, save_quantized

__all__ = ["CheckpointInfo", "inspect_checkpoint", "load_quantized", "save_quantized"]
