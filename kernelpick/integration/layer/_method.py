"""The quantized linear method: select before allocating, load, quantize, run.

It follows the linear-method protocol inference engines use (``create_weights``,
``process_weights_after_loading``, ``apply``), so an engine can hand it its layers as they
are. ``Fp8PtpcLinearMethod`` is the ``fp8_per_channel`` (PTPC) method: per-token dynamic
activations, per-channel static weights; ``QuantizedLinearMethod`` takes any scheme the
integration runs (FP8 per channel, per tensor, per block, weight-only, and int8 per
channel). Whatever the kernel, a processed layer holds its weights in the canonical layout
(see ``kernelpick.kernels.quantize_canonical``); the kernel's own layout is derived from them
on each call and never stored. Each step of a layer (select, check, bind, quantize,
install, run) is in ``_layer_steps``, shared with ``quantize_model``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch
import torch.distributed as dist

from kernelpick.core import Catalog, DeviceCaps, InvalidValueError, Policy, Scheme
from kernelpick.integration.layer._accept import accept, accept_float
from kernelpick.integration.layer._loaders import EngineLoader, WeightLoader, loader_for
from kernelpick.integration.layer._parallel import AmaxExchange, TensorParallel, check_split_blocks
from kernelpick.integration.layer._plan import Param
from kernelpick.integration.layer._recipe import CheckpointFormat, Recipe
from kernelpick.integration.layer._shards import check_shards
from kernelpick.integration.layer._state import (
    ALL_SHARDS,
    CheckpointShape,
    LayerState,
    attach,
    layer_state,
    positive_sizes,
)
from kernelpick.integration.layer._steps import LayerSteps, frozen, install, run
from kernelpick.kernels import CHUNK_ROWS, Launch

__all__ = ["Fp8PtpcLinearMethod", "ParameterFactory", "QuantizedLinearMethod"]

# An engine's parameter class for a planned parameter: (what to register, its storage, the
# checking loader it must carry) -> the parameter, over that storage.
ParameterFactory = Callable[[Param, torch.Tensor, WeightLoader], torch.nn.Parameter]


class QuantizedLinearMethod:
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
        recipe = Recipe.of(scheme, checkpoint_format=checkpoint_format, block_size=block_size)
        self._steps = LayerSteps.create(
            recipe, caps, policy, catalog=catalog, launches=launches, chunk_rows=chunk_rows
        )
        self._parallel = _checked_parallel(tensor_parallel)

    @classmethod
    def of(
        cls, steps: LayerSteps, tensor_parallel: TensorParallel | None = None
    ) -> QuantizedLinearMethod:
        """The method for ``steps`` (a recipe already checked, a device already probed), for
        layers at ``tensor_parallel``'s place. An engine makes its steps once per config and
        a method from them per layer kind: nothing is probed or read again."""
        method = cls.__new__(cls)
        method._steps = steps
        method._parallel = _checked_parallel(tensor_parallel)
        return method

    def with_tensor_parallel(self, tensor_parallel: TensorParallel | None) -> QuantizedLinearMethod:
        """This method (the same steps) for layers at ``tensor_parallel``'s place."""
        method = copy.copy(self)
        method._parallel = _checked_parallel(tensor_parallel)
        return method

    # Read-only: the layers this method made keep the steps it had, so a setting changed
    # afterwards would reach some layers and not others.

    @property
    def recipe(self) -> Recipe:
        """The scheme, block size and checkpoint format every layer is made with."""
        return self._steps.recipe

    @property
    def steps(self) -> LayerSteps:
        return self._steps

    @property
    def checkpoint_format(self) -> CheckpointFormat:
        """What the loaders receive: high-precision weights, or quantized ones."""
        return self._steps.recipe.checkpoint_format

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
        parameter: ParameterFactory | None = None,
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
        (vLLM's KV heads beyond the KV head count) passes ``checkpoint_shards``. With an
        engine's loader the method's ``tensor_parallel`` only agrees the scale groups that
        span the split (``TensorParallel.reduces`` of this layer's config); the engine
        narrows every tensor. ``parameter`` (with ``weight_loader`` only) makes each
        parameter as the engine's own class, over the storage it is handed and carrying the
        checking loader, so each is registered once.
        """
        steps, tp = self._steps, self._parallel
        sizes = positive_sizes(output_partition_sizes)
        config = steps.config(sum(sizes), input_size_per_partition, params_dtype)
        pre_quantized = self.checkpoint_format is CheckpointFormat.PRE_QUANTIZED
        if weight_loader is not None and tp is not None and not tp.reduces(config):
            # The engine narrows every tensor itself; kernelpick's part in the split is only
            # agreeing scale groups that span it, which this layer's do not.
            tp = None
        if tp is not None:
            tp.check_partition(config, sizes, input_size, output_size, prefix or "layer")
            if dist.is_available() and dist.is_initialized():
                tp.check_group()  # a rank or size the group disagrees with loads another part
            elif tp.reduces(config) and not pre_quantized:
                tp.check_group()  # raises: its amax is all-reduced, so the group must be up
        if pre_quantized:  # before selecting: a layer it refuses logs no kernel
            check_shards(config, sizes, prefix or "layer")
        engine: tuple[EngineLoader, CheckpointShape] | None = None
        if weight_loader is not None:
            whole = CheckpointShape.of_engine(sizes, input_size, output_size, checkpoint_shards)
            if tp is None:  # the engine splits the layer itself (tp checked its own split)
                split = [part for part, rows in zip(sizes, whole.shards, strict=True)
                         if part != rows]  # fmt: skip
                check_split_blocks(config, split, whole.k != config.k, prefix or "layer")
            engine = (weight_loader, whole)
        if parameter is not None and engine is None:
            raise InvalidValueError(
                "parameter", "a factory without weight_loader",
                "a factory only with an engine's weight_loader: kernelpick's own loaders "
                "load the parameters they make",
            )  # fmt: skip
        plan = steps.plan(config, sizes, params_dtype, prefix, parallel=tp)
        state = LayerState(plan)
        for spec in plan.params:
            data = torch.empty(spec.shape, dtype=spec.dtype)
            if parameter is None:
                param = frozen(data)
                own = loader_for(
                    state, param, spec.name, pre_quantized=pre_quantized, engine=engine
                )
                extra = {**spec.dims, **extra_weight_attrs, "weight_loader": own}
            else:  # the engine's class, made once, with the dims and the checking loader
                own = loader_for(state, data, spec.name, pre_quantized=pre_quantized, engine=engine)
                param, extra = parameter(spec, data, own), dict(extra_weight_attrs)
                if param.data_ptr() != data.data_ptr():
                    raise InvalidValueError(
                        "parameter", type(param).__name__,
                        "a factory returning a parameter over the data it was handed",
                    )  # fmt: skip
            for key, value in extra.items():
                setattr(param, key, value)
            layer.register_parameter(spec.name, param)
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
        if state.processed:
            return
        weight = layer.get_parameter("weight")
        steps = self._steps
        if self.checkpoint_format is CheckpointFormat.HIGH_PRECISION:
            reduce = _amax_exchange(state, weight.device)
            try:
                self._check_loaded(state)
                kernel = steps.bind(state, weight.device)
                weights = accept_float(
                    state.config, state.label, weight, chunk_rows=steps.chunk_rows,
                    reduce_amax=reduce,
                )  # fmt: skip
            except Exception:
                if reduce is not None and not reduce.sent:
                    reduce.fail()  # tell the peers, then raise this rank's own error
                raise
            install(layer, state, kernel, weights)
            return
        self._check_loaded(state)
        kernel = steps.bind(state, weight.device)
        names = state.plan.names
        static = layer.get_parameter("input_scale") if "input_scale" in names else None
        weights = accept(  # whoever loaded them: an engine's loader checks nothing
            state.config, state.label, weight.data, layer.get_parameter("weight_scale").detach(),
            None if static is None else static.detach(), shards=state.shards, owned=True,
            chunk_rows=steps.chunk_rows,
        )  # fmt: skip
        if weights.weight is weight.data:
            weights = attrs.evolve(weights, weight=weight)  # the registered parameter, kept
        install(layer, state, kernel, weights)

    def _check_loaded(self, state: LayerState) -> None:
        """Refuse a layer with a shard of a parameter never loaded."""
        for name in state.plan.names:
            loaded = state.loaded.get(name, set())
            missing = set(range(len(state.shards))) - loaded
            if ALL_SHARDS not in loaded and missing:
                raise InvalidValueError(
                    f"loaded shards of {state.label(name)}", sorted(loaded),
                    f"every shard 0..{len(state.shards) - 1}; never loaded: {sorted(missing)}",
                )  # fmt: skip

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the selected kernel: ``x [..., K]`` -> ``[..., N]``."""
        return run(layer, x, bias)


class Fp8PtpcLinearMethod(QuantizedLinearMethod):
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


def _checked_parallel(tensor_parallel: object) -> TensorParallel | None:
    if tensor_parallel is not None and not isinstance(tensor_parallel, TensorParallel):
        expected = "None or a kernelpick.integration.TensorParallel (TensorParallel.of)"
        raise InvalidValueError("tensor_parallel", type(tensor_parallel).__name__, expected)
    return tensor_parallel
