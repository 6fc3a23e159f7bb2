"""The quantized linear method: select before allocating, load, quantize, run.

It follows the linear-method protocol inference engines use (``create_weights``,
``process_weights_after_loading``, ``apply``), so an engine can hand it its layers as they
are. ``Fp8PtpcLinearMethod`` is the ``fp8_per_channel`` (PTPC) method: per-token dynamic
activations, per-channel static weights; ``Fp8LinearMethod`` takes any scheme the
integration runs (FP8 per channel, per tensor, per block, weight-only, and int8 per
channel). Whatever the kernel, a processed layer holds its weights in the canonical layout
(see ``kernelpick.kernels.quantize_weight``); the kernel's own layout is derived from them
on each call and never stored. Each step of a layer (select, check, bind, quantize,
install, run) is in ``_layer_steps``, shared with ``quantize_model``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._policy import Policy
from kernelpick.core._quant import QuantConfig
from kernelpick.core._schemes import Scheme
from kernelpick.core._specs import Catalog
from kernelpick.integration.layer._loaders import EngineLoader, loader_for, param_dims
from kernelpick.integration.layer._parallel import AmaxExchange, TensorParallel, check_split_blocks
from kernelpick.integration.layer._shards import check_shards, per_tensor, scale_shape
from kernelpick.integration.layer._state import (
    ALL_SHARDS,
    CheckpointFormat,
    CheckpointShape,
    LayerState,
    attach,
    layer_state,
    positive_sizes,
)
from kernelpick.integration.layer._steps import (
    ONLINE_SCHEMES,
    LayerSteps,
    check_allocatable,
    frozen,
    install,
    run,
)
from kernelpick.kernels import Launch
from kernelpick.kernels._canonical import (
    CANONICAL_FP8,
    canonical_dtype,
    canonical_scale,
    canonicalize_fp8_,
    one_tensor_scale,
)
from kernelpick.kernels._quantize import CHUNK_ROWS
from kernelpick.kernels._torch import torch_dtype

__all__ = ["ONLINE_SCHEMES", "Fp8LinearMethod", "Fp8PtpcLinearMethod"]


class Fp8LinearMethod:
    """The quantized linear method for one scheme, on one device, from one checkpoint format.

    ``caps`` is the device to select for (``kp.probe()`` when None); it may describe another
    device than the one the tensors live on, in which case selection answers for that device
    and running needs the real one. ``policy`` defaults to ``Policy.from_env(os.environ)``,
    so ``KERNELPICK_*`` variables reach engines. ``checkpoint_format`` says what the loaders
    receive: ``"high_precision"`` float weights, quantized after loading (one of
    ``ONLINE_SCHEMES``), or ``"pre_quantized"`` (also spelled ``"fp8"``) weights already in
    the canonical layout, FP8 or int8 (any scheme but ``mxfp8``). ``block_size`` is
    ``fp8_block``'s (None: 128).
    ``tensor_parallel`` makes the layers this method creates one rank's shards of
    column- or row-parallel layers (see ``TensorParallel``): their loaders narrow the
    whole checkpoint tensors to the rank's part, and their weight scales are the whole
    layer's. A kernel of the engine's own is selected from ``catalog`` and run through its row in
    ``launches`` (both default to kernelpick's; see ``kernelpick.kernels.bind``); a catalog
    id without a row raises ``UnknownNameError`` here, before any layer is made.
    """

    def __init__(
        self,
        scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        catalog: Catalog | None = None,
        launches: Mapping[str, Launch] | None = None,
        chunk_rows: int = CHUNK_ROWS,
        block_size: int | None = None,
        tensor_parallel: TensorParallel | None = None,
    ) -> None:
        scheme = Scheme.parse(scheme)  # named first, as it is the first argument
        self._checkpoint_format = CheckpointFormat.parse(checkpoint_format)
        if tensor_parallel is not None and not isinstance(tensor_parallel, TensorParallel):
            expected = "None or a kernelpick.integration.TensorParallel (TensorParallel.of)"
            raise InvalidValueError("tensor_parallel", type(tensor_parallel).__name__, expected)
        self._parallel = tensor_parallel
        online = self._checkpoint_format is CheckpointFormat.HIGH_PRECISION
        self._steps = LayerSteps.create(
            scheme, caps, policy, online=online, catalog=catalog, launches=launches,
            chunk_rows=chunk_rows, block_size=block_size,
        )  # fmt: skip

    # Read-only: the layers this method made keep the steps it had, so a setting changed
    # afterwards would reach some layers and not others.

    @property
    def checkpoint_format(self) -> CheckpointFormat:
        """What the loaders receive: high-precision weights, or quantized ones."""
        return self._checkpoint_format

    @property
    def block_size(self) -> int | None:
        """``fp8_block``'s block size, when given (None: the scheme's 128)."""
        return self._steps.block_size

    @property
    def tensor_parallel(self) -> TensorParallel | None:
        """This method's layers' place in a tensor-parallel group; None for whole layers."""
        return self._parallel

    @property
    def scheme(self) -> Scheme:
        return self._steps.scheme

    @property
    def caps(self) -> DeviceCaps:
        """The device kernels are selected for."""
        return self._steps.caps

    @property
    def policy(self) -> Policy:
        return self._steps.policy

    @property
    def catalog(self) -> Catalog | None:
        return self._steps.catalog

    @property
    def launches(self) -> Mapping[str, Launch] | None:
        return self._steps.launches

    @property
    def chunk_rows(self) -> int:
        """Rows quantized at a time: the extra memory is this many rows in fp32."""
        return self._steps.chunk_rows

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
        weight_loader: EngineLoader | None = None,
        checkpoint_shards: Sequence[int] | None = None,
        **extra_weight_attrs: object,
    ) -> None:
        """Select the kernel for this partition, then (only then) register its parameters.

        N is ``sum(output_partition_sizes)`` and K ``input_size_per_partition``: this
        rank's part of a tensor-parallel layer, whose whole ``input_size`` (row-parallel)
        or ``output_size`` (column-parallel) must be the part's times the world size. The online
        path registers ``weight [N, K]`` in ``params_dtype``; the pre-quantized path
        registers the canonical ``weight [N, K]`` (FP8, or int8 for an int8 scheme),
        ``weight_scale`` (``[N, 1]`` per channel; ``[ceil(N/b), ceil(K/b)]`` per block; one
        per shard per tensor) and, for static schemes, ``input_scale`` (one per shard).
        Each carries its ``weight_loader`` and, where it has them, the ``output_dim`` and
        ``input_dim`` engines narrow it by. On a rejection this raises
        ``KernelSelectionError`` (naming the rank of a tensor-parallel shard), and on
        fused block shards that would share a block of scales, a partition the group
        could not have made, or a shape too large to allocate, ``InvalidValueError``;
        either way the layer gains nothing.

        ``weight_loader`` is an engine's own loader, called in place of kernelpick's after
        each tensor passed kernelpick's checks. It is handed the whole checkpoint tensor
        and narrows it itself, so the checks read the whole layer's shape: K is
        ``input_size``, and each shard's rows are ``checkpoint_shards`` or, when None,
        ``output_partition_sizes`` times ``output_size / sum(output_partition_sizes)`` (a
        column-parallel split of every shard alike). An engine that replicates a shard
        (vLLM's KV heads beyond the KV head count) passes ``checkpoint_shards``.
        """
        steps, tp = self._steps, self._parallel
        sizes = positive_sizes(output_partition_sizes)
        config = steps.config(sum(sizes), input_size_per_partition, params_dtype)
        pre_quantized = self.checkpoint_format is CheckpointFormat.PRE_QUANTIZED
        if tp is not None:
            tp.check_partition(config, sizes, input_size, output_size, prefix or "layer")
            if dist.is_available() and dist.is_initialized():
                tp.check_group()  # a rank or size the group disagrees with loads another part
            elif tp.reduces(config) and not pre_quantized:
                tp.check_group()  # raises: its amax is all-reduced, so the group must be up
        if pre_quantized:  # before selecting: a layer it refuses logs no kernel
            check_shards(config, sizes, prefix or "layer")
        engine = None
        if weight_loader is not None:
            whole = CheckpointShape.of_engine(sizes, input_size, output_size, checkpoint_shards)
            if tp is None:  # the engine splits the layer itself (tp checked its own split)
                split = [part for part, rows in zip(sizes, whole.shards, strict=True)
                         if part != rows]  # fmt: skip
                check_split_blocks(config, split, whole.k != config.k, prefix or "layer")
            engine = (weight_loader, whole)
        stored = torch_dtype(canonical_dtype(config)) if pre_quantized else params_dtype
        shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]
        shapes = {"weight": (config.weight_shape, stored)}
        if pre_quantized:
            shapes["weight_scale"] = (scale_shape(config, sizes), torch.float32)
            act = config.activation
            if act is not None and act.scale.static:
                shapes["input_scale"] = ((len(sizes),), torch.float32)
        for shape, dtype in shapes.values():
            check_allocatable(prefix or "layer", shape, dtype)
        state = steps.state(config, prefix, sizes, tp)
        params = {name: frozen(torch.empty(shape, dtype=dtype))
                  for name, (shape, dtype) in shapes.items()}  # fmt: skip
        for name, param in params.items():
            own = loader_for(state, param, name, pre_quantized=pre_quantized, engine=engine)
            attributes = {**param_dims(config, name), **extra_weight_attrs, "weight_loader": own}
            for key, value in attributes.items():
                setattr(param, key, value)
            layer.register_parameter(name, param)
        attach(layer, state)
        # Logged now, at selection, not once the weights are processed: an engine builds
        # every layer before loading any weight, and this is when it wants to know the
        # kernel; what goes wrong later is raised to it by process_weights_after_loading.
        steps.log(state)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Bring the loaded weights to the canonical layout and bind the kernel.

        Online: refuse NaN/Inf, then quantize per the scheme (fp32 amax, clamp floor,
        chunked rows) and free the high-precision copy. Pre-quantized: fused per-tensor
        shards with different scales are requantized to the largest (as engines do), and
        static input scales take the largest; per-channel and block scales stay as loaded.
        Shards never loaded are an error. A second call does nothing.

        A tensor-parallel shard whose scale groups span the split dimension all-reduces
        their amax with its peers here, so every rank must process the same layers in the
        same order. A rank that fails before that still joins the all-reduce, so its peers
        raise ``TensorParallelError`` naming it at once; a peer that never answers within
        the timeout is ``TensorParallelError`` too.
        """
        state = layer_state(layer)
        if state.kernel is not None:
            return
        weight = layer.get_parameter("weight")
        steps = self._steps
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            reduce = _amax_exchange(state, weight.device)
            try:
                self._check_loaded(state)
                kernel = steps.bind(state, weight.device)
                steps.check_weight(state, weight)
                quantized = steps.quantize(state, weight, reduce)
            except Exception:
                if reduce is not None and not reduce.sent:
                    reduce.fail()  # tell the peers, then raise this rank's own error
                raise
            install(layer, state, kernel, *quantized)
            return
        self._check_loaded(state)
        kernel = steps.bind(state, weight.device)
        scales = layer.get_parameter("weight_scale")
        names = self._parameter_names(state.config)
        static = layer.get_parameter("input_scale") if "input_scale" in names else None
        for name, values in (("weight_scale", scales), ("input_scale", static)):
            if values is not None:  # whoever loaded them: an engine's loader checks nothing
                canonical_scale(state.label(name), values.detach(), tuple(values.shape))
        merge = per_tensor(state.config)
        scale = frozen(scales.detach().amax().reshape(1)) if merge else scales
        if static is not None:
            static = frozen(static.detach().amax().reshape(1))
        kernel.prepare_weights(weight, scale, static)  # every check before the bytes change
        if weight.dtype == torch_dtype(CANONICAL_FP8):  # any loader's bytes; int8 has no NaN
            canonicalize_fp8_(state.label("weight"), weight.data, self.chunk_rows)
        if merge:
            merged, _ = one_tensor_scale(
                weight.data, state.shards, scales.detach(), self.chunk_rows
            )
            weight = frozen(merged)
        install(layer, state, kernel, weight, scale, static)

    def _check_loaded(self, state: LayerState) -> None:
        """Refuse a layer with a shard of a parameter never loaded."""
        for name in self._parameter_names(state.config):
            loaded = state.loaded.get(name, set())
            missing = set(range(len(state.shards))) - loaded
            if ALL_SHARDS not in loaded and missing:
                raise InvalidValueError(
                    f"loaded shards of {state.label(name)}", sorted(loaded),
                    f"every shard 0..{len(state.shards) - 1}; never loaded: {sorted(missing)}",
                )  # fmt: skip

    def _parameter_names(self, config: QuantConfig) -> tuple[str, ...]:
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            return ("weight",)
        static = config.activation is not None and config.activation.scale.static
        return ("weight", "weight_scale", "input_scale") if static else ("weight", "weight_scale")

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the selected kernel: ``x [..., K]`` -> ``[..., N]``."""
        return run(layer, x, bias)


class Fp8PtpcLinearMethod(Fp8LinearMethod):
    """The ``fp8_per_channel`` method: per-token dynamic activations, per-channel weights."""

    def __init__(
        self,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        *,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        catalog: Catalog | None = None,
        launches: Mapping[str, Launch] | None = None,
        chunk_rows: int = CHUNK_ROWS,
        tensor_parallel: TensorParallel | None = None,
    ) -> None:
        super().__init__(
            Scheme.FP8_PER_CHANNEL, caps, policy, checkpoint_format=checkpoint_format,
            catalog=catalog, launches=launches, chunk_rows=chunk_rows,
            tensor_parallel=tensor_parallel,
        )  # fmt: skip


def _amax_exchange(state: LayerState, device: torch.device) -> AmaxExchange | None:
    """The all-reduce of a tensor-parallel shard's weight amax, where its scale groups span
    the split dimension; None where each rank's scales are its own."""
    tp = state.parallel
    if tp is None or not tp.reduces(state.config):
        return None
    return AmaxExchange(tp, state.name, state.config, device)
