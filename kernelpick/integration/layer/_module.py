"""``QuantizedLinear``: the module ``quantize_model`` and ``load_quantized`` put where an
``nn.Linear`` was."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kernelpick.core import HIGH_PRECISION, InvalidValueError
from kernelpick.integration.layer._accept import CanonicalWeights, accept, check_bias
from kernelpick.integration.layer._int_form import (
    SHAPE_NAME,
    IntWeights,
    accept_int,
    check_shape,
    is_weight_only_int,
)
from kernelpick.integration.layer._loaders import closed_loader
from kernelpick.integration.layer._prepare import run, tensor_names
from kernelpick.integration.layer._state import LayerState, attach, layer_state
from kernelpick.integration.layer._steps import LayerSteps
from kernelpick.kernels import check_tensor, stored_scale, torch_dtype

__all__ = ["QuantizedLinear", "accept_before_loading"]

# Integer views of the same width: a cast that converts floats leaves these alone, while
# a move to another device or into shared memory still carries them.
_BITS = {
    torch.float8_e4m3fn: torch.uint8, torch.float8_e8m0fnu: torch.uint8, torch.int8: torch.int8,
    torch.float32: torch.int32, torch.int32: torch.int32, torch.int64: torch.int64,
}  # fmt: skip
_COMPUTE = {torch_dtype(dtype): dtype for dtype in HIGH_PRECISION}


def _carried(fn: Callable[[torch.Tensor], torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    """``fn`` applied to ``tensor``'s bits: moved, never cast."""
    bits = tensor.view(_BITS[tensor.dtype])
    out = fn(bits)
    if out.dtype != bits.dtype:
        raise InvalidValueError(
            "cast of a quantized layer", str(out.dtype).removeprefix("torch."),
            "a conversion that leaves integer tensors alone: quantized weights and their scales "
            "keep their dtypes (use .to(dtype), .half(), .float() or .bfloat16())",
        )  # fmt: skip
    return out.view(tensor.dtype)


# torch stores a module's _version in its state dict metadata. Version 1 was kernelpick's
# first QuantizedLinear, whose stored weight was in the kernel's layout ([K, N] for _scaled_mm).
_VERSION = 2


class QuantizedLinear(torch.nn.Module):
    """A linear layer whose quantized weight runs on the kernel kernelpick chose for it.

    It holds the canonical ``weight`` (FP8 ``[N, K]``, or int8 for an int8 scheme),
    ``weight_scale`` (fp32 per channel, per tensor or per block; E8M0 per 32 for MXFP8),
    what its kernel prepared from them (``layer_state(layer).prepared``), for static schemes
    ``input_scale``, and ``bias``; ``kernelpick_decision`` records the choice.
    ``quantize_model`` and ``load_quantized`` make it: ``steps`` are theirs, the same steps
    the linear method makes an engine's layers with, so a forward runs the kernel as the
    method's ``apply`` does.

    Casts keep the quantization: ``.half()``, ``.bfloat16()``, ``.float()`` and
    ``.to(dtype)`` change the activation and output dtype (and the kernel, where the
    choice for the new dtype differs), never the quantized weight or its fp32 scales. A dtype no
    kernel takes raises before the layer changes: ``InvalidValueError`` for a dtype outside
    bf16/fp16/fp32, ``KernelSelectionError`` when no kernel fits. ``.to(device)`` moves
    the tensors and, onto another device, selects again for that device.
    ``state_dict()`` holds the canonical tensors, an E8M0 scale as its uint8 bytes (as
    compressed-tensors stores it); ``load_state_dict`` takes what ``accept`` takes, and
    refuses anything else before a byte of the layer changes.
    """

    _version = _VERSION

    def __init__(
        self,
        in_features: int,
        out_features: int,
        steps: LayerSteps,
        bias: torch.nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.steps = steps
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run(self, x, self.bias)

    def extra_repr(self) -> str:
        state = layer_state(self)
        flag = " (degraded)" if state.decision.degraded else ""
        shard = (
            "" if state.parallel is None else f", {state.parallel.describe().removeprefix('on ')}"
        )
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, kernel={state.decision.kernel}{flag}{shard}"
        )

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> QuantizedLinear:
        state = layer_state(self)
        kernel = state.bound
        if kernel is None:  # never processed: nothing bound, nothing to keep
            return super()._apply(fn, recurse)  # type: ignore[no-any-return,no-untyped-call]
        with torch.no_grad():
            now = torch.empty(0, dtype=torch_dtype(state.config.input_dtype), device=kernel.device)
            target = fn(now)
        dtype = _COMPUTE.get(target.dtype)
        if dtype is None:
            valid = ", ".join(sorted(d.value for d in HIGH_PRECISION))
            raise InvalidValueError(
                f"dtype for quantized layer {state.name!r}", str(target.dtype),
                f"one of {valid}: the activations take it, the quantized weight keeps its format",
            )  # fmt: skip
        retargeted = self.steps.retarget(state, dtype, target.device)
        with torch.no_grad():
            moved = {
                name: _carried(fn, param) for name, param in self._parameters.items()
                if name != "bias" and param is not None
            }  # fmt: skip
            bias = None if self.bias is None else fn(self.bias)
        for name, tensor in moved.items():
            self.get_parameter(name).data = tensor
        if self.bias is not None and bias is not None:
            self.bias.data = bias
        attach(self, retargeted)
        self.steps.log(retargeted)  # once the layer runs it: a refused cast logs nothing
        return self

    def _save_to_state_dict(
        self, destination: dict[str, Any], prefix: str, keep_vars: bool
    ) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        state = layer_state(self)
        # Stored beside the packed tensors, as the format does, once they are the layer's:
        # a placeholder's state dict (transformers lists its keys to load) has no such key.
        if state.processed and is_weight_only_int(state.config):
            destination[prefix + SHAPE_NAME] = torch.tensor(state.config.weight_shape)
        key = prefix + "weight_scale"
        scale = destination.get(key)
        if not keep_vars and isinstance(scale, torch.Tensor):  # kept: the live parameters
            destination[key] = stored_scale(scale)  # an E8M0 scale as its bytes

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # torch's copy_ would cast a float weight into FP8 without its scale, or copy a
        # transposed weight into a square layer: accept (the one check every path makes)
        # refuses what is not canonical before a byte of this layer is written, and torch
        # copies the canonical values it returns.
        version = local_metadata.get("version", _VERSION)
        if version < _VERSION:
            raise InvalidValueError(
                f"state dict version of {prefix or 'the layer'}", version,
                f"{_VERSION}, kernelpick's canonical layout: an older QuantizedLinear stored its "
                "kernel's layout (a transposed weight), so quantize the model again",
            )  # fmt: skip
        state = layer_state(self)
        canonical = self._accepted(state, state_dict, prefix)
        super()._load_from_state_dict(
            ChainMap(canonical, dict(state_dict)) if canonical else state_dict, prefix,
            local_metadata, strict, missing_keys, unexpected_keys, error_msgs,
        )  # fmt: skip
        if prefix + SHAPE_NAME in unexpected_keys:  # checked by _accepted; held by the plan
            unexpected_keys.remove(prefix + SHAPE_NAME)
        state.prepared = None  # the kernel prepares the new tensors before the next forward
        for name in tensor_names(
            state.config
        ):  # assign=True puts new parameters in: they stay closed too
            param = self._parameters.get(name)
            if param is not None:
                param.weight_loader = closed_loader(state, name)  # type: ignore[attr-defined]

    def _accepted(
        self, state: LayerState, state_dict: Mapping[str, Any], prefix: str
    ) -> dict[str, torch.Tensor]:
        """The canonical value of each of this layer's tensors in ``state_dict``, accepted
        as a whole layer: a partial state dict is accepted with the layer's own tensors in
        place of the ones it lacks, so it meets the same laws as a whole one."""

        def label(name: str) -> str:
            return prefix + name

        shape = state_dict.get(prefix + SHAPE_NAME)
        if shape is not None:
            check_shape(state.config, label(SHAPE_NAME), shape)
        names = tensor_names(state.config)
        own = {name: param for name in names if (param := self._parameters.get(name)) is not None}
        # Every name of the form, the layer's or not: a zero point or g_idx it does not
        # have is refused (accept_int), never left for torch to skip as unexpected.
        given = {name: state_dict.get(prefix + name) for name in names
                 if name in own or prefix + name in state_dict}  # fmt: skip
        bias = state_dict.get(prefix + "bias") if self.bias is not None else None
        if all(tensor is None for tensor in given.values()) and bias is None:
            return {}
        filled = {
            name: own[name].detach() if tensor is None else check_tensor(label(name), tensor)
            for name, tensor in given.items() if tensor is not None or name in own
        }  # fmt: skip
        checked_bias = None if bias is None else check_tensor(label("bias"), bias)
        weights: CanonicalWeights | IntWeights
        if is_weight_only_int(state.config):
            weights = accept_int(state.config, label, filled)
            if checked_bias is not None:
                check_bias(state.config, label, checked_bias)
        else:
            weights = accept(
                state.config, label, filled["weight"], filled["weight_scale"],
                filled.get("input_scale"), checked_bias,
            )  # fmt: skip
        named = zip(weights.NAMES, weights.tensors(), strict=True)
        return {prefix + name: tensor for name, tensor in named
                if tensor is not None and given.get(name) is not None}  # fmt: skip


_GUARDED = "_kernelpick_accepts_state_dicts"


def accept_before_loading(model: torch.nn.Module) -> None:
    """Make ``model.load_state_dict`` accept every quantized layer's tensors before any
    module of it loads one, so a refused tensor in one layer leaves every layer as it was
    (torch loads module by module). ``quantize_model``, ``load_quantized`` and the
    transformers quantizer call it on the model they convert; calling it again does
    nothing."""
    if not model.__dict__.get(_GUARDED, False):
        model.register_load_state_dict_pre_hook(_accept_every_layer)  # type: ignore[no-untyped-call]
        model.__dict__[_GUARDED] = True


def _accept_every_layer(
    module: torch.nn.Module,
    state_dict: Mapping[str, Any],
    prefix: str,
    *_: object,
) -> None:
    for name, layer in module.named_modules():
        if isinstance(layer, QuantizedLinear) and layer_state(layer).processed:
            layer._accepted(layer_state(layer), state_dict, f"{prefix}{name}." if name else prefix)
