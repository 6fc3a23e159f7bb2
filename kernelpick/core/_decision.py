"""The outcome of a choice: Selected or Rejected, each with the verdict of every kernel."""

from __future__ import annotations

from typing import Any, final

import attrs

from kernelpick.core._errors import InvalidValueError
from kernelpick.core._reasons import Reason
from kernelpick.core._specs import KernelKind
from kernelpick.core._speed import SpeedWarning

__all__ = ["SCHEMA_VERSION", "Decision", "Rejected", "Selected", "Verdict", "reason_lines"]

# Bumped whenever a key of to_dict() changes meaning or disappears.
SCHEMA_VERSION = 1

HEADER = "Failed to find a kernel that can implement the ScaledMM linear layer. Reasons:"
DEGRADED_NOTE = (
    "degraded: weight-only (W8A16) kernel; activations are not quantized, "
    "so numerics differ from the requested W8A8 config"
)


@attrs.frozen
class Verdict:
    """What one kernel answered: no reasons means it could implement the config."""

    kernel: str
    kind: KernelKind
    reasons: tuple[Reason, ...]
    degraded: bool

    def __attrs_post_init__(self) -> None:
        # One check for all four fields, with exact type tests: a verdict is built for every
        # kernel of every uncached decision, whose budget is 3000 dict lookups.
        ok = (
            type(self.kernel) is str
            and type(self.kind) is KernelKind
            and type(self.reasons) is tuple
            and type(self.degraded) is bool
        )
        if ok:
            for reason in self.reasons:
                if not isinstance(reason, Reason):
                    ok = False
        if not ok:
            raise InvalidValueError(
                "verdict",
                self,
                "Verdict(kernel: str, kind: KernelKind, reasons: tuple of kp.Reason, "
                "degraded: bool)",
            )

    @property
    def ok(self) -> bool:
        return not self.reasons

    def status(self, chosen: str | None) -> str:
        """The label of this verdict when ``chosen`` was selected (None: nothing was):
        ``selected``, ``viable`` or ``rejected``; ``to_dict`` and the CLI both print it."""
        if self.kernel == chosen:
            return "selected"
        return "viable" if self.ok else "rejected"

    def to_dict(self, status: str) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "kind": self.kind.value,
            "status": status,
            "degraded": self.degraded,
            "reasons": [reason.to_dict() for reason in self.reasons],
        }


def _hints(value: object) -> tuple[str, ...]:
    # A bare string is refused: iterated, it would become one hint per character.
    if not isinstance(value, (tuple, list)) or not all(isinstance(item, str) for item in value):
        raise InvalidValueError("hints", value, "a tuple of sentences (strings)")
    return tuple(value)


def _warnings(value: object) -> tuple[SpeedWarning, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(w, SpeedWarning) for w in value):
        raise InvalidValueError("warnings", value, "a tuple of kp.SpeedWarning")
    return tuple(value)


def _viable(verdict: Verdict, before_chosen: bool, chosen_degraded: bool) -> str:
    # The chosen kernel is the first viable one that is not degraded, or else the first
    # degraded one: a viable kernel ahead of it was passed over for being degraded.
    if before_chosen and verdict.degraded and not chosen_degraded:
        return "also viable, but degraded: a non-degraded kernel is preferred"
    place = "earlier" if before_chosen else "later"
    return f"also viable ({place} in preference order{'; degraded' if verdict.degraded else ''})"


def reason_lines(reasons: tuple[Reason, ...] | list[Reason]) -> list[str]:
    """One ``  - <kernel>: <sentence>`` line a reason, as every rendering lists them."""
    return [f"  - {reason.kernel}: {reason.render()}" for reason in reasons]


def _trace_dict(trace: tuple[Verdict, ...], chosen: str | None) -> list[dict[str, Any]]:
    return [v.to_dict(v.status(chosen)) for v in trace]


@final
@attrs.frozen
class Selected:
    """A kernel was chosen. ``trace`` holds every kernel's verdict, in catalog order, including
    those after the chosen one; ``degraded`` marks a choice that changes numerics;
    ``warnings`` say why what runs may be slower than the layer it replaces (an emulation,
    or a faster kernel turned down for a missing tool), and never change the choice."""

    kernel: str
    trace: tuple[Verdict, ...]
    degraded: bool
    warnings: tuple[SpeedWarning, ...] = attrs.field(default=(), converter=_warnings)

    @property
    def alternatives(self) -> tuple[str, ...]:
        """The other kernels that could also have implemented the config."""
        return tuple(v.kernel for v in self.trace if v.ok and v.kernel != self.kernel)

    def render(self) -> str:
        """The choice and, for every other kernel, why it was not chosen."""
        head = f"Selected {self.kernel}"
        lines = [f"{head} ({DEGRADED_NOTE})." if self.degraded else f"{head}."]
        lines += [f"Warning: {warning.render()}" for warning in self.warnings]
        others = [v for v in self.trace if v.kernel != self.kernel]
        if others:
            lines.append("Other kernels:")
        before = True  # still ahead of the chosen kernel in the trace
        for verdict in self.trace:
            if verdict.kernel == self.kernel:
                before = False
                continue
            if verdict.ok:
                text = _viable(verdict, before, self.degraded)
                lines.append(f"  - {verdict.kernel}: {text}")
            lines.extend(reason_lines(verdict.reasons))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the decision, stable under ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "outcome": "selected",
            "kernel": self.kernel,
            "degraded": self.degraded,
            "warnings": [warning.to_dict() for warning in self.warnings],
            "trace": _trace_dict(self.trace, self.kernel),
        }


@final
@attrs.frozen
class Rejected:
    """No kernel could implement the config; ``trace`` holds every kernel's reasons.

    ``hints`` says what would work instead, computed from the catalog: another scheme that
    selects a kernel on this device, or the device a kernel would need.
    """

    trace: tuple[Verdict, ...]
    hints: tuple[str, ...] = attrs.field(default=(), converter=_hints)

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """Every reason of every kernel, in catalog order."""
        return tuple(reason for verdict in self.trace for reason in verdict.reasons)

    def render(self) -> str:
        """The layout engines already print (vLLM's kernel chooser): a header, one line a reason."""
        lines = [HEADER, *reason_lines(self.reasons)]
        if not self.trace:
            lines.append("  - (the catalog has no kernel for this device's platform)")
        lines.extend(f"Hint: {hint}" for hint in self.hints)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the decision, stable under ``schema_version``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "outcome": "rejected",
            "kernel": None,
            "degraded": False,
            "warnings": [],
            "trace": _trace_dict(self.trace, None),
            "hints": list(self.hints),
        }


Decision = Selected | Rejected
