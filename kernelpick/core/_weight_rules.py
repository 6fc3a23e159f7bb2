"""The rules that read how an integer weight is laid out: its group size, its zero points,
its act-order permutation, and where tensor parallelism cuts its groups.

Two of them are opt-in: a kernel that does not declare a ``ZeroPoints`` or an ``ActOrder``
rule reads neither, and the core gives it the refusing default (``OPT_IN_DEFAULTS``), so
no kernel drops an asymmetric weight's zero points or an act-order weight's permutation
by forgetting a line. ``WholeGroupsPerPart`` holds for every kernel (``LAWS``).
"""

from __future__ import annotations

import attrs

from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import INTEGER_FORMATS, Dtype
from kernelpick.core._errors import InvalidValueError, is_bool, is_positive_int
from kernelpick.core._quant import GroupShape, QuantConfig
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._rule_fields import either, listed

__all__ = ["LAWS", "OPT_IN_DEFAULTS", "ActOrder", "GroupSizes", "WholeGroupsPerPart", "ZeroPoints"]


def _sizes(value: object) -> frozenset[int] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, tuple, list)):
        raise InvalidValueError(
            "GroupSizes sizes", value, "None (any) or a set of sizes, e.g. {128}"
        )
    if not all(is_positive_int(size) for size in value):
        raise InvalidValueError("GroupSizes sizes", value, "positive integers, e.g. {32, 64, 128}")
    return frozenset(value)


def _group_text(group: GroupShape) -> str:
    # A weight group along K is (g, 1) over the GEMM's [K, N] operand.
    if group.cols == 1 and group.rows > 0:
        return f"group size {group.rows}"
    return group.render()


@attrs.frozen
class GroupSizes:
    """The weight is scaled in groups of one of ``sizes`` consecutive elements along K
    (``(g, 1)`` over ``[K, N]``; None: any size), or per channel where ``per_channel``
    says so; with ``whole_k``, K is a multiple of the group (no short last group). What an
    integer weight-only kernel declares in place of ``WeightScales``: the group size is
    its own reason (``GROUP_SIZE``), the commonest a WNA16 kernel gives."""

    sizes: frozenset[int] | None = attrs.field(converter=_sizes)
    per_channel: bool = attrs.field(default=True, validator=is_bool, kw_only=True)
    whole_k: bool = attrs.field(default=False, validator=is_bool, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.sizes == frozenset() and not self.per_channel:
            expected = "some group sizes, or per_channel=True: this matches nothing"
            raise InvalidValueError("GroupSizes", "no sizes and per_channel=False", expected)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        group = config.weight.scale.group
        # A group as deep as K is one group per channel, whatever it is called.
        if group == GroupShape.PER_CHANNEL or (group.cols == 1 and group.rows >= config.k):
            if self.per_channel:
                return None
        elif (
            group.cols == 1 and group.rows > 0 and (self.sizes is None or group.rows in self.sizes)
        ):
            if not self.whole_k or config.k % group.rows == 0:
                return None
            found = f"group size {group.rows} with K={config.k}"
            return Reason(RejectCode.GROUP_SIZE, self._needed(), found)
        return Reason(RejectCode.GROUP_SIZE, self._needed(), _group_text(group))

    def _needed(self) -> str:
        if self.sizes is None:
            along = "of any size along K"
        elif not self.sizes:
            return "per channel"
        else:
            along = f"of {either([str(size) for size in sorted(self.sizes)])} along K"
        if self.whole_k:
            along += ", K a multiple of it"
        return f"{along}, or per channel" if self.per_channel else along

    def render(self) -> str:
        return f"weight groups {self._needed()}"


def _zero_point_dtypes(value: object) -> frozenset[Dtype]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, tuple, list)):
        raise InvalidValueError("ZeroPoints dtypes", value, "a set of dtypes, e.g. {'int4'}")
    dtypes = frozenset(Dtype.parse(item) for item in value)
    if not dtypes <= INTEGER_FORMATS:
        raise InvalidValueError(
            "ZeroPoints dtypes", value, f"dtypes among {listed(INTEGER_FORMATS)}"
        )
    return dtypes


@attrs.frozen
class ZeroPoints:
    """The kernel reads weight zero points in these formats; ``ZeroPoints()`` reads none
    (symmetric weights only), the default for a kernel that declares no such rule."""

    dtypes: frozenset[Dtype] = attrs.field(default=frozenset(), converter=_zero_point_dtypes)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        zero = config.weight.zero_point
        if zero is None or zero in self.dtypes:
            return None
        return Reason(RejectCode.ZERO_POINTS, self._needed(), f"{zero} zero points")

    def _needed(self) -> str:
        if not self.dtypes:
            return "symmetric weights only (no zero points)"
        return f"{listed(self.dtypes)} zero points, or none"

    def render(self) -> str:
        return "zero points " + (listed(self.dtypes) if self.dtypes else "none")


@attrs.frozen
class ActOrder:
    """Whether the kernel reads an act-order weight (a ``g_idx`` naming each column's
    group, GPTQ's ``desc_act``); ``ActOrder(False)`` is the default for a kernel that
    declares no such rule, since reading the groups in storage order would scale most
    columns with another group's scale."""

    permuted: bool = attrs.field(validator=is_bool)

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if self.permuted or not config.act_order:
            return None
        needed = "weights in group order (no act-order g_idx)"
        return Reason(RejectCode.ACT_ORDER, needed, "act-order (a g_idx permutation)")

    def render(self) -> str:
        return "act-order" if self.permuted else "no act-order"


@attrs.frozen
class WholeGroupsPerPart:
    """Where K is split across row-parallel ranks, each rank holds whole weight groups:
    every kernel reads its part's groups from its part's first column, so a group cut by
    the split would be scaled as two (vLLM's Marlin: "input_size_per_partition ... not
    divisible by group_size"). With act-order a rank's columns come from groups all over
    K, whose scales no rank's part holds, so that is refused too."""

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None:
        if config.k_parts == 1:
            return None
        if config.act_order:
            needed = "K unsplit for an act-order weight"
            return Reason(RejectCode.GROUP_STRADDLE, needed, f"K cut in {config.k_parts} parts")
        depth = config.weight.scale.group.rows
        # One scale down the whole of K (per channel, per tensor, or a group as deep as
        # every part together) is the same on every rank; any other group must fit a part.
        if depth == -1 or depth >= config.k * config.k_parts or config.k % depth == 0:
            return None
        needed = f"each part's K ({config.k}) a multiple of the weight group ({depth})"
        return Reason(RejectCode.GROUP_STRADDLE, needed, f"K={config.k} per part")

    def render(self) -> str:
        return "whole groups per rank"


# The refusing defaults, one per opt-in rule type (KernelSpec adds each one a spec omits).
OPT_IN_DEFAULTS = (ZeroPoints(), ActOrder(False))
# What every kernel obeys, whatever it declares.
LAWS = (WholeGroupsPerPart(),)
