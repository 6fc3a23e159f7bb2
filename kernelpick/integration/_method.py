"""The FP8 linear method: select before allocating, load, quantize, run.

It follows the linear-method protocol inference engines use (``create_weights``,
``process_weights_after_loading``, ``apply``), so an engine can hand it its layers as they
are. ``Fp8PtpcLinearMethod`` is the ``fp8_per_channel`` (PTPC) method: per-token dynamic
activations, per-channel static weights. Whatever the kernel, a processed layer holds its
weights in the canonical layout (``kernels.canonical``); the kernel's own layout is derived
from them on each call and never stored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import attrs
import torch

from kernelpick.adapters import bind
from kernelpick.core._decision import Rejected, Selected
from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._policy import Policy
from kernelpick.core._quant import QuantConfig
from kernelpick.core._schemes import Scheme, quant_config
from kernelpick.core._select import choose
from kernelpick.core._specs import Catalog
from kernelpick.integration._errors import KernelSelectionError
from kernelpick.integration._loaders import (
    WeightLoader,
    fp8_weight_loader,
    high_precision_loader,
    scale_loader,
    tracking,
)
from kernelpick.integration._state import (
    ALL_SHARDS,
    CheckpointFormat,
    LayerState,
    attach,
    layer_state,
)
from kernelpick.kernels._base import Kernel
from kernelpick.kernels._canonical import (
    CANONICAL_FP8,
    canonical_scale,
    canonicalize_fp8_,
    check_finite,
    one_tensor_scale,
    quantize_weight,
)
from kernelpick.kernels._quantize import CHUNK_ROWS
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = ["ONLINE_SCHEMES", "Fp8LinearMethod", "Fp8PtpcLinearMethod", "frozen"]

# Schemes whose scales can all be computed from the weights and the live activations.
# fp8_per_tensor_static needs activation scales calibrated on data, which only a
# pre-quantized checkpoint (checkpoint_format="fp8") can bring.
ONLINE_SCHEMES = (Scheme.FP8_PER_CHANNEL, Scheme.FP8_PER_TENSOR, Scheme.FP8_WEIGHT_ONLY)


def _positive_sizes(sizes: object) -> tuple[int, ...]:
    items = tuple(sizes) if isinstance(sizes, (list, tuple)) else ()
    if not items or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in items
    ):
        raise InvalidValueError(
            "output_partition_sizes", sizes, "a non-empty list of positive ints"
        )
    return items


def frozen(tensor: torch.Tensor) -> torch.nn.Parameter:
    """``tensor`` as a parameter that takes no gradient, as every quantized tensor is."""
    return torch.nn.Parameter(tensor, requires_grad=False)


class Fp8LinearMethod:
    """The FP8 linear method for one scheme, on one device, from one checkpoint format.

    ``caps`` is the device to select for (``kp.probe()`` when None); it may describe another
    device than the one the tensors live on, in which case selection answers for that device
    and running needs the real one. ``policy`` defaults to ``Policy.from_env(os.environ)``,
    so ``KERNELPICK_*`` variables reach engines. ``checkpoint_format`` says what the loaders
    receive: ``"high_precision"`` float weights, quantized after loading (one of
    ``ONLINE_SCHEMES``), or ``"fp8"`` weights already in the canonical layout (any scheme).
    """

    def __init__(
        self,
        scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        catalog: Catalog | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.scheme = Scheme.parse(scheme)
        self.checkpoint_format = CheckpointFormat.parse(checkpoint_format)
        online = self.checkpoint_format is CheckpointFormat.HIGH_PRECISION
        if online and self.scheme not in ONLINE_SCHEMES:
            valid = ", ".join(s.value for s in ONLINE_SCHEMES)
            raise InvalidValueError(
                "scheme", self.scheme.value,
                f"one of {valid}: {self.scheme.value} needs activation scales calibrated on "
                "data, which online quantization cannot compute; load them from a "
                "pre-quantized checkpoint with checkpoint_format='fp8'",
            )  # fmt: skip
        if not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows < 1:
            raise InvalidValueError("chunk_rows", chunk_rows, "a positive integer")
        if caps is None:
            from kernelpick import probe  # the facade's probe, shared with kp.probe's cache

            caps = probe()
        self.caps = caps
        self.catalog = catalog
        self.policy = Policy.from_env(os.environ, catalog) if policy is None else policy
        self.chunk_rows = chunk_rows

    # -- selection ---------------------------------------------------------------------

    def config(self, n: int, k: int, dtype: object, *, bias: bool = False) -> QuantConfig:
        """The layer's QuantConfig: ``dtype`` (a torch or kernelpick dtype) is in and out."""
        return quant_config(
            self.scheme, weight_shape=(n, k), out_dtype=Dtype.parse(dtype), bias=bias
        )

    def select(
        self, config: QuantConfig, layer: str = "", caps: DeviceCaps | None = None
    ) -> Selected:
        """The kernel for ``config`` on ``caps`` (the method's by default), or
        ``KernelSelectionError`` with every reason."""
        decision = choose(self.caps if caps is None else caps, config, self.policy, self.catalog)
        if isinstance(decision, Rejected):
            raise KernelSelectionError(self.scheme.value, decision, layer)
        return decision

    def state(self, config: QuantConfig, prefix: str, shards: Sequence[int]) -> LayerState:
        """A layer's state: its kernel selected, or ``KernelSelectionError``."""
        sizes = _positive_sizes(shards)
        return LayerState(config, self.select(config, prefix), self.caps, prefix, sizes)

    # -- the linear-method protocol ------------------------------------------------------

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: Sequence[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        *,
        prefix: str = "",
        weight_loader: WeightLoader | None = None,
        **extra_weight_attrs: object,
    ) -> None:
        """Select the kernel for this partition, then (only then) register its parameters.

        N is ``sum(output_partition_sizes)`` and K ``input_size_per_partition``. The online
        path registers ``weight [N, K]`` in ``params_dtype``; the pre-quantized path
        registers the canonical FP8 ``weight [N, K]``, ``weight_scale`` (``[N, 1]`` per
        channel; one per shard per tensor) and, for static schemes, ``input_scale`` (one
        per shard). Each carries its ``weight_loader``. On a rejection this raises
        ``KernelSelectionError`` and the layer gains nothing.
        """
        sizes = _positive_sizes(output_partition_sizes)
        config = self.config(sum(sizes), input_size_per_partition, params_dtype)
        state = self.state(config, prefix, sizes)
        n, k = config.weight_shape
        params: dict[str, tuple[torch.nn.Parameter, WeightLoader]] = {}
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            weight = frozen(torch.empty((n, k), dtype=params_dtype))
            params["weight"] = (weight, high_precision_loader(state, weight))
        else:
            weight = frozen(torch.empty((n, k), dtype=torch_dtype(CANONICAL_FP8)))
            params["weight"] = (weight, fp8_weight_loader(state, weight))
            per_tensor = config.weight_scale_shape == (1,)
            scale = frozen(torch.empty((len(sizes),) if per_tensor else (n, 1)))
            params["weight_scale"] = (scale, scale_loader(state, scale, "weight_scale", per_tensor))
            act = config.activation
            if act is not None and act.scale.static:
                static = frozen(torch.empty((len(sizes),)))
                params["input_scale"] = (static, scale_loader(state, static, "input_scale", True))
        for name, (param, loader) in params.items():
            own = loader if weight_loader is None else tracking(state, name, weight_loader)
            for key, value in {**extra_weight_attrs, "weight_loader": own}.items():
                setattr(param, key, value)
            layer.register_parameter(name, param)
        attach(layer, state)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Bring the loaded weights to the canonical layout and bind the kernel.

        Online: refuse NaN/Inf, then quantize per the scheme (fp32 amax, clamp floor,
        chunked rows) and free the high-precision copy. Pre-quantized: fused per-tensor
        shards with different scales are requantized to the largest (as engines do), and
        static input scales take the largest. Shards never loaded are an error. A second
        call does nothing.
        """
        state = layer_state(layer)
        if state.kernel is not None:
            return
        names = self._parameter_names(state.config)
        for name in names:
            loaded = state.loaded.get(name, set())
            missing = set(range(len(state.shards))) - loaded
            if ALL_SHARDS not in loaded and missing:
                raise InvalidValueError(
                    f"loaded shards of {state.name}.{name}", sorted(loaded),
                    f"every shard 0..{len(state.shards) - 1}; never loaded: {sorted(missing)}",
                )  # fmt: skip
        weight = layer.get_parameter("weight")
        kernel = self.bind(state, weight.device)
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            self.check_weight(state, weight)
            fp8, scale = quantize_weight(weight.data, state.config, chunk_rows=self.chunk_rows)
            self.install(layer, state, kernel, frozen(fp8), frozen(scale))
            return
        scales = layer.get_parameter("weight_scale")
        static = layer.get_parameter("input_scale") if "input_scale" in names else None
        for name, values in (("weight_scale", scales), ("input_scale", static)):
            if values is not None:  # whoever loaded them: an engine's loader checks nothing
                canonical_scale(f"{state.name}.{name}", values.detach(), tuple(values.shape))
        merge = state.config.weight_scale_shape == (1,)
        scale = frozen(scales.detach().amax().reshape(1)) if merge else scales
        if static is not None:
            static = frozen(static.detach().amax().reshape(1))
        kernel.prepare_weights(weight, scale, static)  # every check before the bytes change
        canonicalize_fp8_(f"{state.name}.weight", weight.data, self.chunk_rows)  # any loader's
        if merge:
            merged, _ = one_tensor_scale(
                weight.data, state.shards, scales.detach(), self.chunk_rows
            )
            weight = frozen(merged)
        self.install(layer, state, kernel, weight, scale, static)

    def _parameter_names(self, config: QuantConfig) -> tuple[str, ...]:
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            return ("weight",)
        static = config.activation is not None and config.activation.scale.static
        return ("weight", "weight_scale", "input_scale") if static else ("weight", "weight_scale")

    def check_weight(self, state: LayerState, weight: torch.Tensor) -> None:
        """The read-only checks on a high-precision weight: shape, dtype, finite values."""
        name = f"{state.name}.weight"
        n, k = state.config.weight_shape
        dtype = torch_dtype(state.config.input_dtype)
        check_tensor(name, weight)  # a meta or sparse weight has nothing to quantize
        if tuple(weight.shape) != (n, k) or weight.dtype != dtype:
            raise reject(name, weight, f"shape [{n}, {k}], dtype {state.config.input_dtype}")
        check_finite(name, weight, self.chunk_rows)

    def bind(self, state: LayerState, device: torch.device) -> Kernel:
        """The selected kernel bound to ``device``; fails when the caps name another platform."""
        return bind(state.decision.kernel, state.config, state.caps, device)

    def retarget(self, state: LayerState, dtype: Dtype, device: torch.device) -> LayerState:
        """A processed layer's state once it computes in ``dtype`` on ``device``: selected
        and bound again (for the probed device, when it moves) where either changes. Raises
        ``KernelSelectionError`` when no kernel fits; ``state`` itself never changes."""
        kernel = state.kernel
        if kernel is None:
            raise InvalidValueError("layer", state.name, "a layer whose weights were processed")
        if dtype is state.config.input_dtype and device == kernel.device:
            return state
        caps = state.caps
        if device != kernel.device:
            from kernelpick import probe

            caps = probe(device)
        config = attrs.evolve(state.config, input_dtype=dtype, out_dtype=dtype)
        decision = self.select(config, state.prefix, caps)
        moved = attrs.evolve(state, config=config, decision=decision, caps=caps)
        moved.kernel = bind(decision.kernel, config, caps, device)
        return moved

    def install(
        self,
        layer: torch.nn.Module,
        state: LayerState,
        kernel: Kernel,
        weight: torch.nn.Parameter,
        scale: torch.nn.Parameter,
        input_scale: torch.nn.Parameter | None = None,
    ) -> None:
        """Give ``layer`` its canonical parameters and its kernel, once the kernel has
        checked them (the parameters may be shared with a layer tied to this one)."""
        kernel.prepare_weights(weight, scale, input_scale)
        layer.weight = weight
        layer.weight_scale = scale
        if input_scale is not None:
            layer.input_scale = input_scale
        state.kernel = kernel
        attach(layer, state)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the selected kernel: ``x [..., K]`` -> ``[..., N]``."""
        state = layer_state(layer)
        kernel = state.kernel
        if kernel is None:
            raise InvalidValueError(
                "layer", state.name,
                "a layer whose weights were processed: call process_weights_after_loading first",
            )  # fmt: skip
        params = layer._parameters
        bundle = kernel.prepare_weights(
            layer.get_parameter("weight"), layer.get_parameter("weight_scale"),
            params.get("input_scale"),
        )  # fmt: skip
        return kernel.apply(x, bundle, bias)


class Fp8PtpcLinearMethod(Fp8LinearMethod):
    """The ``fp8_per_channel`` method: per-token dynamic activations, per-channel weights."""

    def __init__(
        self,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        catalog: Catalog | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        super().__init__(
            Scheme.FP8_PER_CHANNEL, caps, policy,
            checkpoint_format=checkpoint_format, catalog=catalog, chunk_rows=chunk_rows,
        )  # fmt: skip
