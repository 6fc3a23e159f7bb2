"""The compressed-tensors quantization config: what kernelpick writes, and what it reads.

A checkpoint holds one config group: 8-bit symmetric weights (FP8 or int8) and, except for
weight-only, activations of the same type; or integer weights alone, 4 or 8 bits, in the
``pack-quantized`` format (``_pack_quantized``). Each other named scheme is one row of ``_ROWS``;
reading refuses anything outside the table by name (an unknown strategy, non-square
blocks, a group size or scale dtype mxfp8 does not have, a KV-cache scheme, transforms,
sparsity), so no checkpoint is half understood. The field names and values are those
compressed-tensors' ``QuantizationConfig`` and ``QuantizationArgs`` write (``quant_method``
"compressed-tensors"; ``format`` "float-quantized", "int-quantized", "naive-quantized" or
"mxfp8-quantized"; the ``FP8_BLOCK``, ``W8A8`` and ``MXFP8`` presets' arguments), which vLLM
and SGLang load too. mxfp8's E8M0 scales are stored as uint8 bytes: see
``kernelpick.kernels.E8M0_STORED``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import torch

from kernelpick.core import (
    DEFAULT_BLOCK_SIZE,
    INTEGER_WEIGHT_ONLY,
    MX_BLOCK_SIZE,
    InvalidValueError,
    Scheme,
    is_positive_int,
)
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats._ct_targets import check_regexes, matches, strings
from kernelpick.integration.formats._layout import Layout, Stored
from kernelpick.integration.formats._pack_quantized import (
    INT_FORMAT,
    IntArgs,
    int_weight_args,
    read_int_weights,
)

__all__ = [
    "METHOD",
    "SCHEMES",
    "CompressedTensorsLayout",
    "from_config",
    "matches",
    "to_config",
]

METHOD = "compressed-tensors"


@attrs.frozen
class _Row:
    """A scheme's arguments: the weights' type and strategy, the input activations'
    (strategy, dynamic) or None for weight-only, and the checkpoint format; these tell the
    rows apart. ``scale_dtype`` is what both operands' arguments say (None: scales in a
    float dtype), and ``group_size`` a group size fixed by the scheme (None: none, or
    fp8_block's, which varies)."""

    type: str
    weights: str
    activations: tuple[str, bool] | None
    format: str
    scale_dtype: str | None = None
    group_size: int | None = None


# compressed-tensors' spelling of an E8M0 scale: QuantizationArgs serializes its
# scale_dtype, torch.uint8, as "torch.uint8", and reads "uint8" as the same dtype.
_E8M0_SCALE_DTYPE = "torch.uint8"
_E8M0_SPELLINGS = (_E8M0_SCALE_DTYPE, "uint8")

_ROWS = {
    Scheme.FP8_PER_CHANNEL: _Row("float", "channel", ("token", True), "float-quantized"),
    Scheme.FP8_PER_TENSOR: _Row("float", "tensor", ("tensor", True), "float-quantized"),
    Scheme.FP8_PER_TENSOR_STATIC: _Row("float", "tensor", ("tensor", False), "float-quantized"),
    # compressed-tensors stores weight-only FP8 as "naive-quantized": the FP8 weight plus
    # its scales, as the others.
    Scheme.FP8_WEIGHT_ONLY: _Row("float", "channel", None, "naive-quantized"),
    # weights in b x b blocks (block_structure [b, b]), activations in 1 x b groups
    # (group_size b), as the FP8_BLOCK preset.
    Scheme.FP8_BLOCK: _Row("float", "block", ("group", True), "float-quantized"),
    Scheme.INT8_PER_CHANNEL: _Row("int", "channel", ("token", True), "int-quantized"),
    # weights and activations in 1 x 32 groups along K with E8M0 scales, as the MXFP8
    # preset; its weights' "group" strategy (fp8_block's is "block") tells the two apart.
    Scheme.MXFP8: _Row(
        "float", "group", ("group", True), "mxfp8-quantized", _E8M0_SCALE_DTYPE, MX_BLOCK_SIZE
    ),
}
# The schemes a compressed-tensors config can say: the rows, and pack-quantized's.
SCHEMES = (*_ROWS, *INTEGER_WEIGHT_ONLY)
# Settings that, when present and not empty, change what the tensors mean.
_UNSUPPORTED = ("kv_cache_scheme", "sparsity_config", "transform_config", "moe_sparsity_config")


@attrs.frozen(kw_only=True)
class CompressedTensorsLayout(Layout):
    """A compressed-tensors checkpoint: the modules ``targets`` match and ``ignore`` does
    not are quantized, with their scale stored as ``weight_scale`` (mxfp8's as E8M0 bytes,
    ``kernelpick.kernels.E8M0_STORED``)."""

    targets: tuple[str, ...]
    ignore: tuple[str, ...]

    def role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        if not matches(name, module, self.targets):
            return None
        return "the checkpoint keeps it in high precision" if matches(
            name, module, self.ignore
        ) else True  # fmt: skip

    def expected_role(self, name: str, module: torch.nn.Module) -> bool | str | None:
        return self.role(name, module, lambda _: True)  # targets and ignore say it all

    @property
    def ignored(self) -> tuple[str, ...]:
        return self.ignore

    @property
    def format(self) -> str:
        """The config's ``format``, which its scheme fixes."""
        row = _ROWS.get(self.scheme)
        return INT_FORMAT if row is None else row.format


def _args(row: _Row, strategy: str, dynamic: bool, size: int | None) -> dict[str, Any]:
    args = {"num_bits": 8, "type": row.type, "symmetric": True, "strategy": strategy,
            "dynamic": dynamic, "group_size": size if strategy == "group" else None}  # fmt: skip
    if strategy == "block":
        args["block_structure"] = [size, size]
    if row.scale_dtype is not None:  # compressed-tensors leaves a None scale_dtype out
        args["scale_dtype"] = row.scale_dtype
    return args


def to_config(
    scheme: Scheme,
    ignore: Iterable[str],
    block_size: int | None = None,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    act_order: bool = False,
) -> dict[str, Any]:
    """The ``quantization_config`` of a checkpoint whose every ``Linear`` but ``ignore`` is
    quantized with ``scheme`` (``block_size``: fp8_block's, 128 when None;
    ``group_size``, ``symmetric`` and ``act_order``: an integer weight-only scheme's)."""
    row = _ROWS.get(scheme)
    if scheme in INTEGER_WEIGHT_ONLY:
        weights = int_weight_args(scheme, group_size, symmetric, act_order)
        activations, fmt = None, INT_FORMAT
    elif row is None:
        valid = ", ".join(s.value for s in SCHEMES)
        raise InvalidValueError("scheme", scheme.value, f"one this format writes: {valid}")
    else:
        size = row.group_size
        if scheme is Scheme.FP8_BLOCK:
            size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        weights = _args(row, row.weights, False, size)
        activations = None if row.activations is None else _args(row, *row.activations, size)
        fmt = row.format
    group = {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": activations,
        "output_activations": None,
        "format": fmt,
    }
    return {
        "quant_method": METHOD,
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


@attrs.frozen
class _Args:
    type: str
    strategy: str
    dynamic: bool
    size: int | None  # the block's rows and columns, or the group's size
    scale_dtype: str | None  # as written: "uint8" and "torch.uint8" are one dtype


def _read_args(where: str, args: object, types: Iterable[str], strategies: Iterable[str]) -> _Args:
    if not isinstance(args, Mapping):
        raise CheckpointError(where, "", repr(args), "a mapping of quantization arguments")
    _field(where, args, "num_bits", [8])
    type_ = str(_field(where, args, "type", types))
    _field(where, {"symmetric": True, **args}, "symmetric", [True])
    _field(where, args, "actorder", [None, False])
    scale = _field(where, args, "scale_dtype", [None, *_E8M0_SPELLINGS])
    strategy = str(_field(where, args, "strategy", strategies))
    dynamic = bool(_field(where, {"dynamic": False, **args}, "dynamic", [True, False]))
    block, group = args.get("block_structure"), args.get("group_size")
    size: int | None = None
    if strategy == "block":
        if not (isinstance(block, list) and len(block) == 2 and all(map(is_positive_int, block))):
            raise CheckpointError(where, "block_structure", repr(block), "[rows, cols] of ints")
        if block[0] != block[1]:
            raise CheckpointError(where, "block_structure", repr(block),
                                  "square blocks [b, b]: fp8_block scales b x b tiles")  # fmt: skip
        size = block[0]
    else:
        _field(where, args, "block_structure", [None])
    if strategy == "group":
        if not is_positive_int(group):
            raise CheckpointError(where, "group_size", repr(group), "a positive int")
        size = group
    else:
        _field(where, args, "group_size", [None])
    return _Args(type_, strategy, dynamic, size, None if scale is None else str(scale))


def _scheme(at: str, weights: _Args, activations: _Args | None) -> Scheme:
    """The row ``weights`` and ``activations`` make, or a ``CheckpointError``."""
    if activations is not None and activations.type != weights.type:
        mixed = f"{activations.type!r}, with {weights.type!r} weights"
        raise CheckpointError(f"{at}.input_activations", "type", mixed, repr(weights.type))
    act = None if activations is None else (activations.strategy, activations.dynamic)
    found = (weights.type, weights.strategy, act)
    for scheme, row in _ROWS.items():
        if (row.type, row.weights, row.activations) != found:
            continue
        for place, args in (("weights", weights), ("input_activations", activations)):
            if args is not None:
                _check_row(f"{at}.{place}", scheme, row, args)
        if activations is not None and activations.size != weights.size:  # fp8_block's
            raise CheckpointError(
                f"{at}.input_activations", "group_size", repr(activations.size),
                f"{weights.size}, the weights' block size: fp8_block quantizes "
                "activations in groups as wide as the blocks",
            )  # fmt: skip
        return scheme
    supported = "; ".join(
        f"{s.value}: ({r.type}, {r.weights}, {r.activations})" for s, r in _ROWS.items()
    )
    raise CheckpointError(at, "weights/input_activations", str(found), supported)


def _check_row(where: str, scheme: Scheme, row: _Row, args: _Args) -> None:
    """Refuse an operand's ``scale_dtype`` or ``group_size`` that ``row`` does not have."""
    scale = _E8M0_SCALE_DTYPE if args.scale_dtype in _E8M0_SPELLINGS else args.scale_dtype
    if scale != row.scale_dtype:
        expected = (
            f"None: {scheme.value}'s scales are floats" if row.scale_dtype is None else
            f"{row.scale_dtype!r}: {scheme.value}'s scales are E8M0 exponent bytes (FP8 in "
            "groups is read only as mxfp8)"
        )  # fmt: skip
        raise CheckpointError(where, "scale_dtype", repr(args.scale_dtype), expected)
    if row.group_size is not None and args.size != row.group_size:
        raise CheckpointError(
            where, "group_size", repr(args.size),
            f"{row.group_size}: {scheme.value} scales 1 x {row.group_size} groups along K",
        )  # fmt: skip


def from_config(where: str, config: Mapping[str, Any]) -> CompressedTensorsLayout:
    """The layout of a compressed-tensors ``quantization_config``, or a ``CheckpointError``
    naming the first setting kernelpick does not read."""
    _field(where, config, "quant_method", [METHOD])
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
    act = group.get("input_activations")
    if group.get("output_activations") is not None:
        raise CheckpointError(at, "output_activations", repr(group["output_activations"]), "None")
    grouping: IntArgs | None = None
    raw = group.get("weights")
    if act is None and isinstance(raw, Mapping) and raw.get("type") == "int":
        grouping = read_int_weights(f"{at}.weights", raw)  # pack-quantized: W4A16, W8A16
        scheme, fmt = grouping.scheme, INT_FORMAT
    else:
        weights = _read_args(f"{at}.weights", raw, ["float", "int"],
                             ["channel", "tensor", "block", "group"])  # fmt: skip
        if weights.dynamic:
            raise CheckpointError(f"{at}.weights", "dynamic", "True", "False: weights have scales")
        activations = None if act is None else _read_args(
            f"{at}.input_activations", act, ["float", "int"], ["token", "tensor", "group"]
        )  # fmt: skip
        scheme = _scheme(at, weights, activations)
        fmt = _ROWS[scheme].format
        block = weights.size if scheme is Scheme.FP8_BLOCK else None
    _field(at, {"format": fmt, **group}, "format", [fmt])
    _field(where, {"format": fmt, **config}, "format", [fmt])
    targets = group.get("targets")
    ignore = config.get("ignore") or []
    if not strings(targets) or not targets or not strings(ignore):
        raise CheckpointError(at, "targets/ignore", repr((targets, ignore)), "lists of names")
    for place, key, patterns in ((at, "targets", targets), (where, "ignore", ignore)):
        check_regexes(place, key, patterns)
    if grouping is not None:
        return CompressedTensorsLayout(
            where=where, scheme=scheme, group_size=grouping.group_size,
            symmetric=grouping.symmetric, act_order=grouping.act_order,
            targets=tuple(targets), ignore=tuple(ignore),
        )  # fmt: skip
    return CompressedTensorsLayout(where=where, scheme=scheme, block_size=block,
                                   targets=tuple(targets), ignore=tuple(ignore))  # fmt: skip
