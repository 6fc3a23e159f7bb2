"""What a model conversion did, for people and for programs."""

from __future__ import annotations

from typing import Any

import attrs

from kernelpick.core import ModelSummary
from kernelpick.integration.layer import LayerState

__all__ = ["ConversionReport", "LayerReport", "SkippedLayer"]


@attrs.frozen
class LayerReport:
    """One converted layer: its name, shape ``(N, K)``, kernel, and whether it is degraded."""

    name: str
    shape: tuple[int, int]
    kernel: str
    degraded: bool

    @classmethod
    def of(cls, name: str, state: LayerState) -> LayerReport:
        """The report of a converted layer, from the method's state on it."""
        decision = state.decision
        return cls(name, state.config.weight_shape, decision.kernel, decision.degraded)


@attrs.frozen
class SkippedLayer:
    """A linear left in high precision, and why."""

    name: str
    reason: str


@attrs.frozen
class ConversionReport:
    """What ``quantize_model`` or ``load_quantized`` did.

    ``summary`` is what every layer runs (``kernelpick.core.ModelSummary``: grouped
    decisions, the layers kept in high precision and their checkpoint bytes). The byte
    counts here are measured: the model's parameters and buffers before and after, each
    storage counted once (tied weights are one tensor) and a tensor on the meta device at
    the size it would take, so ``bytes_after / bytes_before`` is what the model's memory
    really became, prepared copies of the weights included.
    """

    scheme: str
    device: str
    layers: tuple[LayerReport, ...]
    skipped: tuple[SkippedLayer, ...]
    bytes_before: int
    bytes_after: int
    summary: ModelSummary = attrs.field(kw_only=True)

    def render(self) -> str:
        """The summary, then the measured memory."""
        before, after = self.bytes_before, self.bytes_after
        ratio = f" ({after / before:.2f}x)" if before else ""
        return (
            f"{self.summary.render()}\nmodel parameters and buffers, measured: "
            f"{before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB{ratio}"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record: the summary's, with the measured bytes beside it."""
        return {**self.summary.to_dict(), "measured_bytes_before": self.bytes_before,
                "measured_bytes_after": self.bytes_after}  # fmt: skip
