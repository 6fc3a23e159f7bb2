"""Which reader a checkpoint's ``quantization_config`` is for: compressed-tensors' or
transformers' FineGrainedFP8, by its ``quant_method``."""

from __future__ import annotations

from collections.abc import Mapping

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats import compressed_tensors as _ct_config
from kernelpick.integration.formats import fine_grained_fp8 as _hf_fp8_config
from kernelpick.integration.formats import kernelpick_v1 as _v1_config
from kernelpick.integration.formats._layout import QUANTIZATION_CONFIG, Layout

__all__ = ["read_layout"]


def read_layout(where: str, qconfig: object, *, legacy: bool = False) -> Layout:
    """The layout a ``quantization_config`` describes, by its ``quant_method``:
    compressed-tensors', or transformers' FineGrainedFP8 ("fp8"); with ``legacy``, also
    kernelpick's own format_version 1 ("kernelpick": what ``inspect`` reads; the
    transformers quantizer loads it, ``load_quantized`` does not)."""
    if qconfig is None:
        expected = "a compressed-tensors or FineGrainedFP8 config (save_quantized writes one)"
        raise CheckpointError(where, QUANTIZATION_CONFIG, "nothing", expected)
    if not isinstance(qconfig, Mapping):
        raise CheckpointError(where, QUANTIZATION_CONFIG, repr(qconfig), "a mapping")
    method = qconfig.get("quant_method")
    if method == _hf_fp8_config.METHOD:
        return _hf_fp8_config.from_hf_config(where, qconfig)
    if method == _ct_config.METHOD:
        return _ct_config.from_config(where, qconfig)
    if legacy and method == _v1_config.METHOD:
        return _v1_config.from_kernelpick_config(where, qconfig)
    methods = [repr(_ct_config.METHOD), f"{_hf_fp8_config.METHOD!r} (transformers' FineGrainedFP8)"]
    methods += [f"{_v1_config.METHOD!r} (kernelpick's format_version 1)"] if legacy else []
    valid = ", ".join(methods[:-1]) + f" or {methods[-1]}"
    raise CheckpointError(where, "quant_method", repr(method), valid)
