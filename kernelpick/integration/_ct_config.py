"""The compressed-tensors quantization config: what kernelpick writes, and what it reads.

A checkpoint holds one config group: FP8 weights (8-bit symmetric floats) and, except for
weight-only, FP8 activations. Each named scheme is one row of ``_ARGS``; reading refuses
anything outside the table by name (an unknown strategy, block scales, a KV-cache scheme,
transforms, sparsity), so no checkpoint is half understood. The field names and values
are those compressed-tensors' ``QuantizationConfig`` writes (``quant_method``
"compressed-tensors", ``format`` "float-quantized"), which vLLM and SGLang load too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from kernelpick.core._schemes import Scheme
from kernelpick.integration._errors import CheckpointError

__all__ = ["QUANTIZATION_CONFIG", "from_config", "matches", "to_config"]

QUANTIZATION_CONFIG = "quantization_config"
_METHOD = "compressed-tensors"
_FP8 = {"num_bits": 8, "type": "float", "symmetric": True}

# scheme: (weights strategy, input_activations (strategy, dynamic), or None for weight-only)
_ARGS: dict[Scheme, tuple[str, tuple[str, bool] | None]] = {
    Scheme.FP8_PER_CHANNEL: ("channel", ("token", True)),
    Scheme.FP8_PER_TENSOR: ("tensor", ("tensor", True)),
    Scheme.FP8_PER_TENSOR_STATIC: ("tensor", ("tensor", False)),
    Scheme.FP8_WEIGHT_ONLY: ("channel", None),
}
# compressed-tensors stores W8A8 FP8 layers as "float-quantized" and weight-only ones as
# "naive-quantized"; both are the FP8 weight plus its scales.
_FORMATS = {True: "float-quantized", False: "naive-quantized"}
# Settings that, when present and not empty, change what the tensors mean.
_UNSUPPORTED = ("kv_cache_scheme", "sparsity_config", "transform_config", "moe_sparsity_config")


def _args(strategy: str, dynamic: bool) -> dict[str, Any]:
    return {**_FP8, "strategy": strategy, "dynamic": dynamic, "group_size": None}


def to_config(scheme: Scheme, ignore: Iterable[str]) -> dict[str, Any]:
    """The ``quantization_config`` of a checkpoint whose every ``Linear`` but ``ignore`` is
    quantized with ``scheme``."""
    weights, activations = _ARGS[scheme]
    fmt = _FORMATS[activations is not None]
    group = {
        "targets": ["Linear"],
        "weights": _args(weights, False),
        "input_activations": None if activations is None else _args(*activations),
        "output_activations": None,
        "format": fmt,
    }
    return {
        "quant_method": _METHOD,
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
    }


def _field(where: str, config: Mapping[str, Any], key: str, allowed: Iterable[object]) -> object:
    value = config.get(key)
    options = list(allowed)
    if value not in options:
        raise CheckpointError(where, key, repr(value), " or ".join(repr(o) for o in options))
    return value


def _read_args(where: str, args: object, strategies: Iterable[str]) -> tuple[str, bool]:
    if not isinstance(args, Mapping):
        raise CheckpointError(where, "", repr(args), "a mapping of quantization arguments")
    _field(where, args, "num_bits", [8])
    _field(where, args, "type", ["float"])
    _field(where, {"symmetric": True, **args}, "symmetric", [True])
    for key in ("group_size", "block_structure", "actorder", "scale_dtype"):
        _field(where, args, key, [None, False] if key == "actorder" else [None])
    strategy = str(_field(where, args, "strategy", strategies))
    dynamic = bool(_field(where, {"dynamic": False, **args}, "dynamic", [True, False]))
    return strategy, dynamic


def from_config(where: str, config: object) -> tuple[Scheme, tuple[str, ...], tuple[str, ...]]:
    """(scheme, targets, ignore) of a compressed-tensors ``quantization_config``, or a
    ``CheckpointError`` naming the first setting kernelpick does not read."""
    if not isinstance(config, Mapping):
        raise CheckpointError(where, QUANTIZATION_CONFIG, repr(config), "a mapping")
    _field(where, config, "quant_method", [_METHOD])
    _field(where, {"quantization_status": "compressed", **config}, "quantization_status",
           ["compressed"])  # fmt: skip
    for key in _UNSUPPORTED:
        if config.get(key):
            raise CheckpointError(where, key, repr(config[key]), "none: kernelpick reads linears")
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        count = len(groups) if isinstance(groups, Mapping) else repr(groups)
        raise CheckpointError(where, "config_groups", str(count), "exactly one config group")
    name, group = next(iter(groups.items()))
    at = f"{where}: config_groups.{name}"
    if not isinstance(group, Mapping):
        raise CheckpointError(at, "", repr(group), "weights and input_activations (not a preset)")
    weights = _read_args(f"{at}.weights", group.get("weights"), ["channel", "tensor"])
    if weights[1]:
        raise CheckpointError(f"{at}.weights", "dynamic", "True", "False: weights have scales")
    act = group.get("input_activations")
    activations = None if act is None else _read_args(f"{at}.input_activations", act,
                                                       ["token", "tensor"])  # fmt: skip
    if group.get("output_activations") is not None:
        raise CheckpointError(at, "output_activations", repr(group["output_activations"]), "None")
    found = (weights[0], activations)
    schemes = [scheme for scheme, args in _ARGS.items() if args == found]
    if not schemes:
        supported = "; ".join(f"{s.value}: {a}" for s, a in _ARGS.items())
        raise CheckpointError(at, "weights/input_activations", str(found), supported)
    fmt = _FORMATS[activations is not None]
    _field(at, {"format": fmt, **group}, "format", [fmt])
    _field(where, {"format": fmt, **config}, "format", [fmt])
    targets = group.get("targets")
    ignore = config.get("ignore") or []
    if not _strings(targets) or not targets or not _strings(ignore):
        raise CheckpointError(at, "targets/ignore", repr((targets, ignore)), "lists of names")
    return schemes[0], tuple(targets), tuple(ignore)


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def matches(name: str, module: torch.nn.Module, patterns: Iterable[str]) -> bool:
    """compressed-tensors' rule: a pattern is a module name, ``re:`` and a regular
    expression matched from the start of the name, or a class name in the module's MRO
    (``Linear`` also matching vLLM's ``LinearBase``)."""
    classes = {cls.__name__ for cls in type(module).__mro__}
    if "LinearBase" in classes:
        classes.add("Linear")
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern.removeprefix("re:"), name):
                return True
        elif pattern == name or pattern in classes:
            return True
    return False
