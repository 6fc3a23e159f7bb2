"""The layers kernelpick's transformers quantizer makes, in the three moments transformers
gives it: before the weights load (select every kernel, then swap each eligible
``nn.Linear`` of the meta skeleton for an ``QuantizedLinear``), while they load (quantize a
high-precision weight as it arrives) and after (check every tensor each layer got, bind
its kernel and install the canonical parameters).

transformers sets each loaded tensor on its module with ``setattr`` and never raises from a
conversion (it logs the error and leaves the tensor out), so nothing here trusts a tensor
it did not check: a layer whose tensors did not all arrive, or arrived in another dtype or
shape, is refused after loading rather than run with uninitialised memory.
"""

from __future__ import annotations

import attrs
import torch

from kernelpick.core import InvalidValueError, KernelpickError
from kernelpick.engines.transformers._kept import Keep
from kernelpick.integration import CheckpointError, ModelConversionError
from kernelpick.integration.convert import SkippedLayer, Swaps
from kernelpick.integration.formats import is_conv1d
from kernelpick.integration.layer import (
    INT_NAMES,
    IntWeights,
    LayerState,
    LayerSteps,
    LayerWeights,
    QuantizedLinear,
    accept,
    accept_float,
    accept_int,
    attach,
    check_bias,
    frozen,
    install,
    int_params,
    is_weight_only_int,
    layer_state,
)

__all__ = ["LOADED", "HfLayers"]

# The flag transformers puts on every tensor it loaded (set_param_for_module) and on none
# it only moved off the meta device for a missing key.
LOADED = "_is_hf_initialized"
_WHERE = "transformers from_pretrained"


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.nn.Parameter:
    return frozen(torch.empty(shape, dtype=dtype, device="meta"))


@attrs.define
class HfLayers:
    """The quantized layers of one ``from_pretrained`` call, by path, with the steps that
    selected their kernels, and the linears ``kept`` in high precision with why.
    ``online`` layers quantize a high-precision checkpoint; the others read kernelpick's
    canonical tensors. ``errors`` are the quantizations that failed during loading
    (transformers would only log them), ``scales`` the scales they made (the only ones an
    online layer installs)."""

    steps: LayerSteps
    online: bool
    layers: dict[str, QuantizedLinear] = attrs.field(factory=dict)
    kept: list[SkippedLayer] = attrs.field(factory=list)
    errors: dict[str, Exception] = attrs.field(factory=dict)
    scales: dict[str, torch.Tensor] = attrs.field(factory=dict)

    # -- before loading ----------------------------------------------------------------

    def swap(self, model: torch.nn.Module, keep: Keep) -> None:
        """Select a kernel for every eligible linear (exact ``nn.Linear`` that ``keep``
        gives no reason to keep, each kept one in ``kept``, as is each transformers
        ``Conv1D``: ``keep`` keeps it), then put an
        ``QuantizedLinear`` on the meta device at each. A rejection raises
        ``KernelSelectionError`` with every reason before anything changes or is
        allocated."""
        found: list[tuple[str, torch.nn.Linear]] = []
        for name, module in model.named_modules():
            # A Conv1D is a linear no swap takes: keep keeps it, with why.
            if not name or not (type(module) is torch.nn.Linear or is_conv1d(module)):
                continue
            why = keep(name, module)
            if why is not None:
                self.kept.append(SkippedLayer(name, why))
                continue
            found.append((name, module))
        states = [(name, linear, self._select(name, linear)) for name, linear in found]
        swaps = Swaps(model)
        for name, linear, state in states:
            swaps.replace(name, self._placeholder(linear, state))

    def _select(self, name: str, linear: torch.nn.Linear) -> LayerState:
        n, k = linear.out_features, linear.in_features
        config = self.steps.config(n, k, linear.weight.dtype, bias=linear.bias is not None)
        return LayerState(self.steps.plan(config, (n,), linear.weight.dtype, name))

    def _placeholder(self, linear: torch.nn.Linear, state: LayerState) -> QuantizedLinear:
        """The layer with meta tensors named and shaped as its plan registers them, which
        transformers will load. Online, the quantize op makes the scale as the weight
        arrives, so the layer also holds a placeholder of the canonical scale's shape."""
        config, (n, k) = state.config, state.config.weight_shape
        layer = QuantizedLinear(k, n, self.steps, linear.bias)
        for param in state.plan.params:
            setattr(layer, param.name, _meta(param.shape, param.dtype))
        if self.online and is_weight_only_int(config):  # what quantizing makes of the weight
            for param in int_params(config):
                setattr(layer, param.name, _meta(param.shape, param.dtype))
        elif self.online:
            layer.weight_scale = _meta(config.weight_scale_shape, torch.float32)
        attach(layer, state)
        self.layers[state.prefix] = layer
        return layer

    # -- while loading -----------------------------------------------------------------

    def quantizes(self, param_name: str) -> bool:
        """Whether the tensor loaded as ``param_name`` is one kernelpick takes as it arrives
        and checks itself: the online path quantizes the weight; a pre-quantized layer's
        tensors arrive in the checkpoint's own layouts (a ``[N]`` per-channel scale, say),
        which transformers must not compare with the placeholders' shapes first."""
        path, _, tensor = param_name.rpartition(".")
        names = ("weight", "weight_scale") if self.online else ("weight", "weight_scale",
                                                                "input_scale")  # fmt: skip
        return path in self.layers and (tensor in names or tensor in INT_NAMES)

    def owns(self, param_name: str) -> bool:
        """Whether ``param_name`` is a tensor of one of these layers (other than bias)."""
        path, _, tensor = param_name.rpartition(".")
        return path in self.layers and tensor != "bias"

    def quantize(
        self, tensors: dict[str, object], missing: set[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Each high-precision ``<layer>.weight`` in ``tensors`` as the canonical weight and
        its ``<layer>.weight_scale`` (an integer layer's pack-quantized tensors, its weight
        then struck from transformers' ``missing`` keys); other tensors as they are.
        kernelpick's refusal of a weight is kept for ``finish`` to raise and the weight
        passed on unquantized:
        transformers would only log an error raised here, and then raise one of its own
        that hides it. Any other failure is raised to transformers."""
        out: dict[str, torch.Tensor] = {}
        for key, value in tensors.items():
            tensor = value[0] if isinstance(value, list) else value
            if not isinstance(tensor, torch.Tensor):
                raise InvalidValueError(f"loaded tensor {key}", type(tensor).__name__, "a tensor")
            path, _, name = key.rpartition(".")
            layer = self.layers.get(path)
            if layer is None or name != "weight":
                out[key] = tensor
                continue
            state = layer_state(layer)
            try:
                weights = accept_float(
                    state.config, state.label, tensor, chunk_rows=self.steps.chunk_rows
                )
            except KernelpickError as refused:  # finish raises it, first
                self.errors[path] = refused
                shape = state.config.weight_scale_shape
                unused = torch.full(shape, float("nan"))  # never installed: finish raises
                out[key], out[f"{path}.weight_scale"] = tensor, unused
                continue
            except Exception as error:
                self.errors[path] = error
                raise
            if isinstance(weights, IntWeights):  # its pack-quantized tensors, not a weight
                named = zip(weights.NAMES, weights.tensors(), strict=True)
                out.update({f"{path}.{n}": t for n, t in named if t is not None})
                if missing is not None:  # the weight is loaded: into what it became
                    missing.discard(key)
            else:
                out[key], out[f"{path}.weight_scale"] = weights.weight, weights.weight_scale
            self.scales[path] = weights.weight_scale
        return out

    # -- after loading -----------------------------------------------------------------

    def finish(self) -> None:
        """Check every layer's loaded tensors, bind its kernel and install them; or raise,
        naming every layer that failed (``ModelConversionError``), a layer with a tensor
        the checkpoint did not hold (``CheckpointError``) first."""
        failures: list[tuple[str, KernelpickError]] = []
        for path, layer in self.layers.items():
            error = self.errors.get(path)
            if error is not None and not isinstance(error, KernelpickError):
                raise error
            try:
                if error is not None:
                    raise error
                self._finish(path, layer)
            except KernelpickError as failed:
                failures.append((path, failed))
        if failures:
            raise ModelConversionError(failures)

    def _finish(self, path: str, layer: QuantizedLinear) -> None:
        state = layer_state(layer)
        if state.processed:
            return
        integer = is_weight_only_int(state.config)
        if self.online and integer:  # the weight went to the quantize op, never to the layer
            placeholder = layer._parameters.get("weight")  # (moved off meta, uninitialised)
            if placeholder is not None and not getattr(placeholder, LOADED, 0):
                del layer._parameters["weight"]
        names = [name for name, p in layer.named_parameters(recurse=False) if p is not None]
        missing = [name for name in names if not getattr(layer.get_parameter(name), LOADED, 0)]
        if missing:
            raise CheckpointError(
                _WHERE, ", ".join(f"{path}.{name}" for name in missing), "no tensor",
                "every tensor of a quantized layer in the checkpoint: transformers would "
                "leave these uninitialised",
            )  # fmt: skip
        weight_scale = layer.get_parameter("weight_scale").detach()
        made = self.scales.get(path)
        if self.online and (made is None or weight_scale.data_ptr() != made.data_ptr()):
            raise CheckpointError(
                _WHERE, f"{path}.weight_scale", "a scale the checkpoint holds",
                "none: this layer's weight is quantized on load, and its scale is the one "
                "quantizing made (a checkpoint with scales is quantized already)",
            )  # fmt: skip

        def label(name: str) -> str:
            return f"{path}.{name}"

        if integer:
            if layer.bias is not None:
                check_bias(state.config, label, layer.bias.detach())
            tensors = {name: layer.get_parameter(name).detach() for name in names if name != "bias"}
            accepted = accept_int(state.config, label, tensors)
            self._install(layer, state, accepted, accepted.weight_packed.device)
            return
        static = layer.get_parameter("input_scale") if "input_scale" in names else None
        weights = accept(  # transformers' tensors: handed over, so canonicalized in place
            state.config, label, layer.get_parameter("weight").detach(), weight_scale,
            None if static is None else static.detach(),
            None if layer.bias is None else layer.bias.detach(), owned=True,
            chunk_rows=self.steps.chunk_rows,
        )  # fmt: skip
        self._install(layer, state, weights, weights.weight.device)

    def _install(
        self, layer: QuantizedLinear, state: LayerState, weights: LayerWeights, device: torch.device
    ) -> None:
        kernel = self.steps.bind(state, device)
        if layer.bias is not None:
            layer.bias.requires_grad_(False)
        install(layer, state, kernel, weights)  # the kernel checks them before they go in
        self.steps.log(state)
