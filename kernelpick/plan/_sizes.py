"""The sizes a model's config gives, checked as the file states them before transformers
reads them: it builds whatever it is given (a zero head count divides by zero deep in a
config's or a model's ``__init__``, a negative size fails in torch, 200,000 layers take
minutes and gigabytes even on the meta device), so each is refused here, a
``CheckpointError`` naming the file, the key and the value."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kernelpick.integration import CheckpointError

__all__ = ["MAX_EXPERTS", "MAX_LAYERS", "check_sizes"]

# The deepest published transformer language models have about 130 layers (Llama-3.1-405B
# 126). A Llama-3-8B layer takes about 1.3 ms and 40 KiB to build on the meta device and
# plan (measured on the 2-core VM: 1024 layers in 2.3 s), so the 200,000 a config may say
# would take minutes and gigabytes before anything could be refused.
MAX_LAYERS = 1024
# Experts are modules to build, as layers are (SwitchTransformers: 8,000 took 6 s), so
# they are capped too; Doge's default is 16,384 tiny experts (rows of an embedding), four
# times that is the cap: about 50 s where each expert is a module.
MAX_EXPERTS = 65536

# The sizes that make a model's layers, by transformers' common names; a config class's
# attribute_map gives its own (GPT-2 stores hidden_size as n_embd).
_SIZES = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
          "num_key_value_heads", "head_dim", "vocab_size")  # fmt: skip
_LAYER_COUNTS = ("num_hidden_layers", "num_decoder_layers", "encoder_layers", "decoder_layers")

# A model type's attribute_map (common name -> the name its config stores it under).
Aliases = Callable[[object], Mapping[str, str]]


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_CAPS = {"layers": MAX_LAYERS, "experts": MAX_EXPERTS}


def _check_count(path: str, key: str, value: object, what: str | None = None) -> None:
    """A count of ``what`` (by default, what ``key`` ends with: Mllama's
    num_global_layers, n_routed_experts) past its cap: the modules would take minutes to
    build."""
    what = what or next((ending for ending in _CAPS if key.endswith(ending)), None)
    if what is None or not isinstance(value, int) or isinstance(value, bool):
        return
    if value <= _CAPS[what]:
        return
    raise CheckpointError(
        path, key, repr(value),
        f"at most {_CAPS[what]} {what}, several times the most any published model has; "
        "building more would take minutes and gigabytes",
    )  # fmt: skip


def _configs(data: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``data`` and every sub-config it holds (a LLaVA's text_config and vision_config),
    each with the prefix of its keys in the file."""
    yield prefix, data
    for key, value in data.items():
        if key.endswith("_config") and isinstance(value, dict):
            yield from _configs(value, f"{prefix}{key}.")


def _given(data: Mapping[str, Any], aliases: Mapping[str, str], name: str) -> tuple[str, Any]:
    """The key ``name`` is stored under in ``data`` and its value (None: not given)."""
    for key in dict.fromkeys((name, aliases.get(name, name))):
        if data.get(key) is not None:
            return key, data[key]
    return aliases.get(name, name), None


def check_sizes(path: str, data: Mapping[str, Any], aliases: Aliases) -> None:
    """Refuse, in the config ``data`` read from ``path``, a size that is no positive int
    (or list of them, a size per layer; a ``head_dim`` of 0 is MLA's, unused), more than
    ``MAX_LAYERS`` layers or ``MAX_EXPERTS`` experts (under any key ending so), and KV
    heads that do not divide the attention heads
    (vLLM gives each KV head as many query heads). ``aliases`` gives a model type's
    attribute_map."""
    for prefix, each in _configs(data, ""):
        names = aliases(each.get("model_type"))
        for name in (*_SIZES, *_LAYER_COUNTS):
            key, value = _given(each, names, name)
            if value is None:
                continue
            # Some models give a size per layer (Gemma 3n's intermediate_size, Ernie-4.5-VL's
            # moe_intermediate_size), and MLA models a head_dim of 0, unused (GLM-5).
            # LXMERT counts its layers per stack ({"vision": 5, "language": 9, ...}).
            per_stack = isinstance(value, dict) and name in _LAYER_COUNTS
            sizes = list(value.values()) if per_stack else value
            sizes = sizes if isinstance(sizes, list) else [sizes]
            if name == "head_dim" and type(value) is int and value == 0:
                continue
            if not sizes or not all(_positive(size) for size in sizes):
                expected = "a positive int, or a list of them"
                raise CheckpointError(path, prefix + key, repr(value), expected)
            if name in _LAYER_COUNTS:  # under its own name, or its model's (GPT-2's n_layer)
                for count in sizes:
                    _check_count(path, prefix + key, count, "layers")
        for key, value in each.items():
            _check_count(path, prefix + key, value)
        heads_key, heads = _given(each, names, "num_attention_heads")
        kv_key, kv = _given(each, names, "num_key_value_heads")
        if _positive(heads) and _positive(kv) and heads % kv:
            raise CheckpointError(
                path, prefix + kv_key, repr(kv),
                f"a divisor of {prefix + heads_key} ({heads}): vLLM gives each KV head the "
                "same number of query heads",
            )  # fmt: skip
