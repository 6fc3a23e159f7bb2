"""``quantize_model``: convert every eligible ``nn.Linear`` of a model to a quantized layer
(FP8, MXFP8 or int8), in place.

Every check runs read-only before the first change: selection for every layer, shapes,
dtypes, NaN/Inf and the device. A failure there raises ``ModelConversionError`` and the
model is as it was. Then layers are quantized and swapped one at a time, each straight
from its own weight, so peak extra memory stays near one layer. Layers that share a weight
(tied) are quantized once and swapped together. If anything stops the swap phase
(``KeyboardInterrupt``, out of memory), the layer being swapped is put back, every layer is
either as it was or fully converted, and calling ``quantize_model`` again finishes the job.
Each step of a layer (plan, check, accept, install) is the linear method's own, from
``kernelpick.integration.layer``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from kernelpick.adapters import default_caps
from kernelpick.core import (
    Catalog,
    Decision,
    DeviceCaps,
    InvalidValueError,
    KernelpickError,
    ModelSummary,
    Policy,
    QuantConfig,
    Scheme,
)
from kernelpick.integration._errors import ModelConversionError
from kernelpick.integration.convert._eligible import Found, Skip, eligible_linears, weight_groups
from kernelpick.integration.convert._progress import ProgressBar
from kernelpick.integration.convert._report import ConversionReport, LayerReport
from kernelpick.integration.convert._summary import kept_layers, record_kept
from kernelpick.integration.convert._swap import Swaps, model_bytes
from kernelpick.integration.formats import check_one_config, record
from kernelpick.integration.layer import (
    LayerState,
    LayerSteps,
    QuantizedLinear,
    Recipe,
    accept_before_loading,
    accept_float,
    check_bias,
    check_float,
    frozen,
    install,
    weights_from,
)
from kernelpick.kernels import CHUNK_ROWS, Kernel, Launch

__all__ = ["quantize_model"]


@attrs.frozen
class _Layer:
    """One linear to convert, at every path it is reachable by."""

    paths: tuple[str, ...]
    module: torch.nn.Linear
    state: LayerState
    bound: Kernel


def _plan(
    steps: LayerSteps, group: list[Found]
) -> tuple[list[_Layer], list[tuple[str, KernelpickError]]]:
    layers: list[_Layer] = []
    failures: list[tuple[str, KernelpickError]] = []
    for index, (linear, paths) in enumerate(group):
        try:
            config = steps.config(
                linear.out_features, linear.in_features, linear.weight.dtype,
                bias=linear.bias is not None,
            )  # fmt: skip
            plan = steps.plan(config, (linear.out_features,), linear.weight.dtype, paths[0])
            state = LayerState(plan)
            if index == 0:  # one weight for the whole group: checked once
                check_float(state.config, state.label, linear.weight, linear.bias,
                            chunk_rows=steps.chunk_rows)  # fmt: skip
            elif linear.bias is not None:
                check_bias(state.config, state.label, linear.bias, chunk_rows=steps.chunk_rows)
            kernel = steps.bind(state, linear.weight.device)
            layers.append(_Layer(paths, linear, state, kernel))
        except KernelpickError as error:
            failures.append((paths[0], error))
    return layers, failures


def _plan_all(steps: LayerSteps, groups: list[list[Found]]) -> list[list[_Layer]]:
    """Every group planned, emptying ``groups``; or ``ModelConversionError`` naming every
    layer that cannot be converted."""
    plans: list[list[_Layer]] = []
    failures: list[tuple[str, KernelpickError]] = []
    while groups:
        layers, failed = _plan(steps, groups.pop(0))
        plans.append(layers)
        failures.extend(failed)
    if failures:
        raise ModelConversionError(failures)
    return plans


def quantize_model(
    model: torch.nn.Module,
    scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
    caps: DeviceCaps | None = None,
    policy: Policy | None = None,
    skip: Skip | None = None,
    *,
    untie: bool = False,
    quantize_head: bool = False,
    catalog: Catalog | None = None,
    launches: Mapping[str, Launch] | None = None,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool | None = None,
    block_size: int | None = None,
    group_size: int | None = None,
    symmetric: bool = True,
) -> ConversionReport:
    """Replace every ``nn.Linear`` of ``model`` (in place) with an ``QuantizedLinear``.

    ``scheme`` is one of ``ONLINE_SCHEMES``; ``block_size`` is ``fp8_block``'s (None: 128).
    An ``int8_per_channel`` layer's ``QuantizedLinear`` holds an int8 weight; an
    ``int4_weight_only`` or ``int8_weight_only`` one its pack-quantized tensors, quantized
    round-to-nearest in groups of ``group_size`` along K (None: the scheme's default, -1
    per channel), with zero points where ``symmetric`` is False.

    ``skip(name, module)`` keeps a layer as it is. The output head (a transformers
    model's ``get_output_embeddings()``, or a linear named ``lm_head``) stays in high
    precision, as in every engine, unless ``quantize_head=True``. A linear whose weight is
    shared with a module that stays in high precision (a head tied to the input
    embedding) is kept too, and the report says so; ``untie=True`` converts it into a
    separate quantized copy.
    ``caps`` defaults to a probe of the device the first layer lives on. A kernel of your
    own is selected from ``catalog`` and run through its row in ``launches`` (both default
    to kernelpick's; see ``kernelpick.kernels.bind``); a catalog id without a row raises
    ``UnknownNameError`` before the model changes. Forward hooks and pre-hooks on a
    replaced linear carry over to its ``QuantizedLinear``. ``progress`` shows a bar of the layers
    converted on stderr: None (the default) where stderr is a terminal, True wherever stderr
    is open, False never; a stderr that fails to draw turns the bar off, never the
    conversion.

    Raises ``ModelConversionError``: naming every layer that cannot be converted, with the
    model untouched; or, when an exception of any kind stops the swap phase, naming the
    layers converted so far (each layer is whole; call again to finish).
    """
    for flag, value in (("untie", untie), ("quantize_head", quantize_head)):
        if not isinstance(value, bool):
            raise InvalidValueError(flag, value, "True or False")
    if progress is not None and not isinstance(progress, bool):
        expected = "True, False, or None (shown where stderr is a terminal)"
        raise InvalidValueError("progress", progress, expected)
    linears, skipped = eligible_linears(model, skip, quantize_head)
    if any("" in paths for _, paths in linears):
        raise InvalidValueError(
            "model", type(model).__name__, "a module containing linears (the root is not replaced)"
        )
    groups, tied = weight_groups(model, linears, untie)
    del linears  # from here on only the plans hold the linears, and they are popped
    if caps is None:
        caps = default_caps(groups[0][0][0].weight.device if groups else None)
    recipe = Recipe.of(scheme, block_size=block_size, group_size=group_size, symmetric=symmetric)
    steps = LayerSteps.create(
        recipe, caps, policy, catalog=catalog, launches=launches, chunk_rows=chunk_rows
    )
    check_one_config(model, recipe)
    plans = _plan_all(steps, groups)
    before = model_bytes(model)
    reports: list[LayerReport] = []
    decided: list[tuple[str, QuantConfig, Decision]] = []
    bar = ProgressBar(progress, sum(len(layers) for layers in plans))
    try:
        while plans:  # popped, so each replaced nn.Linear is freed as soon as it is swapped out
            layers = plans.pop(0)
            swaps = Swaps(model)
            try:
                _convert(steps, swaps, layers)
                # Inside: an interrupt while drawing undoes this group. A stream that fails
                # to draw turns the bar off, never the conversion (see _progress).
                bar.update(len(layers))
            except BaseException as error:
                swaps.undo()
                record(model)  # the layers converted so far, each whole
                converted = [report.name for report in reports]
                raise ModelConversionError.stopped(layers[0].paths[0], converted, error) from error
            reports.extend(LayerReport.of(layer.paths[0], layer.state) for layer in layers)
            decided.extend((x.paths[0], x.state.config, x.state.decision) for x in layers)
            # Logged once swapped in, not when planned: a conversion refused or stopped
            # would otherwise report kernels its layers never got, and the call that
            # converts them would then stay silent (each selection is logged once). The
            # loop names states: a name left bound to a _Layer would keep its nn.Linear alive.
            for state in [layer.state for layer in layers]:
                steps.log(state)
            del layers, swaps
    finally:
        bar.close()  # on an interrupt too, so the terminal is left on a fresh line; it
        # raises no drawing error, which would hide the ModelConversionError raised above
    record(model)  # what a transformers model's save_pretrained writes beside its weights
    accept_before_loading(model)
    kept = kept_layers(model, (*skipped, *tied))
    record_kept(model, kept)
    summary = ModelSummary.of(steps.scheme.value, caps, decided, kept)  # this call's layers
    return ConversionReport(
        steps.scheme.value, caps.name, tuple(reports), (*skipped, *tied), before,
        model_bytes(model), summary=summary,
    )  # fmt: skip


def _convert(steps: LayerSteps, swaps: Swaps, layers: list[_Layer]) -> None:
    """Quantize the weight ``layers`` share once, and put an ``QuantizedLinear`` holding it at
    every path of every one of them."""
    first = layers[0]
    state = first.state
    weights = accept_float(  # checked when planned, before any layer changed
        state.config, state.label, first.module.weight, checked=True, chunk_rows=steps.chunk_rows
    )
    weights = weights_from(state.config, {  # parameters, so the tied layers share them
        name: None if tensor is None else frozen(tensor)
        for name, tensor in zip(weights.NAMES, weights.tensors(), strict=True)
    })  # fmt: skip
    for layer in layers:  # one parameter each for the layers the weight ties
        linear = layer.module
        quantized = QuantizedLinear(linear.in_features, linear.out_features, steps, linear.bias)
        install(quantized, layer.state, layer.bound, weights)
        for path in layer.paths:
            swaps.replace(path, quantized)
