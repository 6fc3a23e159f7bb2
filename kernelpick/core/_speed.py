"""Speed as a fact a decision can warn with: how each kernel computes, and the warnings a
selection carries when what it runs is likely slower than the layer it replaces.

The laws:

1. A catalog row says how its kernel computes (``KernelSpec.compute``): ``NATIVE``, on the
   stored format in one kernel (the device's FP8 or int8 units, or a kernel decoding the
   weight in registers); ``DECODE``, the weight decoded to high precision by separate ops,
   then a high-precision GEMM; ``EMULATED``, a numerics reference or an op the framework
   emulates in software on this device.
2. A selection of an ``EMULATED`` kernel warns (``SpeedCode.EMULATED``).
3. A selection that passed over a kernel ahead of it in preference order whose only reasons
   are missing tools (a C++ toolchain, an optional library such as cupy), and which would
   have won with them (not a degraded kernel passed over for a non-degraded one), warns
   once per such kernel (``SpeedCode.MISSING_TOOL``), naming what is missing.
4. Warnings never change a decision, and nothing here is measured: the decision stays pure.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import attrs

from kernelpick.core._errors import InvalidValueError
from kernelpick.core._reasons import Reason, RejectCode

if TYPE_CHECKING:
    from kernelpick.core._decision import Verdict

__all__ = ["MISSING_TOOL_CODES", "Compute", "SpeedCode", "SpeedWarning", "speed_warnings"]


class Compute(enum.Enum):
    """How a kernel computes (law 1)."""

    NATIVE = "native"
    DECODE = "decode"
    EMULATED = "emulated"

    def __str__(self) -> str:
        return self.value

    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Compute.NATIVE: "computes on the stored format in one kernel",
    Compute.DECODE: "decodes the weight to high precision, then runs a high-precision GEMM",
    Compute.EMULATED: "an emulation (a numerics reference or a software path)",
}

# The reasons that say a tool is missing, not that the kernel cannot serve the layer: the
# C++ toolchain that builds the CPU kernels at first use, an optional library (cupy).
MISSING_TOOL_CODES = frozenset({RejectCode.TOOLCHAIN, RejectCode.LIBRARY_UNAVAILABLE})


class SpeedCode(enum.Enum):
    """Why a selection may be slower than the layer it replaces."""

    EMULATED = "emulated"
    MISSING_TOOL = "missing_tool"

    def __str__(self) -> str:
        return self.value


def _reasons(value: object) -> tuple[Reason, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(r, Reason) for r in value):
        raise InvalidValueError("speed warning reasons", value, "a tuple of kp.Reason")
    return tuple(value)


@attrs.frozen
class SpeedWarning:
    """One warning of a selection: its ``code``, the ``selected`` kernel and, for a missing
    tool, the ``passed_over`` kernel and the ``reasons`` it was turned down for (each a
    missing tool). Render it at the edge, as a reason is."""

    code: SpeedCode
    selected: str
    passed_over: str = ""
    reasons: tuple[Reason, ...] = attrs.field(default=(), converter=_reasons)

    def render(self) -> str:
        if self.code is SpeedCode.EMULATED:
            return (
                f"{self.selected} is {Compute.EMULATED.describe()}: expect it to run many "
                "times slower than the unquantized layer"
            )
        missing = "; ".join(reason.render() for reason in self.reasons)
        return (
            f"{self.passed_over}, ahead in preference order, was turned down only for a "
            f"missing tool ({missing}), so the slower {self.selected} runs: install it to "
            f"get {self.passed_over}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code.value,
            "selected": self.selected,
            "passed_over": self.passed_over or None,
            "reasons": [reason.to_dict() for reason in self.reasons],
            "message": self.render(),
        }


def speed_warnings(
    selected: str, compute: Compute, trace: tuple[Verdict, ...]
) -> tuple[SpeedWarning, ...]:
    """The warnings (laws 2 and 3) of selecting ``selected``, which computes as ``compute``,
    from ``trace``, the verdicts in preference order."""
    chosen = next(verdict for verdict in trace if verdict.kernel == selected)
    warnings = []
    for verdict in trace:
        if verdict is chosen:
            break
        codes = {reason.code for reason in verdict.reasons}
        # A degraded kernel is passed over for a non-degraded one whatever it needs.
        would_win = not verdict.degraded or chosen.degraded
        if would_win and codes and codes <= MISSING_TOOL_CODES:
            missing = tuple(verdict.reasons)
            warnings.append(SpeedWarning(SpeedCode.MISSING_TOOL, selected, verdict.kernel, missing))
    if compute is Compute.EMULATED:
        warnings.append(SpeedWarning(SpeedCode.EMULATED, selected))
    return tuple(warnings)
