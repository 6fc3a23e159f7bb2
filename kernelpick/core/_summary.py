"""ModelSummary: what every linear layer of a model runs, or would run, on one device.

One value for both questions a deployer asks: before anything is downloaded (``kernelpick
plan`` decides for the shapes a model's config implies) and once a model is loaded (the
integration reads each layer's decision). Layers are grouped by their config and decision,
so a model of 224 layers reads as its handful of shapes. Pure: decisions, configs and
names in; counts, bytes, ``render()`` and ``to_dict()`` out.

Bytes are the checkpoint's: a quantized layer's weight and its scales (and zero points,
``g_idx``, a static input scale), against the same weight as the high-precision checkpoint
stores it (``weight_itemsize`` bytes a weight: the dtype the weights are stored in, which
may differ from the activations' ``input_dtype``; the ``input_dtype``'s when not given); a
layer kept in high precision counts the same on both sides. Weights no kernel is chosen
for (MoE experts, which vLLM runs in FusedMoE: ``UncoveredWeights``) are listed apart,
whole-model figures with their dtype and bytes where a checkpoint's dtype says them, and
counted in neither total: the totals are what the decisions cover.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kernelpick.core._decision import SCHEMA_VERSION, Decision, Rejected, Selected, reason_lines
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import positive_int
from kernelpick.core._quant import QuantConfig
from kernelpick.core._summary_parts import KeptLayer, UncoveredWeights, layer_names
from kernelpick.core._summary_text import collapse_names, columns, size
from kernelpick.core._typing import assert_never

__all__ = ["KeptLayer", "LayerGroup", "ModelSummary", "UncoveredWeights", "stored_bytes"]

_WORD = 4  # bytes of the int32 words integer weights and zero points are packed in


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def stored_bytes(config: QuantConfig) -> int:
    """The bytes ``config``'s layer holds in a checkpoint: its quantized weight (integer
    weight-only ones packed into int32 words along K), weight scales, zero points (packed
    along N), ``g_idx`` and static input scale."""
    n, k = config.weight_shape
    weight = config.weight
    scales = 1
    for extent in config.weight_scale_shape:
        scales *= extent
    total = scales * weight.scale.dtype.bits // 8
    if config.activation is None and weight.dtype.is_integer:  # pack-quantized
        total += n * _ceil(k * weight.dtype.bits, 32) * _WORD
        if weight.zero_point is not None:
            total += _ceil(n * weight.dtype.bits, 32) * _WORD * config.weight_scale_shape[-1]
        if config.act_order:
            total += k * _WORD
    else:
        total += n * k * weight.dtype.bits // 8
    if config.activation is not None and config.activation.scale.static:
        total += 4  # one fp32 input scale
    return total


def _itemsize(value: object) -> int | None:
    if value is None:
        return None
    return positive_int("weight_itemsize", value, "None or a positive int (bytes a weight)")


@attrs.frozen
class LayerGroup:
    """The layers (``names``, in model order) that share one ``config`` and ``decision``;
    ``weight_itemsize``: bytes a weight in the high-precision checkpoint (None: the
    ``input_dtype``'s)."""

    config: QuantConfig
    decision: Decision
    names: tuple[str, ...] = attrs.field(converter=layer_names)
    weight_itemsize: int | None = attrs.field(default=None, converter=_itemsize)

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def bytes_before(self) -> int:
        n, k = self.config.weight_shape
        itemsize = self.weight_itemsize or self.config.input_dtype.itemsize
        return self.count * n * k * itemsize

    @property
    def bytes_after(self) -> int:
        return self.count * stored_bytes(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "names": list(self.names),
            "weight_shape": list(self.config.weight_shape),
            "config": self.config.render(),
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "decision": self.decision.to_dict(),
        }


@attrs.frozen
class ModelSummary:
    """Every linear layer of a model on one device (``caps``) under one ``scheme``: the
    quantized layers grouped by decision, the ``kept`` ones with their reasons, the
    ``tensor_parallel`` size whose per-rank shapes these are, and the weights no decision
    covers (``uncovered``). Build it with ``of``."""

    scheme: str
    caps: DeviceCaps
    groups: tuple[LayerGroup, ...]
    kept: tuple[KeptLayer, ...] = ()
    tensor_parallel: int = 1
    uncovered: tuple[UncoveredWeights, ...] = ()

    @classmethod
    def of(
        cls,
        scheme: str,
        caps: DeviceCaps,
        layers: Iterable[tuple[str, QuantConfig, Decision]],
        kept: Iterable[KeptLayer] = (),
        *,
        tensor_parallel: int = 1,
        uncovered: Iterable[UncoveredWeights] = (),
        weight_itemsize: int | None = None,
    ) -> ModelSummary:
        """Group ``layers`` (name, config, decision), in the order each group first appears;
        ``weight_itemsize``: bytes a weight in the high-precision checkpoint, the same for
        every layer (None: each config's ``input_dtype``'s)."""
        grouped: dict[tuple[QuantConfig, Decision], list[str]] = {}
        for name, config, decision in layers:
            grouped.setdefault((config, decision), []).append(name)
        groups = tuple(LayerGroup(c, d, tuple(names), weight_itemsize)
                       for (c, d), names in grouped.items())  # fmt: skip
        return cls(scheme, caps, groups, tuple(kept), tensor_parallel, tuple(uncovered))

    @property
    def layers(self) -> int:
        return sum(group.count for group in self.groups)

    def _count(self, test: Callable[[Decision], bool]) -> int:
        return sum(group.count for group in self.groups if test(group.decision))

    @property
    def rejected(self) -> int:
        """Layers no kernel can run: a model with any cannot be loaded this way."""
        return self._count(lambda d: isinstance(d, Rejected))

    @property
    def degraded(self) -> int:
        return self._count(lambda d: isinstance(d, Selected) and d.degraded)

    @property
    def warned(self) -> int:
        """Layers whose kernel carries a speed warning."""
        return self._count(lambda d: isinstance(d, Selected) and bool(d.warnings))

    def kept_groups(self) -> list[tuple[tuple[str, ...], tuple[int, int], str]]:
        """The kept layers as (names, shape, reason), one per shape and reason, in order."""
        kept: dict[tuple[tuple[int, int], str], list[str]] = {}
        for layer in self.kept:
            kept.setdefault((layer.weight_shape, layer.reason), []).append(layer.name)
        return [(tuple(names), shape, reason) for (shape, reason), names in kept.items()]

    @property
    def bytes_before(self) -> int:
        return sum(g.bytes_before for g in self.groups) + sum(k.weight_bytes for k in self.kept)

    @property
    def bytes_after(self) -> int:
        return sum(g.bytes_after for g in self.groups) + sum(k.weight_bytes for k in self.kept)

    def render(self) -> str:
        """One screen: the device, a line per group, the kept layers, the totals, the
        weights not covered, then every rejection with its reasons and hints and every
        speed warning."""
        where = f", tensor parallel {self.tensor_parallel} (shapes per rank)"
        lines = [f'quantization="{self.scheme}" on {self.caps.render()}'
                 f"{where if self.tensor_parallel > 1 else ''}"]  # fmt: skip
        rows = [["layers", "N x K", "kernel", "layer names"]]
        for group in self.groups:
            n, k = group.config.weight_shape
            rows.append([str(group.count), f"{n} x {k}", _verdict(group.decision),
                         collapse_names(group.names)])  # fmt: skip
        lines += columns(rows)
        for names, (n, k), reason in self.kept_groups():
            times = f"{len(names)} x " if len(names) > 1 else ""
            lines.append(f"  kept in high precision: {collapse_names(names)} ({times}{n} x {k}): "
                         f"{reason}")  # fmt: skip
        before, after = self.bytes_before, self.bytes_after
        ratio = f" ({after / before:.2f}x)" if before else ""
        lines.append(
            f"weights: {size(before)} -> {size(after)}{ratio}; {self.layers} quantized "
            f"layer(s): {self.degraded} degraded, {self.rejected} rejected, {self.warned} with "
            "speed warnings"
        )
        lines += [uncovered.render() for uncovered in self.uncovered]
        for group in self.groups:
            decision = group.decision
            if isinstance(decision, Rejected) or decision.warnings or decision.degraded:
                n, k = group.config.weight_shape
                lines.append("")
                lines.append(f"{collapse_names(group.names)} ({n} x {k}, "
                             f"{group.config.render()}):")  # fmt: skip
                lines += [f"  {line}" for line in _details(decision)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record, stable under ``schema_version`` (the decisions' own)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "scheme": self.scheme,
            "device": {"name": self.caps.name, "description": self.caps.render()},
            "tensor_parallel": self.tensor_parallel,
            "layers": self.layers,
            "degraded": self.degraded,
            "rejected": self.rejected,
            "warned": self.warned,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "groups": [group.to_dict() for group in self.groups],
            "kept": [layer.to_dict() for layer in self.kept],
            "uncovered": [weights.to_dict() for weights in self.uncovered],
        }


def _verdict(decision: Decision) -> str:
    match decision:
        case Selected(kernel=kernel, degraded=degraded, warnings=warnings):
            notes = (["degraded"] if degraded else []) + (["slow: see below"] if warnings else [])
            return kernel + (f" ({', '.join(notes)})" if notes else "")
        case Rejected():
            return "REJECTED: see below"
        case _:
            assert_never(decision)


def _details(decision: Decision) -> list[str]:
    match decision:
        case Selected(kernel=kernel, trace=trace, warnings=warnings):
            # The selection, its warnings and why each kernel ahead of it was turned down
            # (a fallback's reason); the kernels after it are explain's to show.
            head = decision.render().splitlines()[0]
            ahead = [v for v in trace[: [v.kernel for v in trace].index(kernel)] if v.reasons]
            lines = [head, *(f"Warning: {warning.render()}" for warning in warnings)]
            if ahead:
                lines.append("Turned down ahead of it:")
                lines += reason_lines([r for verdict in ahead for r in verdict.reasons])
            return lines
        case Rejected():
            return decision.render().splitlines()
        case _:
            assert_never(decision)
