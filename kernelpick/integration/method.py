"""The online-FP8 linear method: select before allocating, load, quantize, run.

It follows the linear-method protocol inference engines use (``create_weights``,
``process_weights_after_loading``, ``apply``), so an engine can hand it its layers as they
are. ``Fp8PtpcLinearMethod`` is the ``fp8_per_channel`` (PTPC) method of design §1.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, cast

import attrs
import torch

from kernelpick.adapters.registry import bind
from kernelpick.core.decision import Rejected, Selected
from kernelpick.core.device import DeviceCaps
from kernelpick.core.dtypes import Dtype
from kernelpick.core.errors import InvalidValueError, KernelInputError
from kernelpick.core.policy import Policy
from kernelpick.core.quant import QuantConfig
from kernelpick.core.schemes import Scheme, scheme
from kernelpick.core.select import choose
from kernelpick.core.specs import Catalog
from kernelpick.integration.errors import KernelSelectionError
from kernelpick.kernels._torch import reject, torch_dtype
from kernelpick.kernels.base import Kernel, WeightBundle, weight_group
from kernelpick.kernels.quantize import CHUNK_ROWS, quantize_weight

__all__ = [
    "ONLINE_SCHEMES",
    "Fp8OnlineLinearMethod",
    "Fp8PtpcLinearMethod",
    "LayerState",
    "WeightLoader",
    "check_finite",
    "layer_state",
    "weight_loader_of",
]


class WeightLoader(Protocol):
    """``weight_loader(param, loaded_weight, shard_id=None)``, as engines call it."""

    def __call__(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None: ...


def weight_loader_of(param: torch.Tensor) -> WeightLoader:
    """The loader ``create_weights`` attached to ``param`` (engines read the attribute)."""
    loader = getattr(param, "weight_loader", None)
    if not callable(loader):
        raise InvalidValueError("param", tuple(param.shape), "a weight set up by create_weights")
    return cast(WeightLoader, loader)


# Schemes whose scales can all be computed from the weights and the live activations.
# fp8_per_tensor_static needs activation scales calibrated on data, which this cannot do.
ONLINE_SCHEMES = (Scheme.FP8_PER_CHANNEL, Scheme.FP8_PER_TENSOR, Scheme.FP8_WEIGHT_ONLY)
ALL_SHARDS = -1  # the loaded-shard marker for a whole-weight load
STATE = "kernelpick_state"


@attrs.define
class LayerState:
    """What the method keeps on a layer (``layer.kernelpick_state``) between its calls."""

    config: QuantConfig
    decision: Selected
    prefix: str
    shards: tuple[int, ...]
    loaded: set[int] = attrs.field(factory=set)
    kernel: Kernel | None = None


def layer_state(layer: torch.nn.Module) -> LayerState:
    """The method's state on ``layer``; an error if ``create_weights`` never ran on it."""
    state = layer.__dict__.get(STATE)
    if not isinstance(state, LayerState):
        raise InvalidValueError(
            "layer", type(layer).__name__, "a layer set up by create_weights (no kernelpick state)"
        )
    return state


def _positive_sizes(sizes: object) -> tuple[int, ...]:
    items = tuple(sizes) if isinstance(sizes, (list, tuple)) else ()
    if not items or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in items
    ):
        raise InvalidValueError(
            "output_partition_sizes", sizes, "a non-empty list of positive ints"
        )
    return items


def check_finite(name: str, weight: torch.Tensor, chunk_rows: int) -> None:
    """Refuse NaN or Inf. The scan is a min/max reduction per chunk of rows, which
    allocates nothing the size of the weight (NaN propagates through both, and an Inf is
    the max or the min); only a failure builds masks, to say where."""
    for start in range(0, weight.shape[0], chunk_rows):
        chunk = weight[start : start + chunk_rows]
        if chunk.numel() == 0:
            continue
        low, high = torch.aminmax(chunk)
        if not bool(torch.isfinite(low) & torch.isfinite(high)):
            nan = int(torch.isnan(chunk).sum())
            inf = int(torch.isinf(chunk).sum())
            row = start + int((~torch.isfinite(chunk)).any(dim=1).nonzero()[0])
            expected = (
                f"finite values; row {row} has NaN or Inf ({nan} NaN, {inf} Inf in its chunk)"
            )
            raise reject(name, weight, expected)


class Fp8OnlineLinearMethod:
    """Quantize a linear layer's weights to FP8 after loading, and run the chosen kernel.

    ``caps`` is the device to select for (``kp.probe()`` when None); it may describe another
    device than the one the tensors live on, in which case selection answers for that device
    and running needs the real one. ``policy`` defaults to ``Policy.from_env(os.environ)``,
    so ``KERNELPICK_*`` variables reach engines. ``scheme`` is one of ``ONLINE_SCHEMES``.
    """

    def __init__(
        self,
        scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        catalog: Catalog | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.scheme = Scheme.parse(scheme)
        if self.scheme not in ONLINE_SCHEMES:
            valid = ", ".join(s.value for s in ONLINE_SCHEMES)
            raise InvalidValueError(
                "scheme", self.scheme.value,
                f"one of {valid}: {self.scheme.value} needs activation scales calibrated on "
                "data, which online quantization cannot compute",
            )  # fmt: skip
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
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
        return scheme(self.scheme, weight_shape=(n, k), out_dtype=Dtype.parse(dtype), bias=bias)

    def select(self, config: QuantConfig, layer: str = "") -> Selected:
        """The kernel for ``config``, or ``KernelSelectionError`` with every reason."""
        decision = choose(self.caps, config, self.policy, self.catalog)
        if isinstance(decision, Rejected):
            raise KernelSelectionError(self.scheme.value, decision, layer)
        return decision

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
        """Select the kernel for this partition, then (only then) register ``weight [N, K]``.

        N is ``sum(output_partition_sizes)`` and K ``input_size_per_partition``. On a
        rejection this raises ``KernelSelectionError`` and the layer gains nothing.
        """
        sizes = _positive_sizes(output_partition_sizes)
        config = self.config(sum(sizes), input_size_per_partition, params_dtype)
        decision = self.select(config, prefix)
        weight = torch.nn.Parameter(
            torch.empty(config.weight_shape, dtype=params_dtype), requires_grad=False
        )
        state = LayerState(config, decision, prefix, sizes)
        loader = weight_loader or self._loader(state)
        for key, value in {**extra_weight_attrs, "weight_loader": loader}.items():
            setattr(weight, key, value)
        layer.register_parameter("weight", weight)
        self.attach(layer, state)

    def attach(self, layer: torch.nn.Module, state: LayerState) -> None:
        """Record the method's state, and the decision for people to read, on ``layer``."""
        layer.__dict__[STATE] = state
        layer.__dict__["kernelpick_decision"] = state.decision

    def _loader(self, state: LayerState) -> WeightLoader:
        sizes, prefix, width = state.shards, state.prefix, state.config.k

        def weight_loader(
            param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
        ) -> None:
            """Copy a checkpoint tensor into ``param``: whole, or shard ``shard_id`` of the
            fused output partitions (q, k, v or gate, up)."""
            name = f"{prefix or 'layer'}.weight" + (
                "" if shard_id is None else f"[shard {shard_id}]"
            )
            if shard_id is None:
                start, rows = 0, sum(sizes)
            elif (
                isinstance(shard_id, int)
                and not isinstance(shard_id, bool)
                and 0 <= shard_id < len(sizes)
            ):
                start, rows = sum(sizes[:shard_id]), sizes[shard_id]
            else:
                raise InvalidValueError("shard_id", shard_id, f"None or 0..{len(sizes) - 1}")
            if not isinstance(loaded_weight, torch.Tensor):
                kind = type(loaded_weight).__name__
                raise KernelInputError(name, (), kind, "-", "a floating-point tensor")
            if not loaded_weight.is_floating_point() or loaded_weight.is_complex():
                raise reject(name, loaded_weight, "a real floating-point dtype")
            if loaded_weight.is_meta:
                raise reject(name, loaded_weight, "a tensor with data (not on the meta device)")
            if tuple(loaded_weight.shape) != (rows, width):
                raise reject(name, loaded_weight, f"shape [{rows}, {width}]")
            with torch.no_grad():
                param[start : start + rows].copy_(loaded_weight)
            state.loaded.add(ALL_SHARDS if shard_id is None else shard_id)

        return weight_loader

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Quantize the loaded weight online (design §5) into the kernel's layout and free the
        high-precision copy. Calling it again does nothing."""
        state = layer_state(layer)
        if state.kernel is not None:
            return
        missing = set(range(len(state.shards))) - state.loaded
        if ALL_SHARDS not in state.loaded and missing:
            raise InvalidValueError(
                f"loaded shards of {state.prefix or 'the layer'}", sorted(state.loaded),
                f"every shard 0..{len(state.shards) - 1}; never loaded: {sorted(missing)}",
            )  # fmt: skip
        weight = layer.get_parameter("weight")
        self.check_weight(state, weight)
        self.install(layer, state, self.bind(state, weight.device), weight.data)

    def check_weight(self, state: LayerState, weight: torch.Tensor) -> None:
        """The read-only checks on a high-precision weight: shape, dtype, finite values."""
        name = f"{state.prefix or 'layer'}.weight"
        n, k = state.config.weight_shape
        dtype = torch_dtype(state.config.input_dtype)
        if tuple(weight.shape) != (n, k) or weight.dtype != dtype:
            raise reject(name, weight, f"shape [{n}, {k}], dtype {state.config.input_dtype}")
        check_finite(name, weight, self.chunk_rows)

    def bind(self, state: LayerState, device: torch.device) -> Kernel:
        """The selected kernel bound to ``device``; fails when the caps name another platform."""
        return bind(state.decision.kernel, state.config, self.caps, device)

    def install(
        self, layer: torch.nn.Module, state: LayerState, kernel: Kernel, weight: torch.Tensor
    ) -> None:
        """Quantize a checked ``weight [N, K]`` into ``layer.weight`` (FP8, in the kernel's
        layout) and ``layer.weight_scale``, a chunk of rows at a time."""
        group = weight_group(state.config)
        fp8, scale = quantize_weight(
            weight, group, self.caps.fp8_format, chunk_rows=self.chunk_rows
        )
        bundle = kernel.prepare_weights(fp8, scale)
        layer.weight = torch.nn.Parameter(bundle.weight, requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(bundle.scale, requires_grad=False)
        state.kernel = kernel
        self.attach(layer, state)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the selected kernel: ``x [..., K]`` -> ``[..., N]``."""
        kernel = layer_state(layer).kernel
        if kernel is None:
            raise InvalidValueError(
                "layer", layer_state(layer).prefix or type(layer).__name__,
                "a layer whose weights were processed: call process_weights_after_loading first",
            )  # fmt: skip
        bundle = WeightBundle(layer.get_parameter("weight"), layer.get_parameter("weight_scale"))
        return kernel.apply(x, bundle, bias)


class Fp8PtpcLinearMethod(Fp8OnlineLinearMethod):
    """The ``fp8_per_channel`` method: per-token dynamic activations, per-channel weights."""

    def __init__(
        self,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        catalog: Catalog | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        super().__init__(
            Scheme.FP8_PER_CHANNEL, caps, policy, catalog=catalog, chunk_rows=chunk_rows
        )
