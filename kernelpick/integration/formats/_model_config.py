"""The ``quantization_config`` a converted model carries, so that every way of saving it
writes one format: compressed-tensors', which stock readers (transformers with
compressed-tensors installed, vLLM, SGLang) load as the quantized model it is.

A transformers model's ``save_pretrained`` writes ``model.config.quantization_config``
beside the state dict. Without one, the FP8 or int8 weights it writes would load into plain
linears, cast without their scales: silently wrong. So whatever converts a transformers
model (``quantize_model``, ``load_quantized``, the transformers quantizer) records the
compressed-tensors config of its quantized layers there, the same config ``save_quantized``
writes; and a conversion that would leave layers no single such config describes (another
scheme beside this one, another method's quantized modules, tensor-parallel shards) is
refused before the model changes. Models built from one config object share it, as they
do with transformers' own quantizers: the config describes the model converted last.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from kernelpick.core import (
    INTEGER_WEIGHT_ONLY,
    InvalidValueError,
    QuantConfig,
    Scheme,
    block_size_of,
    group_size_of,
    scheme_of,
)
from kernelpick.integration.formats._layout import QUANTIZATION_CONFIG
from kernelpick.integration.formats.compressed_tensors import SCHEMES, matches, to_config
from kernelpick.integration.layer import LayerState, Recipe, find_state, is_weight_only_int

__all__ = [
    "carries_config",
    "check_one_config",
    "fp32_modules",
    "quantization_config",
    "quantized_layers",
    "record",
]

_KERNELPICK = "kernelpick"  # the transformers quantizer's quant_method


def carries_config(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a transformers config, which its ``save_pretrained`` writes."""
    config = getattr(model, "config", None)
    return callable(getattr(config, "to_json_string", None))


def fp32_modules(model: torch.nn.Module) -> list[str]:
    """The patterns of the modules a transformers model keeps in fp32 whatever dtype it
    gets (``_keep_in_fp32_modules``, ``_keep_in_fp32_modules_strict``), matched by
    transformers' ``modules_to_not_convert`` rule: they are never quantized (T5 casts its
    activations to such a module's weight dtype, which FP8 cannot serve)."""
    return [
        str(pattern)
        for attribute in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict")
        for pattern in (getattr(model, attribute, None) or [])
    ]


def quantized_layers(model: torch.nn.Module) -> dict[str, LayerState]:
    """Every kernelpick layer of ``model`` by name; an error for one that is not processed
    or is one rank's shard, whose tensors are not a whole layer's."""
    found: dict[str, LayerState] = {}
    for name, module in model.named_modules():
        state = find_state(module)
        if state is None:
            continue
        if not state.processed:
            expected = "a layer whose weights were processed (process_weights_after_loading)"
            raise InvalidValueError("layer", name, expected)
        if state.parallel is not None:
            raise InvalidValueError(
                "layer", name,
                f"a whole layer, not a shard {state.parallel.describe()}: save the unsharded "
                "model (quantize_model), which every rank then loads and narrows",
            )  # fmt: skip
        found[name] = state
    return found


# A layer's scheme and the settings a config group holds one of: fp8_block's block size,
# an integer weight-only scheme's (group size, symmetric, act-order); None for the others.
_Variant = tuple[Scheme | None, object]


def _one_scheme(pairs: Iterable[_Variant]) -> tuple[Scheme, object]:
    """The one named scheme (and its one block size or grouping) of ``pairs``, or an error."""
    found = set(pairs)
    schemes = {scheme for scheme, _ in found}
    named = [s for s in schemes if s is not None]
    if len(schemes) != 1 or len(named) != 1:  # none, several, or a custom config
        listed = sorted(str(s) for s in schemes) or "no quantized layer"
        raise InvalidValueError(
            "schemes of the quantized layers", listed,
            "one named scheme for every quantized layer (quantize_model first): one "
            "compressed-tensors config group describes them",
        )  # fmt: skip
    scheme = named[0]
    if scheme not in SCHEMES:
        valid = ", ".join(s.value for s in SCHEMES)
        raise InvalidValueError("scheme of the quantized layers", scheme.value, f"one of {valid}")
    variants = sorted({variant for _, variant in found})  # type: ignore[type-var]  # one type
    if len(variants) > 1:
        what = "block sizes" if scheme is Scheme.FP8_BLOCK else "(group size, symmetric, act-order)"
        raise InvalidValueError(
            f"{what} of the {scheme.value} layers", variants,
            "one of them: a compressed-tensors config group holds one",
        )  # fmt: skip
    return scheme, variants[0]


def _variant(config: QuantConfig) -> _Variant:
    scheme = scheme_of(config)
    if scheme is Scheme.FP8_BLOCK:
        return scheme, block_size_of(config)
    if scheme in INTEGER_WEIGHT_ONLY:
        return scheme, (group_size_of(config), config.weight.zero_point is None, config.act_order)
    return scheme, None


def _pairs(layers: dict[str, LayerState]) -> list[_Variant]:
    return [_variant(state.config) for state in layers.values()]


def quantization_config(model: torch.nn.Module) -> dict[str, Any]:
    """The compressed-tensors ``quantization_config`` of ``model``'s quantized layers: one
    config group of their scheme, every other linear in ``ignore``. An error where no
    such config describes them (no quantized layer, several schemes, shards)."""
    layers = quantized_layers(model)
    for name, state in layers.items():
        _check_readable(name, state.config)
    return _described(model, layers)


def _check_readable(name: str, config: QuantConfig) -> None:
    """Refuse to write an integer layer the format's readers refuse: compressed-tensors
    quantizes and decompresses only whole groups along K, and 0.20 dropped act-order's
    ``actorder: "group"`` (its compressor no longer reads a ``g_idx``)."""
    if not is_weight_only_int(config):
        return
    size = group_size_of(config)
    if size is not None and size > 0 and config.k % size:
        raise InvalidValueError(
            f"group size of {name}", size,
            f"a divisor of its K = {config.k}: compressed-tensors reads only whole groups "
            "(quantize with a group size dividing every layer's K, or -1 per channel)",
        )  # fmt: skip
    if config.act_order:
        raise InvalidValueError(
            f"act-order layer {name}", "weight_g_idx",
            "layers in group order: compressed-tensors no longer reads actorder 'group' "
            "checkpoints, so kernelpick does not write them (keep the checkpoint it loaded)",
        )  # fmt: skip


def _described(model: torch.nn.Module, layers: dict[str, LayerState]) -> dict[str, Any]:
    scheme, variant = _one_scheme(_pairs(layers))
    ignore = [
        name for name, module in model.named_modules()
        if name and name not in layers and matches(name, module, ["Linear"])
    ]  # fmt: skip
    if isinstance(variant, tuple):
        size, symmetric, act_order = variant
        return to_config(scheme, ignore, group_size=size, symmetric=symmetric, act_order=act_order)
    return to_config(scheme, ignore, variant if isinstance(variant, int) else None)


def check_one_config(model: torch.nn.Module, recipe: Recipe) -> None:
    """Refuse, before a conversion changes ``model``, one that would leave it holding
    layers no recorded config could describe: where ``model`` carries a transformers config,
    every kernelpick layer it already has must share ``recipe``'s scheme (and its block
    size or grouping), and no other method may have quantized it (transformers'
    ``hf_quantizer``)."""
    if not carries_config(model):
        return
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)) != _KERNELPICK:
        raise InvalidValueError(
            "model quantized by transformers with", str(getattr(method, "value", method)),
            f"a model no other method quantized ({_KERNELPICK} loads and converts "
            "high-precision ones): one quantization_config cannot describe both",
        )  # fmt: skip
    _one_scheme([*_pairs(quantized_layers(model)), _variant(recipe.sample_config())])


def _untied(model: torch.nn.Module) -> None:
    """A head that ``quantize_model(untie=True)`` made a quantized copy of is no longer tied
    to the input embedding: say so, or a reader would tie the embedding's float weight to
    the head's FP8 one again (stock transformers then fails on the promotion)."""
    output = getattr(model, "get_output_embeddings", None)
    head = output() if callable(output) else None
    if not isinstance(head, torch.nn.Module) or find_state(head) is None:
        return
    config: object = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    for each in {id(c): c for c in (config, text() if callable(text) else config)}.values():
        if getattr(each, "tie_word_embeddings", False):
            setattr(each, "tie_word_embeddings", False)  # noqa: B010  # a config of any class


def record(model: torch.nn.Module) -> None:
    """Give a transformers ``model`` holding quantized layers their compressed-tensors
    config, which its ``save_pretrained`` writes (``check_one_config`` ran first)."""
    layers = quantized_layers(model) if carries_config(model) else {}
    if layers:
        _untied(model)
        setattr(model.config, QUANTIZATION_CONFIG, _described(model, layers))
