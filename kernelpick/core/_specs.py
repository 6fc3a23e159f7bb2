"""KernelSpec and Catalog: what each kernel needs, declared as data, and the
``Requirement`` protocol every rule of a spec follows. The rules that read the device are
in ``_device_rules``, those that read the config in ``_config_rules``, the kind rules the
core adds in ``_kinds``."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import attrs

from kernelpick.core._arch import Platform, as_platform
from kernelpick.core._config_rules import Alignment
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError, UnknownNameError
from kernelpick.core._kinds import (
    ActivationQuantized,
    KernelKind,
    WeightOnlyActivation,
    as_kind,
    fallback_groups,
)
from kernelpick.core._quant import GroupShape, QuantConfig
from kernelpick.core._reasons import Reason
from kernelpick.core._speed import Compute
from kernelpick.core._weight_rules import LAWS, OPT_IN_DEFAULTS

__all__ = ["KIND_RULES", "Catalog", "KernelKind", "KernelSpec", "Requirement", "as_kind"]


@runtime_checkable
class Requirement(Protocol):
    """A rule a kernel needs to hold. Pure: it reads its arguments and nothing else.

    ``check`` returns None when the rule holds, else a ``kp.Reason(code, needed, found)``
    (anything else is refused when the rule is evaluated). Hints evaluate every rule on
    every named scheme's config too, not only on configs of the kind the kernel serves.
    Kernel authors list rules on a ``KernelSpec``; an engine can write its own class with
    the same two methods.
    """

    def check(self, caps: DeviceCaps, config: QuantConfig) -> Reason | None: ...

    def render(self) -> str: ...


# Rules every kernel of a kind obeys, whatever its spec declares; both read the kind table
# (core._kinds.KIND_TABLE). Keyed on the declared kind, so a new weight-only kernel cannot
# forget the per-token check that vLLM issue 61316's Marlin and Humming lacked
# (docs/design.md#the-problem). Read-only: decisions are cached, so a change here would
# leave cached and fresh answers disagreeing.
KIND_RULES: Mapping[KernelKind, tuple[Requirement, ...]] = MappingProxyType(
    {
        KernelKind.W8A8: (ActivationQuantized(),),
        KernelKind.W8A16: (WeightOnlyActivation(),),
    }
)

_KERNEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def _kernel_id(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _KERNEL_ID.match(value):
        raise InvalidValueError(
            "kernel id", value, "letters, digits, '_', '.' or '-', starting with a letter or digit"
        )


def _requirements(value: Iterable[Requirement]) -> tuple[Requirement, ...]:
    # One rule on its own (or a string, iterable by character) is a likely slip for a tuple.
    if isinstance(value, (str, bytes, Requirement)) or not isinstance(value, Iterable):
        raise InvalidValueError("requires", value, "a tuple of requirements, e.g. (rule,)")
    items = tuple(value)
    for item in items:
        if not isinstance(item, Requirement):
            raise InvalidValueError("requirement", item, "an object with check() and render()")
        # A spec is part of the key choose() caches decisions under.
        try:
            hash(item)
        except TypeError:
            raise InvalidValueError(
                "requirement", item, "a hashable value (a frozen attrs class or dataclass)"
            ) from None
    return items


def _summary(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise InvalidValueError("kernel summary", value, "a string")


def _compute(value: object) -> Compute:
    if isinstance(value, Compute):
        return value
    try:
        return Compute(value)
    except ValueError:
        expected = ", ".join(repr(member.value) for member in Compute)
        raise InvalidValueError("compute", value, f"a kp.Compute: {expected}") from None


def _fallback(value: Iterable[GroupShape] | None) -> frozenset[GroupShape] | None:
    # A converter does not see the kind: post-init checks each shape against the table.
    if value is None:
        return None
    if isinstance(value, (str, bytes, GroupShape)) or not isinstance(value, Iterable):
        raise InvalidValueError("fallback", value, "None or a set of GroupShape values")
    return frozenset(value)


@attrs.frozen
class KernelSpec:
    """One kernel: its id, platform, kind and the requirements it declares.

    The kind's own rule (W8A16 kernels cannot honour per-token activations, W8A8 kernels
    need an activation quantization) is added by the core and must not be listed here.
    So are the weight-layout laws (``kernelpick.core._weight_rules``): a spec that lists
    no ``ZeroPoints`` or ``ActOrder`` rule reads symmetric weights in group order only,
    and no spec serves a group that tensor parallelism cuts in two.
    ``fallback`` narrows which activation groupings a W8A16 kernel serves as a degraded
    stand-in: None takes every one the kind table allows (per-tensor and per-token groups
    such as block FP8's 1x128), a set of ``GroupShape`` only those, ``frozenset()`` none.
    Per-token is never one, and a W8A8 kernel has none: both are refused here.
    ``compute`` says how the kernel computes (``kp.Compute``: native, a decode then a
    high-precision GEMM, or an emulation); a selection of an emulation carries a speed
    warning (``kernelpick.core._speed``).
    """

    id: str = attrs.field(validator=_kernel_id)
    platform: Platform = attrs.field(converter=as_platform)
    kind: KernelKind = attrs.field(converter=as_kind)
    requires: tuple[Requirement, ...] = attrs.field(default=(), converter=_requirements)
    summary: str = attrs.field(default="", validator=_summary)
    fallback: frozenset[GroupShape] | None = attrs.field(
        default=None, converter=_fallback, kw_only=True
    )
    compute: Compute = attrs.field(default=Compute.NATIVE, converter=_compute, kw_only=True)
    # Derived once: every uncached decision reads it for every kernel of the platform.
    _rules: tuple[Requirement, ...] = attrs.field(init=False, eq=False, hash=False, repr=False)

    def __attrs_post_init__(self) -> None:
        fallback = fallback_groups(self.kind, self.fallback)
        own = KIND_RULES[self.kind] if fallback is None else (WeightOnlyActivation(fallback),)
        declared = {type(rule) for rule in self.requires}
        defaults = tuple(rule for rule in OPT_IN_DEFAULTS if type(rule) not in declared)
        object.__setattr__(self, "_rules", own + self.requires + defaults + LAWS)

    @property
    def alignment(self) -> int | None:
        """The multiple K and N must be, as the spec's ``Alignment`` rules state (None: any).
        Every rule must hold, so with several it is their least common multiple."""
        multiples = [rule.multiple for rule in self.requires if isinstance(rule, Alignment)]
        return math.lcm(*multiples) if multiples else None

    @property
    def rules(self) -> tuple[Requirement, ...]:
        """Everything the kernel is checked against: its kind's rules, its own, then the
        refusing defaults of the opt-in rules it omits, and the laws."""
        return self._rules


def _specs(value: Iterable[KernelSpec]) -> tuple[KernelSpec, ...]:
    items = tuple(value)
    seen: set[str] = set()
    for spec in items:
        if not isinstance(spec, KernelSpec):
            raise InvalidValueError("catalog entry", spec, "a KernelSpec")
        if spec.id in seen:
            raise InvalidValueError("catalog", spec.id, "each kernel id to appear once")
        seen.add(spec.id)
    return items


@attrs.frozen(cache_hash=True)
class Catalog:
    """An ordered set of kernels, fastest first within each platform.

    ``kp.default_catalog()`` is kernelpick's own. An engine builds its own from specs, or
    extends the default: ``kp.Catalog(kp.default_catalog().kernels + (my_spec,))``.
    """

    kernels: tuple[KernelSpec, ...] = attrs.field(converter=_specs)
    # Derived once: evaluate() reads these for every uncached decision.
    _by_platform: dict[Platform, tuple[KernelSpec, ...]] = attrs.field(
        init=False, eq=False, hash=False, repr=False
    )
    _known: frozenset[str] = attrs.field(init=False, eq=False, hash=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_platform = {p: tuple(s for s in self.kernels if s.platform is p) for p in Platform}
        object.__setattr__(self, "_by_platform", by_platform)
        object.__setattr__(self, "_known", frozenset(spec.id for spec in self.kernels))

    def __iter__(self) -> Iterator[KernelSpec]:
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self._known

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(spec.id for spec in self.kernels)

    def for_platform(self, platform: Platform | str) -> tuple[KernelSpec, ...]:
        """The platform's kernels in preference order."""
        return self._by_platform[Platform.parse(platform)]

    def ids_for(self, platform: Platform | str) -> tuple[str, ...]:
        """The platform's kernel ids in preference order."""
        return tuple(spec.id for spec in self.for_platform(platform))

    def kernel(self, kernel_id: str) -> KernelSpec:
        """The spec with this id; ``UnknownNameError`` names the closest id otherwise."""
        for spec in self.kernels:
            if spec.id == kernel_id:
                return spec
        raise UnknownNameError("kernel id", kernel_id, self.ids)

    def check_ids(self, kernel_ids: Iterable[str]) -> None:
        """Raise ``UnknownNameError`` for the first id that is not in this catalog."""
        for kernel_id in kernel_ids:
            if kernel_id not in self._known:
                raise UnknownNameError("kernel id", kernel_id, self.ids)
