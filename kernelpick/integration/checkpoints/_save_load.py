"""Quantized checkpoints out and in: compressed-tensors' formats ("float-quantized",
"int-quantized", "naive-quantized", "mxfp8-quantized": what llmcompressor writes, and vLLM
and SGLang load) both ways, and transformers' FineGrainedFP8 block checkpoints in.

``save_quantized`` writes ``model.safetensors``, holding every quantized layer's canonical
tensors (mxfp8's E8M0 weight scales as their uint8 bytes, as compressed-tensors stores
them) and every other tensor as it is, and the ``quantization_config``: merged into the
``config.json`` of a transformers model (with the ``architectures`` and ``dtype`` its
``save_pretrained`` writes), or alone in a ``config.json`` beside the weights; the two
replace the old ones together (``_atomic_files``), or the directory stays as it was.
``load_quantized`` turns a high-precision skeleton, built on the meta device or normally,
into the quantized model a checkpoint holds, never materialising a high-precision weight
for a quantized layer. Either the whole checkpoint loads, or the model is left as it was.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kernelpick.adapters import default_caps
from kernelpick.core import Catalog, DeviceCaps, InvalidValueError, ModelSummary, Policy
from kernelpick.integration._errors import CheckpointError, ModelConversionError
from kernelpick.integration.checkpoints._atomic_files import Sink, locked
from kernelpick.integration.checkpoints._build import build
from kernelpick.integration.checkpoints._load_plan import LoadPlan, plan
from kernelpick.integration.checkpoints._safetensors_io import (
    WEIGHTS_NAME,
    Checkpoint,
    read_json,
    write_safetensors,
)
from kernelpick.integration.convert import (
    ConversionReport,
    LayerReport,
    Swaps,
    kept_layers,
    model_bytes,
    record_kept,
)
from kernelpick.integration.formats import (
    DTYPE_KEY,
    DTYPE_KEYS,
    QUANTIZATION_CONFIG,
    check_one_config,
    quantization_config,
    quantized_layers,
    read_layout,
    record,
)
from kernelpick.integration.layer import LayerSteps, QuantizedLinear, accept_before_loading
from kernelpick.kernels import Launch

__all__ = ["CONFIG_NAME", "load_quantized", "save_quantized"]

CONFIG_NAME = "config.json"


def _model_config(model: torch.nn.Module) -> dict[str, Any]:
    """A model's config as transformers' ``save_pretrained`` writes it: for a transformers
    model, its config with its class (``architectures``, which readers build it by); for
    any model, the dtype its layers compute in (``dtype``: the quantized layers'
    activations', which the stored tensors do not say). Where they compute in several,
    none is written: the config's own could be stale, and would be read as theirs."""
    to_json = getattr(getattr(model, "config", None), "to_json_string", None)
    config: dict[str, Any] = json.loads(to_json()) if callable(to_json) else {}
    if callable(to_json):
        config["architectures"] = [type(model).__name__]
    for key in DTYPE_KEYS:  # transformers before 4.56 wrote torch_dtype
        config.pop(key, None)
    dtypes = {state.config.input_dtype for state in quantized_layers(model).values()}
    if len(dtypes) == 1:
        config[DTYPE_KEY] = dtypes.pop().value
    return config


def save_quantized(model: torch.nn.Module, directory: str | os.PathLike[str]) -> Path:
    """Write ``model``'s quantized checkpoint to ``directory`` (created if needed), in
    compressed-tensors' format: ``model.safetensors`` and ``config.json``, which replace
    the old ones together; the directory's other files stay.

    Every quantized layer must use the same named scheme (and, for ``fp8_block``, the same
    block size). An ``mxfp8`` layer's E8M0 ``weight_scale`` is written as uint8 bytes, as
    compressed-tensors' MXFP8 compressor stores it. Saves into one directory wait for each
    other. On any error the directory is as it was (an ``OSError`` arrives as a
    ``CheckpointError`` naming the path). Returns the directory.
    """
    quantization = quantization_config(model)
    root = Path(directory)
    merged = _model_config(model)
    merged[QUANTIZATION_CONFIG] = quantization
    text = (json.dumps(merged, indent=2, sort_keys=True) + "\n").encode()
    state = model.state_dict()  # an E8M0 scale as its uint8 bytes (QuantizedLinear)

    def write_weights(out: Sink) -> None:
        write_safetensors(out, state, str(root / WEIGHTS_NAME))

    with locked(root) as target:
        others = sorted(
            name
            for name in target.names()
            if fnmatch.fnmatch(name, "*.safetensors*")
            and name != WEIGHTS_NAME
            and not name.startswith(".")
        )  # a reader would take them with the new config (vLLM reads every *.safetensors)
        if others:
            raise CheckpointError(
                str(root), "files", ", ".join(others[:5]),
                f"a directory holding no other checkpoint than {WEIGHTS_NAME}",
            )  # fmt: skip
        # config.json is the key: without it, no reader takes the directory for a model.
        target.replace(
            {WEIGHTS_NAME: write_weights, CONFIG_NAME: lambda out: out(text)}, CONFIG_NAME
        )
    return root


def _device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for tensor in (*model.parameters(), *model.buffers()):
        if not tensor.is_meta:
            return tensor.device
    return torch.device("cpu")


def _commit(
    model: torch.nn.Module,
    plan: LoadPlan,
    modules: list[QuantizedLinear],
    tensors: dict[int, torch.Tensor],
) -> None:
    """Put every new tensor and module in place, or, if anything stops it, none."""
    replaced = {id(layer.module) for layer in plan.layers}
    swaps = Swaps(model)
    at = "(the model's other tensors)"
    try:
        for module in {id(m): m for m in model.modules()}.values():
            if id(module) in replaced:
                continue
            for name, tensor in (*module._parameters.items(), *module._buffers.items()):
                if tensor is not None and id(tensor) in tensors:
                    swaps.set_tensor(module, name, tensors[id(tensor)])
        for layer, quantized in zip(plan.layers, modules, strict=True):
            at = layer.paths[0]
            for path in layer.paths:
                swaps.replace(path, quantized)
    except BaseException as error:
        swaps.undo()
        raise ModelConversionError.stopped(at, (), error) from error


def load_quantized(
    model: torch.nn.Module,
    directory: str | os.PathLike[str],
    caps: DeviceCaps | None = None,
    policy: Policy | None = None,
    *,
    device: torch.device | str | None = None,
    catalog: Catalog | None = None,
    launches: Mapping[str, Launch] | None = None,
) -> ConversionReport:
    """Fill ``model``, a high-precision skeleton, from the quantized checkpoint in
    ``directory``, replacing each quantized layer with an ``QuantizedLinear`` (in place).

    The checkpoint is compressed-tensors' (what ``save_quantized`` and llmcompressor
    write: FP8 per channel, per tensor, per block or weight-only, int8 per channel) or
    transformers' FineGrainedFP8 (``quant_method`` "fp8": ``weight`` and
    ``weight_scale_inv`` per block), read as ``fp8_block``.

    ``device`` is where the tensors go: by default the skeleton's, or the CPU for a skeleton
    on the meta device. ``caps`` defaults to a probe of that device; ``catalog`` and
    ``launches`` to kernelpick's kernels, as for ``quantize_model``. Every check (the
    config, each kernel selection, every tensor's name, dtype and shape, NaN bytes and
    scales) runs before the model changes; a failure raises ``CheckpointError`` or
    ``ModelConversionError`` and leaves the model as it was.
    """
    root = Path(directory)
    config_path = root / CONFIG_NAME
    layout = read_layout(str(config_path), read_json(config_path).get(QUANTIZATION_CONFIG))
    target = _device(model, device)
    if caps is None:
        caps = default_caps(target)
    steps = LayerSteps.create(layout.recipe, caps, policy, catalog=catalog, launches=launches)
    converted = sorted(quantized_layers(model))
    if converted:  # its tensors would be read as the skeleton's own, to other layouts
        raise InvalidValueError(
            "model", f"{type(model).__name__} holding kernelpick layers ({converted[0]}, ...)",
            "a high-precision skeleton: load into the model the checkpoint was saved from, "
            "before any conversion",
        )  # fmt: skip
    check_one_config(model, layout.recipe)
    with Checkpoint(root) as checkpoint:
        planned = plan(model, checkpoint, steps, layout, target)
        before = model_bytes(model)
        modules, tensors = build(checkpoint, steps, planned, target)
    _commit(model, planned, modules, tensors)
    accept_before_loading(model)
    record(model)  # what its save_pretrained writes: this checkpoint's config
    for layer in planned.layers:  # logged once in place, as quantize_model does
        steps.log(layer.state)
    layers = tuple(LayerReport.of(layer.paths[0], layer.state) for layer in planned.layers)
    kept = kept_layers(model, planned.skipped)
    record_kept(model, kept)
    decided = [(layer.paths[0], layer.state.config, layer.state.decision)
               for layer in planned.layers]  # fmt: skip
    summary = ModelSummary.of(layout.scheme.value, caps, decided, kept)
    return ConversionReport(
        layout.scheme.value, caps.name, layers, tuple(planned.skipped), before,
        model_bytes(model), summary=summary,
    )  # fmt: skip
