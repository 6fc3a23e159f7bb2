"""Checkpoints: ``save_quantized`` writes a quantized model in compressed-tensors' format
(safetensors files and the config, replaced as a whole or not at all), and
``load_quantized`` reads one (or transformers' FineGrainedFP8 block layout) into a skeleton,
checking every name, dtype, shape and kernel choice before the model changes."""

from kernelpick.integration.checkpoints._save_load import load_quantized, save_quantized

__all__ = ["load_quantized", "save_quantized"]
