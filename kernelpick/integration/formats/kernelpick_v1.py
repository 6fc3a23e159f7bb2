"""kernelpick's own checkpoint config from before it wrote compressed-tensors':
``quant_method`` "kernelpick", ``format_version`` 1, which the transformers quantizer's
``save_pretrained`` wrote beside the canonical FP8 or int8 tensors (``weight`` and
``weight_scale`` per layer). The quantizer still loads such checkpoints; this reader says
what one holds (``kernelpick inspect``).

A module is quantized when the checkpoint stores its ``weight_scale``; the config's
``modules_to_not_convert`` (transformers' patterns; ``["lm_head"]`` when absent, the
quantizer's default) keep modules in high precision. No integer weight-only scheme was
ever written in this format, and none is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kernelpick.core import INTEGER_WEIGHT_ONLY, KernelpickError
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats._head import HEAD_PATTERNS
from kernelpick.integration.formats.fine_grained_fp8 import (
    FineGrainedFp8Layout,
    not_convert_patterns,
)
from kernelpick.integration.layer import CheckpointFormat, Recipe

__all__ = ["FORMAT_VERSION", "KEYS", "METHOD", "KernelpickV1Layout", "from_kernelpick_config"]

METHOD = "kernelpick"
FORMAT_VERSION = 1
# The settings KernelpickConfig.to_dict writes; any other is a config this reader cannot vouch for.
KEYS = (
    "quant_method", "scheme", "modules_to_not_convert", "block_size", "group_size", "symmetric",
    "format_version",
)  # fmt: skip


@attrs.frozen(kw_only=True)
class KernelpickV1Layout(FineGrainedFp8Layout):
    """A format_version 1 checkpoint: quantized where its ``weight_scale`` is stored, as
    FineGrainedFP8's are where their ``weight_scale_inv`` is, by the same
    ``modules_to_not_convert`` rule."""


def from_kernelpick_config(where: str, config: Mapping[str, Any]) -> KernelpickV1Layout:
    """The layout of a ``quant_method`` "kernelpick" config, or a ``CheckpointError``
    naming the first setting that is not format_version 1's."""
    for key, value in config.items():
        if key not in KEYS:
            raise CheckpointError(where, key, repr(value), f"only the settings {', '.join(KEYS)}")
    if config.get("quant_method") != METHOD:
        raise CheckpointError(where, "quant_method", repr(config.get("quant_method")), repr(METHOD))
    version = config.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(
            where, "format_version", repr(version),
            f"{FORMAT_VERSION}: the quantized tensors a checkpoint stores (a kernelpick config "
            "without one quantizes high-precision weights on load)",
        )  # fmt: skip
    settings = {key: config.get(key) for key in ("scheme", "block_size", "group_size")}
    try:
        recipe = Recipe.of(
            **settings,  # type: ignore[arg-type]  # checked by Recipe.of
            checkpoint_format=CheckpointFormat.PRE_QUANTIZED,
            symmetric=config.get("symmetric", True),
        )
    except KernelpickError as error:
        raise CheckpointError(where, "scheme", repr(settings), str(error)) from error
    if recipe.scheme in INTEGER_WEIGHT_ONLY:
        raise CheckpointError(
            where, "scheme", repr(recipe.scheme.value),
            "an FP8 or int8 W8A8 scheme: format_version 1 held no integer weight-only layers "
            "(kernelpick saves those as compressed-tensors' pack-quantized)",
        )  # fmt: skip
    listed = config.get("modules_to_not_convert")
    listed = list(HEAD_PATTERNS) if listed is None else listed  # the quantizer's default
    patterns = not_convert_patterns(where, {"modules_to_not_convert": listed})
    return KernelpickV1Layout(
        where=where, scheme=recipe.scheme, block_size=recipe.block_size,
        not_convert=patterns,
    )  # fmt: skip
