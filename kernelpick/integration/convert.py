"""``quantize_model``: convert every eligible ``nn.Linear`` of a model, atomically.

Atomic by checking first (design §5): selection for every layer, shapes, dtypes, NaN/Inf
and the device all run read-only before the first change, so a failure leaves the model as
it was. Then layers are quantized and swapped one at a time, each straight from its own
weight, so peak extra memory stays near one layer.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.core.device import DeviceCaps
from kernelpick.core.errors import InvalidValueError, KernelpickError
from kernelpick.core.policy import Policy
from kernelpick.core.schemes import Scheme
from kernelpick.integration.errors import ModelConversionError
from kernelpick.integration.method import Fp8OnlineLinearMethod, LayerState, check_finite
from kernelpick.integration.modules import Fp8Linear
from kernelpick.kernels.base import Kernel
from kernelpick.kernels.quantize import CHUNK_ROWS

__all__ = ["ConversionReport", "LayerReport", "quantize_model"]

Skip = Callable[[str, torch.nn.Module], bool]


@attrs.frozen
class LayerReport:
    """One converted layer: its name, shape ``(N, K)``, kernel, and whether it is degraded."""

    name: str
    shape: tuple[int, int]
    kernel: str
    degraded: bool


@attrs.frozen
class ConversionReport:
    """What ``quantize_model`` did. Byte counts cover the converted layers' weights."""

    scheme: str
    device: str
    layers: tuple[LayerReport, ...]
    skipped: tuple[str, ...]
    weight_bytes_before: int
    weight_bytes_after: int

    def render(self) -> str:
        """A table a person reads: one line per layer, then the totals."""
        width = max((len(layer.name) for layer in self.layers), default=4)
        lines = [f'quantization="{self.scheme}" on {self.device}: {len(self.layers)} layer(s)']
        for layer in self.layers:
            flag = "  DEGRADED" if layer.degraded else ""
            n, k = layer.shape
            lines.append(f"  {layer.name:<{width}}  {n}x{k}  {layer.kernel}{flag}")
        if self.skipped:
            lines.append(f"  skipped: {', '.join(self.skipped)}")
        before, after = self.weight_bytes_before, self.weight_bytes_after
        ratio = after / before if before else 1.0
        lines.append(
            f"  weights: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB ({ratio:.2f}x)"
        )
        return "\n".join(lines)


@attrs.frozen
class _Planned:
    names: tuple[str, ...]
    state: LayerState
    kernel: Kernel


def _linears(model: torch.nn.Module, skip: Skip | None) -> tuple[dict[int, list[str]], list[str]]:
    """Every path to each eligible linear (a module reachable twice is swapped everywhere),
    and the names ``skip`` excluded. Only exact ``nn.Linear``: subclasses such as
    MultiheadAttention's ``out_proj`` are read by their owners as linears."""
    paths: dict[int, list[str]] = {}
    skipped: list[str] = []
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module) is not torch.nn.Linear:
            continue
        if skip is not None and skip(name, module):
            skipped.append(name)
        else:
            paths.setdefault(id(module), []).append(name)
    return paths, skipped


def _plan(model: torch.nn.Module, method: Fp8OnlineLinearMethod, names: list[str]) -> _Planned:
    linear = model.get_submodule(names[0])
    assert isinstance(linear, torch.nn.Linear)
    config = method.config(
        linear.out_features, linear.in_features, linear.weight.dtype, bias=linear.bias is not None
    )
    state = LayerState(config, method.select(config, names[0]), names[0], (linear.out_features,))
    method.check_weight(state, linear.weight)
    if linear.bias is not None:
        check_finite(f"{names[0]}.bias", linear.bias.view(1, -1), method.chunk_rows)
    return _Planned(tuple(names), state, method.bind(state, linear.weight.device))


def _swap(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def quantize_model(
    model: torch.nn.Module,
    scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
    caps: DeviceCaps | None = None,
    policy: Policy | None = None,
    skip: Skip | None = None,
    *,
    chunk_rows: int = CHUNK_ROWS,
) -> ConversionReport:
    """Replace every ``nn.Linear`` of ``model`` (in place) with an ``Fp8Linear``.

    ``skip(name, module)`` keeps a layer as it is. ``caps`` defaults to a probe of the device
    the first layer lives on. Any layer that cannot be converted raises
    ``ModelConversionError`` naming every such layer, and the model is left untouched.
    """
    paths, skipped = _linears(model, skip)
    if any(name == "" for names in paths.values() for name in names):
        raise InvalidValueError(
            "model", type(model).__name__, "a module containing linears (the root is not replaced)"
        )
    if caps is None:
        from kernelpick import probe

        first = next(iter(paths.values()), None)
        caps = probe(model.get_submodule(first[0]).weight.device if first else None)
    method = Fp8OnlineLinearMethod(scheme, caps, policy, chunk_rows=chunk_rows)
    plans: list[_Planned] = []
    failures: list[tuple[str, KernelpickError]] = []
    for names in paths.values():
        try:
            plans.append(_plan(model, method, names))
        except KernelpickError as error:
            failures.append((names[0], error))
    if failures:
        raise ModelConversionError(failures)
    layers: list[LayerReport] = []
    before = after = 0
    while plans:  # popped, so each replaced nn.Linear is freed as soon as it is swapped out
        plan = plans.pop(0)
        linear = model.get_submodule(plan.names[0])
        assert isinstance(linear, torch.nn.Linear)
        quantized = Fp8Linear(linear.in_features, linear.out_features, method, linear.bias)
        method.install(quantized, plan.state, plan.kernel, linear.weight.detach())
        for name in plan.names:
            _swap(model, name, quantized)
        before += linear.weight.numel() * linear.weight.element_size()
        after += sum(
            p.numel() * p.element_size()
            for p in (quantized.get_parameter("weight"), quantized.get_parameter("weight_scale"))
        )
        decision = plan.state.decision
        layers.append(
            LayerReport(
                plan.names[0], plan.state.config.weight_shape, decision.kernel, decision.degraded
            )
        )
        del linear, quantized
    return ConversionReport(
        Scheme.parse(scheme).value, caps.name, tuple(layers), tuple(skipped), before, after
    )
