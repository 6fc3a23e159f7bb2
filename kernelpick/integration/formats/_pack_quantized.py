"""compressed-tensors' ``pack-quantized`` weight arguments: the integer weight-only schemes
(``int4_weight_only``, ``int8_weight_only``), as its ``W4A16``, ``W4A16_ASYM`` and
``W8A16`` presets and GPTQ checkpoints write them.

The weights' ``num_bits`` names the scheme (4 or 8), ``strategy`` the grouping ("group"
with a ``group_size``, or "channel"), ``symmetric`` whether zero points are stored, and
``actorder`` whether a ``weight_g_idx`` is: "group" (also spelled "dynamic") stores one;
"weight" (also "static") and None permuted the columns back when the tool wrote them, so
their groups are contiguous. Anything else is refused by name, never guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kernelpick.core import (
    INTEGER_WEIGHT_ONLY,
    PER_CHANNEL_GROUP,
    Scheme,
    is_positive_int,
)
from kernelpick.integration._errors import CheckpointError

__all__ = ["INT_FORMAT", "IntArgs", "int_weight_args", "read_int_weights"]

INT_FORMAT = "pack-quantized"
_BITS = {dtype.bits: scheme for scheme, (dtype, _) in INTEGER_WEIGHT_ONLY.items()}
# actorder -> whether the checkpoint stores a g_idx (compressed-tensors' ActivationOrdering).
_ACT_ORDER = {None: False, False: False, "weight": False, "static": False,
              "group": True, "dynamic": True}  # fmt: skip
# The dtypes compressed-tensors writes a zero point's zp_dtype as (None: its default).
_ZP_DTYPES = (None, "torch.int8", "int8")


@attrs.frozen
class IntArgs:
    """An integer weight-only config group: the scheme and its grouping."""

    scheme: Scheme
    group_size: int  # -1 per channel
    symmetric: bool
    act_order: bool


def int_weight_args(
    scheme: Scheme, group_size: int | None, symmetric: bool, act_order: bool
) -> dict[str, Any]:
    """The ``weights`` arguments compressed-tensors writes for ``scheme`` and grouping
    (``group_size`` None: the scheme's default)."""
    dtype, default = INTEGER_WEIGHT_ONLY[scheme]
    size = default if group_size is None else group_size
    channel = size == PER_CHANNEL_GROUP
    return {
        "num_bits": dtype.bits, "type": "int", "symmetric": symmetric,
        "group_size": None if channel else size, "strategy": "channel" if channel else "group",
        "dynamic": False, "actorder": "group" if act_order else None,
    }  # fmt: skip


def read_int_weights(where: str, args: Mapping[str, Any]) -> IntArgs:
    """The integer weight-only scheme ``args`` (a config group's ``weights``) describe,
    or a ``CheckpointError`` naming the first field outside what is read."""
    bits = args.get("num_bits")
    if isinstance(bits, bool) or bits not in _BITS:
        raise CheckpointError(where, "num_bits", repr(bits), "4 or 8 (int4 or int8 weights)")
    symmetric = args.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise CheckpointError(where, "symmetric", repr(symmetric), "true or false")
    order = args.get("actorder")
    if not isinstance(order, (str, bool, type(None))) or order not in _ACT_ORDER:
        raise CheckpointError(where, "actorder", repr(order), "null, 'group' or 'weight'")
    if args.get("dynamic", False) is not False:
        raise CheckpointError(where, "dynamic", repr(args["dynamic"]), "false: weights have scales")
    for key in ("block_structure", "scale_dtype"):
        if args.get(key) is not None:
            raise CheckpointError(where, key, repr(args[key]), "null: float scales per group")
    if args.get("zp_dtype") not in _ZP_DTYPES:
        raise CheckpointError(where, "zp_dtype", repr(args["zp_dtype"]), "null or 'torch.int8'")
    strategy = args.get("strategy")
    group = args.get("group_size")
    if strategy == "group":
        if not is_positive_int(group):
            raise CheckpointError(where, "group_size", repr(group), "a positive int")
        size = int(group)
    elif strategy == "channel":
        if group not in (None, PER_CHANNEL_GROUP):
            raise CheckpointError(where, "group_size", repr(group), "null for strategy 'channel'")
        size = PER_CHANNEL_GROUP
    else:
        raise CheckpointError(where, "strategy", repr(strategy), "'group' or 'channel'")
    act_order = _ACT_ORDER[order]
    if act_order and size == PER_CHANNEL_GROUP:
        raise CheckpointError(where, "actorder", repr(order), "null: a channel has no groups")
    return IntArgs(_BITS[bits], size, symmetric, act_order)
