"""transformers' FineGrainedFP8 checkpoints (the layout of DeepSeek-V3's and Qwen3's FP8
releases), read as ``fp8_block``.

``config.json``'s ``quantization_config`` holds ``quant_method`` "fp8",
``activation_scheme`` ("dynamic" is read; "static" is not), ``weight_block_size``
``[b, b]`` and ``modules_to_not_convert`` (alias ``ignored_layers``), the fields of
transformers' ``FineGrainedFP8Config``. Each quantized linear stores ``weight``
(float8_e4m3fn ``[N, K]``) and ``weight_scale_inv`` (fp32 ``[ceil(N/b), ceil(K/b)]``).
Despite its name, ``weight_scale_inv`` is the dequantization multiplier (transformers
dequantizes ``weight * weight_scale_inv``), which is kernelpick's ``weight_scale``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from kernelpick.core import DEFAULT_BLOCK_SIZE, Scheme, is_positive_int
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats._layout import Layout, Stored
from kernelpick.integration.formats._patterns import kept, not_convert_refusal

__all__ = ["METHOD", "FineGrainedFp8Layout", "from_hf_config", "not_convert_patterns"]

METHOD = "fp8"
SCALE_NAME = "weight_scale_inv"
# FineGrainedFP8Config's settings, and "fmt", which DeepSeek-V3/R1 and Qwen3's FP8 releases
# write ("e4m3", the weights' format): any other key is a variant kernelpick cannot vouch for.
_KNOWN = (
    "quant_method", "activation_scheme", "weight_block_size", "modules_to_not_convert",
    "ignored_layers", "modules_to_convert", "scale_fmt", "expert_dtype", "dequantize", "fmt",
)  # fmt: skip


@attrs.frozen(kw_only=True)
class FineGrainedFp8Layout(Layout):
    """A FineGrainedFP8 checkpoint: a module is quantized when the checkpoint stores its
    ``weight_scale_inv``; ``not_convert`` keeps modules in high precision, by transformers'
    rule (``_patterns.kept``)."""

    not_convert: tuple[str, ...]

    def role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        keeps = kept(name, self.not_convert)
        if stored(self.scale_name):
            if keeps:
                raise CheckpointError(
                    self.where, "modules_to_not_convert", f"a pattern keeping {name}",
                    f"none for a module the checkpoint quantizes ({name}.{self.scale_name} "
                    "is stored)",
                )  # fmt: skip
            return True
        if not isinstance(module, torch.nn.Linear):
            return None
        if keeps:
            return "modules_to_not_convert keeps it in high precision"
        return f"the checkpoint stores no {self.scale_name} for it: high precision"

    def expected_role(self, name: str, module: torch.nn.Module) -> bool | str | None:
        # FineGrainedFP8 stores a scale for every linear modules_to_not_convert leaves.
        keeps = kept(name, self.not_convert)
        return self.role(name, module, lambda tensor: not keeps and tensor == self.scale_name)

    @property
    def ignored(self) -> tuple[str, ...]:
        return self.not_convert


def _refuse(where: str, key: str, value: object, expected: str) -> CheckpointError:
    return CheckpointError(where, key, repr(value), expected)


def _block_size(where: str, value: object) -> int:
    if value is None:
        raise _refuse(where, "weight_block_size", value,
                      "[b, b]: a per-tensor FineGrainedFP8 checkpoint is not read")  # fmt: skip
    pair = _two_positive_ints(value)
    if pair is None:
        raise _refuse(where, "weight_block_size", value, "[rows, cols], two positive ints")
    if pair[0] != pair[1]:
        raise _refuse(where, "weight_block_size", value,
                      "square blocks [b, b]: fp8_block scales b x b tiles")  # fmt: skip
    return pair[0]


def _two_positive_ints(value: object) -> tuple[int, int] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    rows, cols = value
    if not (is_positive_int(rows) and is_positive_int(cols)):
        return None
    return int(rows), int(cols)


def not_convert_patterns(where: str, config: Mapping[str, Any]) -> tuple[str, ...]:
    """The config's ``modules_to_not_convert`` (alias ``ignored_layers``): transformers'
    patterns, each one refused that Python's re and RE2 would read apart."""
    key = "modules_to_not_convert"
    if config.get(key) is None and "ignored_layers" in config:
        key = "ignored_layers"
    value = config.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refuse(where, key, value, "a list of module names or patterns")
    for pattern in value:
        refusal = not_convert_refusal(pattern)
        if refusal is not None:
            raise _refuse(where, key, pattern, f"a name, a suffix or a regex Python's re "
                          f"and RE2 read alike: {refusal}")  # fmt: skip
    return tuple(value)


def from_hf_config(where: str, config: Mapping[str, Any]) -> FineGrainedFp8Layout:
    """The layout of a FineGrainedFP8 ``quantization_config``, or a ``CheckpointError``
    naming the first setting kernelpick does not read. Absent settings take transformers'
    defaults (dynamic activations, 128 x 128 blocks, fp32 scales)."""
    for key, value in config.items():
        if key not in _KNOWN:
            raise _refuse(where, key, value, "only FineGrainedFP8Config's settings: "
                          + ", ".join(_KNOWN))  # fmt: skip
    if config.get("quant_method") != METHOD:
        raise _refuse(where, "quant_method", config.get("quant_method"), repr(METHOD))
    scheme = config.get("activation_scheme", "dynamic")
    if not isinstance(scheme, str) or scheme.lower() != "dynamic":
        raise _refuse(where, "activation_scheme", scheme,
                      "'dynamic': fp8_block quantizes activations per call, and static "
                      "activation_scale tensors are not read")  # fmt: skip
    fmt = config.get("scale_fmt", "float")
    if fmt != "float":
        raise _refuse(where, "scale_fmt", fmt, "'float' (fp32 scales; ue8m0 is not read)")
    weights = config.get("fmt", "e4m3")
    if weights != "e4m3":
        raise _refuse(where, "fmt", weights, "'e4m3': the weights are float8_e4m3fn")
    experts = config.get("expert_dtype", "fp8")
    if experts != "fp8":
        raise _refuse(where, "expert_dtype", experts, "'fp8'")
    if config.get("modules_to_convert"):
        raise _refuse(where, "modules_to_convert", config["modules_to_convert"],
                      "none: kernelpick quantizes linears, not embeddings")  # fmt: skip
    size = _block_size(where, config.get("weight_block_size", [DEFAULT_BLOCK_SIZE] * 2))
    return FineGrainedFp8Layout(
        where=where, scheme=Scheme.FP8_BLOCK, block_size=size, scale_name=SCALE_NAME,
        not_convert=not_convert_patterns(where, config),
    )  # fmt: skip
