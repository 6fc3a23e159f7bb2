"""evaluate and choose: the pure decision, and its bounded cache.

The laws of a decision (docs/design.md#selection-rules tells them at length):

1. The candidates are the device platform's kernels in catalog order; a forced kernel of
   another platform is appended, its ``WRONG_PLATFORM`` reason first (``evaluate``).
2. Every rule of every candidate is checked and every failing reason kept, also for the
   kernels after the one chosen; a rule answers a ``Reason`` or None (``rule_reasons``).
3. The kind rule comes from the declared kind, never from the spec's rules:
   ``KernelSpec.rules`` puts it (``KIND_RULES``, read from the kind table; a W8A16 spec's
   ``fallback`` may only narrow it) before the spec's own.
4. A verdict is degraded exactly when a W8A16 kernel meets a config with an activation
   quantization (``_verdict``).
5. Policy only adds reasons to the same verdicts: ``DISABLED``, ``NOT_FORCED`` for every
   kernel but a forced one, ``STRICT_DEGRADED`` under strict (``_verdict``); so a forced
   kernel that fails its rules is a rejection, never a fall-through.
6. The first kernel without reasons that is not degraded wins; else the first degraded one
   without reasons, as ``degraded=True``; else ``Rejected`` with the whole trace
   (``_decide``). A selection carries the speed warnings its trace and the chosen row's
   ``compute`` imply (``kernelpick.core._speed``), which never change it.
7. The same question gets the same answer: ``choose`` is pure and cached, and hints, asked
   only for a rejection, never change it (``_choose``).
"""

from __future__ import annotations

import functools

import attrs

from kernelpick.core._builtin_catalog import DEFAULT_CATALOG
from kernelpick.core._decision import Decision, Rejected, Selected, Verdict
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._hints import hints
from kernelpick.core._policy import Policy
from kernelpick.core._quant import QuantConfig
from kernelpick.core._reasons import Reason, RejectCode
from kernelpick.core._specs import Catalog, KernelKind, KernelSpec
from kernelpick.core._speed import speed_warnings, with_tools

__all__ = ["CACHE_SIZE", "cache_info", "choose", "clear_cache", "evaluate", "rule_reasons"]

# Distinct (device, config, policy, catalog) questions kept. A model has a few dozen
# distinct layer shapes, so this holds many models' worth; least recently used goes first.
CACHE_SIZE = 4096

_DEFAULT_POLICY = Policy()


def rule_reasons(spec: KernelSpec, caps: DeviceCaps, config: QuantConfig) -> list[Reason]:
    """Why ``spec``'s rules (its kind's and its own) turn down ``config`` on ``caps``, each
    reason naming the kernel; empty when they all hold. Policy is not applied."""
    reasons = []
    for rule in spec.rules:
        failed = rule.check(caps, config)
        if failed is not None:
            if not isinstance(failed, Reason):
                # A rule of one's own returning False or a string would otherwise fail far
                # from here, or be read as a pass.
                raise InvalidValueError(
                    f"result of {spec.id}'s rule {rule!r}", failed, "a kp.Reason or None"
                )
            reasons.append(Reason(failed.code, failed.needed, failed.found, spec.id))
    return reasons


def _verdict(spec: KernelSpec, caps: DeviceCaps, config: QuantConfig, policy: Policy) -> Verdict:
    reasons = rule_reasons(spec, caps, config)
    # A weight-only kernel serving an activation-quantized config skips that quantization.
    degraded = spec.kind is KernelKind.W8A16 and config.activation is not None
    if spec.id in policy.disabled:
        reasons.append(Reason(RejectCode.DISABLED, "enabled", "disabled", spec.id))
    if policy.force is not None and spec.id != policy.force:
        reasons.append(Reason(RejectCode.NOT_FORCED, policy.force, spec.id, spec.id))
    if policy.strict and degraded:
        found = "weight-only (W8A16) kernel"
        reasons.append(Reason(RejectCode.STRICT_DEGRADED, "a W8A8 kernel", found, spec.id))
    return Verdict(spec.id, spec.kind, tuple(reasons), degraded)


def evaluate(
    caps: DeviceCaps,
    config: QuantConfig,
    policy: Policy | None = None,
    catalog: Catalog | None = None,
) -> tuple[Verdict, ...]:
    """The verdict of every kernel of the device's platform, in catalog order.

    Every rule of every kernel is evaluated, so each verdict lists all its failing reasons.
    A forced kernel of another platform is appended, its wrong-platform reason first.
    """
    policy = _DEFAULT_POLICY if policy is None else policy
    catalog = DEFAULT_CATALOG if catalog is None else catalog
    _check_types(caps, config, policy, catalog)
    if policy.disabled or policy.force is not None:
        catalog.check_ids(sorted(policy.kernel_ids))
    specs = catalog.for_platform(caps.platform)
    trace = [_verdict(spec, caps, config, policy) for spec in specs]
    if policy.force is not None and all(spec.id != policy.force for spec in specs):
        forced = catalog.kernel(policy.force)
        needed, found = str(forced.platform), str(caps.platform)
        wrong = Reason(RejectCode.WRONG_PLATFORM, needed, found, forced.id)
        # Its own rules still run: the kind rule and policy hold for every kernel.
        own = _verdict(forced, caps, config, policy)
        trace.append(attrs.evolve(own, reasons=(wrong, *own.reasons)))
    return tuple(trace)


def _decide(trace: tuple[Verdict, ...]) -> Decision:
    # Preference order, except that a degraded kernel is only a fallback.
    fallback = None
    for verdict in trace:
        if not verdict.reasons:
            if not verdict.degraded:
                return Selected(verdict.kernel, trace, False)
            fallback = fallback or verdict
    return Rejected(trace) if fallback is None else Selected(fallback.kernel, trace, True)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _choose(caps: DeviceCaps, config: QuantConfig, policy: Policy, catalog: Catalog) -> Decision:
    decision = _decide(evaluate(caps, config, policy, catalog))
    if isinstance(decision, Rejected):

        def decide(other: QuantConfig) -> Decision | None:
            # A hint asks about configs nobody asked about, so a rule of one's own written
            # for the asked kind of config (say, one that reads config.activation) may raise
            # on them. That costs the hint, not the decision: evaluate answered without it.
            try:
                return _decide(evaluate(caps, other, policy, catalog))
            except Exception:
                return None

        return Rejected(decision.trace, hints(caps, config, decision.trace, decide))
    compute = catalog.kernel(decision.kernel).compute
    better = _decide(with_tools(decision.trace))
    winner = None
    if isinstance(better, Selected) and better.kernel != decision.kernel:
        winner = next(v for v in decision.trace if v.kernel == better.kernel)
    warnings = speed_warnings(decision.kernel, compute, winner)
    return attrs.evolve(decision, warnings=warnings) if warnings else decision


def choose(
    caps: DeviceCaps,
    config: QuantConfig,
    policy: Policy | None = None,
    catalog: Catalog | None = None,
) -> Decision:
    """Select the kernel for ``config`` on ``caps``: ``Selected`` or ``Rejected``.

    Pure and cached: the same question twice is a lookup. It does not raise for valid
    values; a policy naming an id the catalog lacks raises ``UnknownNameError``, and an
    argument of the wrong type ``InvalidValueError``.
    """
    policy = _DEFAULT_POLICY if policy is None else policy
    catalog = DEFAULT_CATALOG if catalog is None else catalog
    _check_types(caps, config, policy, catalog)
    return _choose(caps, config, policy, catalog)


def clear_cache() -> None:
    """Forget every cached decision."""
    _choose.cache_clear()


def cache_info() -> functools._CacheInfo:
    """Hits, misses, current size and the bound (``CACHE_SIZE``) of the decision cache."""
    return _choose.cache_info()


def _check_types(caps: object, config: object, policy: object, catalog: object) -> None:
    if not isinstance(caps, DeviceCaps):
        raise InvalidValueError("caps", caps, "a kp.DeviceCaps")
    if not isinstance(config, QuantConfig):
        raise InvalidValueError("config", config, "a kp.QuantConfig")
    if not isinstance(policy, Policy):
        raise InvalidValueError("policy", policy, "a kp.Policy")
    if not isinstance(catalog, Catalog):
        raise InvalidValueError("catalog", catalog, "a kp.Catalog")
