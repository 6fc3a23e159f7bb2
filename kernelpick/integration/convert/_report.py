"""What a model conversion did, for people and for programs."""

from __future__ import annotations

import attrs

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

    The byte counts are the model's parameters and buffers before and after, each storage
    counted once (tied weights are one tensor), so ``bytes_after / bytes_before`` is what
    the model's memory really became.
    """

    scheme: str
    device: str
    layers: tuple[LayerReport, ...]
    skipped: tuple[SkippedLayer, ...]
    bytes_before: int
    bytes_after: int

    def render(self) -> str:
        """A table a person reads: one line per layer, the skipped layers, then the totals."""
        width = max((len(layer.name) for layer in self.layers), default=4)
        lines = [f'quantization="{self.scheme}" on {self.device}: {len(self.layers)} layer(s)']
        for layer in self.layers:
            flag = "  DEGRADED" if layer.degraded else ""
            n, k = layer.shape
            lines.append(f"  {layer.name:<{width}}  {n}x{k}  {layer.kernel}{flag}")
        for skipped in self.skipped:
            lines.append(f"  skipped {skipped.name}: {skipped.reason}")
        before, after = self.bytes_before, self.bytes_after
        ratio = after / before if before else 1.0
        lines.append(
            f"  model parameters and buffers: {before / 2**20:.1f} MiB -> "
            f"{after / 2**20:.1f} MiB ({ratio:.2f}x)"
        )
        return "\n".join(lines)
