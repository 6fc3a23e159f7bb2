"""Speed as a fact a decision can warn with: how each kernel computes, and the warnings a
selection carries when what it runs is likely slower than the layer it replaces.

The laws:

1. A catalog row says how its kernel computes (``KernelSpec.compute``): ``NATIVE``, on the
   stored format in one kernel (the device's FP8 or int8 units, or a kernel decoding the
   weight in registers); ``DECODE``, the weight decoded to high precision by separate ops,
   then a high-precision GEMM; ``EMULATED``, a slow path: a numerics reference, or a
   framework op that emulates the format in software or, measured, runs as slowly.
2. A selection of an ``EMULATED`` kernel warns (``SpeedCode.EMULATED``).
3. A selection that another kernel would win were every missing tool installed (the same
   decision made again with each missing-tool reason removed: a C++ toolchain, an optional
   library such as cupy) warns once (``SpeedCode.MISSING_TOOL``), naming that kernel and
   what it lacks: installing those gets it. Only that kernel: another also turned down for
   a tool would still lose to it.
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

__all__ = [
    "MISSING_TOOL_CODES",
    "Compute",
    "SpeedCode",
    "SpeedWarning",
    "speed_warnings",
    "with_tools",
]


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
    Compute.EMULATED: (
        "a slow path (a numerics reference, or a framework op that emulates the format in "
        "software or measured as slowly)"
    ),
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


def with_tools(trace: tuple[Verdict, ...]) -> tuple[Verdict, ...]:
    """``trace`` as it would read with every missing tool installed: each verdict without
    its missing-tool reasons (law 3 decides on it again)."""
    return tuple(
        attrs.evolve(v, reasons=tuple(r for r in v.reasons if r.code not in MISSING_TOOL_CODES))
        for v in trace
    )


def speed_warnings(
    selected: str, compute: Compute, winner_with_tools: Verdict | None
) -> tuple[SpeedWarning, ...]:
    """The warnings (laws 2 and 3) of selecting ``selected``, which computes as ``compute``;
    ``winner_with_tools`` is the kernel the same decision picks with every missing tool
    installed (None when it picks ``selected`` or nothing), as ``trace`` held it."""
    warnings = []
    if winner_with_tools is not None and winner_with_tools.kernel != selected:
        missing = tuple(r for r in winner_with_tools.reasons if r.code in MISSING_TOOL_CODES)
        warnings.append(
            SpeedWarning(SpeedCode.MISSING_TOOL, selected, winner_with_tools.kernel, missing)
        )
    if compute is Compute.EMULATED:
        warnings.append(SpeedWarning(SpeedCode.EMULATED, selected))
    return tuple(warnings)
