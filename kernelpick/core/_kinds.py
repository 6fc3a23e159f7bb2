"""Kernel kinds and the one table that says which activation configs each kind may serve.

A W8A8 kernel quantizes activations; a W8A16 kernel leaves them in high precision. The
table below is the whole policy: the two rules the core adds to every kernel of a kind
read it, and ``KernelSpec`` reads it to check a kernel's declared fallbacks, so no
kernel, built-in or an engine's, can serve a config its kind must not.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError, parse_enum
from kernelpick.core._quant import ActivationGrouping, GroupShape, QuantConfig
from kernelpick.core._reasons import Reason, RejectCode

__all__ = [
    "KIND_TABLE",
    "ActivationQuantized",
    "KernelKind",
    "Service",
    "WeightOnlyActivation",
    "as_kind",
    "fallback_groups",
    "kind_reason",
]


class KernelKind(enum.Enum):
    """Whether a kernel quantizes activations (W8A8) or only weights (W8A16).

    The kind is about activations only: W8A16 names every weight-only kernel, whatever its
    weight's width (FP8, int8 or int4, vLLM's W8A16 and WNA16 alike); what weights a
    kernel reads is its ``QuantDtypes`` / ``Fp8Dtypes`` rule's business.
    """

    W8A8 = "W8A8"
    W8A16 = "W8A16"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> KernelKind:
        """From a member or its name, ``"W8A8"`` or ``"w8a16"``."""
        return parse_enum(cls, value, "kernel kind")


def as_kind(value: object) -> KernelKind:
    """``KernelKind.parse`` as a plain function, for use as an attrs converter."""
    return KernelKind.parse(value)


class Service(enum.Enum):
    """How a kernel of a kind serves one activation grouping."""

    EXACT = "exact"  # as the config asks (the kernel's own rules still apply)
    FALLBACK = "fallback"  # degraded: activations stay unquantized; strict policy refuses
    NEVER = "never"  # turned down whatever the kernel declares

    def __str__(self) -> str:
        return self.value


_W8A8, _W8A16, _G = KernelKind.W8A8, KernelKind.W8A16, ActivationGrouping

KIND_TABLE: Mapping[tuple[KernelKind, ActivationGrouping], Service] = MappingProxyType(
    {
        # A W8A8 kernel needs the config to say how to quantize activations.
        (_W8A8, _G.NONE): Service.NEVER,
        (_W8A8, _G.PER_TENSOR): Service.EXACT,
        (_W8A8, _G.TOKEN_GROUP): Service.EXACT,
        (_W8A8, _G.PER_TOKEN): Service.EXACT,
        (_W8A8, _G.OTHER): Service.EXACT,
        (_W8A16, _G.NONE): Service.EXACT,
        # One scale for the whole activation is the coarsest there is; skipping it is how
        # engines run per-tensor FP8 on GPUs without FP8 tensor cores (vLLM's Marlin).
        (_W8A16, _G.PER_TENSOR): Service.FALLBACK,
        # Block FP8 (1x128 groups) runs on A100s and T4s this way in vLLM (Marlin, Humming).
        (_W8A16, _G.TOKEN_GROUP): Service.FALLBACK,
        # A per-token (PTPC) config is never served by a weight-only kernel: vLLM issue
        # 61316 chose Marlin for one silently and threw its reasons away.
        (_W8A16, _G.PER_TOKEN): Service.NEVER,
        (_W8A16, _G.OTHER): Service.NEVER,
    }
)


def _served(kind: KernelKind, grouping: ActivationGrouping) -> Service:
    return KIND_TABLE[(kind, grouping)]


def fallback_groups(kind: KernelKind, value: object) -> frozenset[GroupShape] | None:
    """Check a spec's declared fallback activation groupings against the table: None (the
    table's default), or a set of group shapes each of a grouping the kind may fall back
    for. A W8A8 kernel has no fallbacks; per-token is never one."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, GroupShape)) or not isinstance(value, (set, frozenset)):
        raise InvalidValueError("fallback", value, "None or a set of GroupShape values")
    if kind is KernelKind.W8A8:
        expected = "None: a W8A8 kernel quantizes activations itself, so it falls back for none"
        raise InvalidValueError("fallback", value, expected)
    for group in value:
        if not isinstance(group, GroupShape):
            raise InvalidValueError("fallback", group, "GroupShape values, e.g. GroupShape(1, 128)")
        grouping = ActivationGrouping.of_group(group)
        if _served(kind, grouping) is not Service.FALLBACK:
            allowed = [g.value for g in ActivationGrouping if _served(kind, g) is Service.FALLBACK]
            expected = (
                f"groupings a {kind} kernel may serve degraded: {', '.join(allowed)}"
                if allowed
                else f"none: a {kind} kernel quantizes activations itself"
            )
            raise InvalidValueError("fallback", f"{group.render()} ({grouping})", expected)
    return frozenset(value)


def kind_reason(
    kind: KernelKind, config: QuantConfig, fallback: frozenset[GroupShape] | None = None
) -> Reason | None:
    """Why a kernel of ``kind`` (declaring ``fallback``) must not serve ``config``, or None.
    The two kind rules are this function; a bound kernel checks it too, so no way of
    building one skips it."""
    if kind is KernelKind.W8A8:
        return ActivationQuantized().check(None, config)
    return WeightOnlyActivation(fallback).check(None, config)


@attrs.frozen
class ActivationQuantized:
    """A W8A8 kernel quantizes activations, so the config must say how."""

    def check(self, caps: DeviceCaps | None, config: QuantConfig) -> Reason | None:
        if _served(KernelKind.W8A8, config.activation_grouping) is not Service.NEVER:
            return None
        return Reason(RejectCode.ACTIVATION_REQUIRED, "an activation quantization", "none")

    def render(self) -> str:
        return "an activation quantization (W8A8)"


def _fallback_set(value: object) -> frozenset[GroupShape] | None:
    return fallback_groups(KernelKind.W8A16, value)


@attrs.frozen
class WeightOnlyActivation:
    """A W8A16 kernel leaves activations in high precision. It serves a weight-only config;
    a per-tensor or per-token-group one only as a degraded fallback, and only those of
    ``fallback`` when the kernel declares it (None: every one the table allows); a
    per-token one never (vLLM issue 61316)."""

    fallback: frozenset[GroupShape] | None = attrs.field(default=None, converter=_fallback_set)

    def check(self, caps: DeviceCaps | None, config: QuantConfig) -> Reason | None:
        grouping = config.activation_grouping
        service = _served(KernelKind.W8A16, grouping)
        if service is Service.EXACT:
            return None
        act = config.activation
        group = GroupShape.PER_TENSOR if act is None else act.scale.group
        if service is Service.FALLBACK and (self.fallback is None or group in self.fallback):
            return None
        shown = group.render()
        # A group as wide as the row is per-token under another name: say so.
        hidden = grouping is ActivationGrouping.PER_TOKEN and group != GroupShape.PER_TOKEN
        found = f"{shown} (per-token)" if hidden else shown
        return Reason(RejectCode.WEIGHT_ONLY_ACTIVATION, self._accepts(), found)

    def _accepts(self) -> str:
        if self.fallback is None:
            return "no activation quantization, or per-tensor or per-token-group (degraded)"
        if not self.fallback:
            return "no activation quantization"
        groups = ", ".join(sorted(group.render() for group in self.fallback))
        return f"no activation quantization, or {groups} (degraded)"

    def render(self) -> str:
        return "activation none" + self._accepts().removeprefix("no activation quantization")
