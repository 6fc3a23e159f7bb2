"""The quantized linear method: the linear-method protocol inference engines use
(``create_weights``, ``process_weights_after_loading``, ``apply``) over one layer's
lifecycle, so an engine can hand it its layers as they are.

``create_weights`` plans (selects before allocating) and allocates (``_allocate``);
``process_weights_after_loading`` accepts the loaded tensors and installs them with the
bound kernel, which prepares what it runs on once (``_process``); ``apply`` runs it.
``QuantizedLinearMethod`` takes every scheme (FP8 per channel, per tensor, static per
tensor, per block, weight-only, MXFP8, int8 per channel); ``Fp8PtpcLinearMethod`` is the
``fp8_per_channel`` (PTPC) one. A processed layer holds its weights in the canonical layout
(see ``kernelpick.kernels.quantize_canonical``), whatever the kernel.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch

from kernelpick.core import Catalog, DeviceCaps, InvalidValueError, Policy, Scheme
from kernelpick.integration.layer._allocate import ParameterFactory, allocate
from kernelpick.integration.layer._loaders import EngineLoader
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.integration.layer._prepare import run
from kernelpick.integration.layer._process import process
from kernelpick.integration.layer._recipe import CheckpointFormat, Recipe
from kernelpick.integration.layer._steps import LayerSteps
from kernelpick.kernels import CHUNK_ROWS, Launch

__all__ = ["Fp8PtpcLinearMethod", "QuantizedLinearMethod"]


class QuantizedLinearMethod:
    """The quantized linear method for one scheme, on one device, from one checkpoint format.

    ``caps`` is the device to select for (``kp.probe()`` when None); it may describe another
    device than the one the tensors live on, in which case selection answers for that device
    and running needs the real one. ``policy`` defaults to ``Policy.from_env(os.environ)``,
    so ``KERNELPICK_*`` variables reach engines. ``checkpoint_format`` says what the loaders
    receive: ``"high_precision"`` float weights, quantized after loading (one of
    ``ONLINE_SCHEMES``), or ``"pre_quantized"`` (also spelled ``"fp8"``) weights already in
    the canonical layout (FP8 with fp32 or E8M0 scales, or int8), or for the integer
    weight-only schemes compressed-tensors' pack-quantized tensors (``weight_packed``,
    ``weight_scale``, ``weight_zero_point`` where asymmetric, ``weight_g_idx`` where
    act-order). ``block_size`` is ``fp8_block``'s (None: 128); ``group_size``,
    ``symmetric`` and ``act_order`` the integer schemes' (see ``kp.quant_config``).
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
        group_size: int | None = None,
        symmetric: bool = True,
        act_order: bool = False,
    ) -> None:
        recipe = Recipe.of(
            scheme, checkpoint_format=checkpoint_format, block_size=block_size,
            group_size=group_size, symmetric=symmetric, act_order=act_order,
        )  # fmt: skip
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
        allocate(
            self._steps, self._parallel, layer, input_size_per_partition,
            output_partition_sizes, input_size, output_size, params_dtype, prefix=prefix,
            weight_loader=weight_loader, checkpoint_shards=checkpoint_shards,
            parameter=parameter, extra_weight_attrs=dict(extra_weight_attrs),
        )  # fmt: skip

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Accept the loaded weights into the canonical layout, bind the kernel and let it
        prepare what it runs on (once: ``apply`` runs on that).

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
        process(self._steps, layer)

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


def _checked_parallel(tensor_parallel: object) -> TensorParallel | None:
    if tensor_parallel is not None and not isinstance(tensor_parallel, TensorParallel):
        expected = "None or a kernelpick.integration.TensorParallel (TensorParallel.of)"
        raise InvalidValueError("tensor_parallel", type(tensor_parallel).__name__, expected)
    return tensor_parallel
