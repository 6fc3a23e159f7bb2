"""The steps that make one linear a quantized layer (FP8 or int8): select, check, bind,
quantize, install, run.

The linear method (an engine's layers), ``quantize_model`` and ``load_quantized`` all make
their layers with these, so a layer is made the same way whichever path made it. The
selection happens before any weight is allocated; the checks read and never write; a layer
is given its parameters and kernel (``install``) only once the kernel has checked them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import attrs
import torch

from kernelpick.adapters import default_caps
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
from kernelpick.integration._log import log_selection
from kernelpick.integration.layer._loaders import closed_loader
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.integration.layer._state import LayerState, attach, layer_state, positive_sizes
from kernelpick.kernels import Launch, bind
from kernelpick.kernels._base import Kernel
from kernelpick.kernels._canonical import check_finite, quantize_weight
from kernelpick.kernels._launch import check_rows, launch_table
from kernelpick.kernels._quantize import CHUNK_ROWS, AmaxReduce
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype

__all__ = [
    "ONLINE_SCHEMES",
    "LayerSteps",
    "check_allocatable",
    "frozen",
    "install",
    "run",
]

# Schemes whose scales can all be computed from the weights and the live activations.
# fp8_per_tensor_static needs activation scales calibrated on data, which only a
# pre-quantized checkpoint (checkpoint_format="pre_quantized") can bring.
ONLINE_SCHEMES = (
    Scheme.FP8_PER_CHANNEL,
    Scheme.FP8_PER_TENSOR,
    Scheme.FP8_WEIGHT_ONLY,
    Scheme.FP8_BLOCK,
    Scheme.INT8_PER_CHANNEL,
)
# Schemes the integration does not make layers for: mxfp8's E8M0 scales have no loader,
# checkpoint format or cast rule here yet (its kernels run through kernelpick.kernels).
_NOT_INTEGRATED = (Scheme.MXFP8,)


# torch sizes a tensor's storage in signed 64-bit bytes: a larger one cannot be made, and
# torch.empty says only "Storage size calculation overflowed".
_MAX_BYTES = 2**63 - 1


def check_allocatable(layer: str, shape: Sequence[int], dtype: torch.dtype) -> None:
    """Refuse a parameter whose bytes overflow what torch can size, before allocating."""
    needed = math.prod(shape) * dtype.itemsize
    if needed > _MAX_BYTES:
        raise InvalidValueError(
            f"parameter shape of {layer}", list(shape),
            f"at most 2**63 - 1 bytes of {str(dtype).removeprefix('torch.')}, which torch can "
            f"size; this one needs {needed} bytes",
        )  # fmt: skip


def frozen(tensor: torch.Tensor) -> torch.nn.Parameter:
    """``tensor`` as a parameter that takes no gradient, as every quantized tensor is."""
    return torch.nn.Parameter(tensor, requires_grad=False)


@attrs.frozen(eq=False)  # compared by identity: it holds a dict, which cannot be hashed
class LayerSteps:
    """What every step needs: the scheme, the device to select for, the policy, the kernel
    tables (``catalog`` and ``launches``; kernelpick's own when None), the rows quantized
    at a time and, for ``fp8_block``, the block size (None: the scheme's 128). Made by
    ``create``, which checks and fills in the defaults."""

    scheme: Scheme
    caps: DeviceCaps
    policy: Policy
    catalog: Catalog | None
    launches: Mapping[str, Launch] | None
    chunk_rows: int
    block_size: int | None = None

    @classmethod
    def create(
        cls,
        scheme: Scheme | str,
        caps: DeviceCaps | None,
        policy: Policy | None,
        *,
        online: bool,
        catalog: Catalog | None = None,
        launches: Mapping[str, Launch] | None = None,
        chunk_rows: int = CHUNK_ROWS,
        block_size: int | None = None,
    ) -> LayerSteps:
        """The steps for ``scheme``. ``online`` steps quantize high-precision weights, so
        the scheme must be one of ``ONLINE_SCHEMES``; ``mxfp8`` is refused either way.
        ``block_size`` is ``fp8_block``'s only. ``caps`` defaults to a probe of the current
        device, ``policy`` to ``Policy.from_env(os.environ)`` (so ``KERNELPICK_*``
        variables reach engines). Every catalog id needs a row in ``launches``."""
        parsed = Scheme.parse(scheme)
        if parsed in _NOT_INTEGRATED:
            valid = ", ".join(s.value for s in Scheme if s not in _NOT_INTEGRATED)
            raise InvalidValueError(
                "scheme", parsed.value,
                f"one of {valid}: the integration has no loader, checkpoint format or cast "
                f"for {parsed.value}'s E8M0 scales yet; run its kernels through "
                "kernelpick.kernels (quantize_weights, apply)",
            )  # fmt: skip
        if online and parsed not in ONLINE_SCHEMES:
            valid = ", ".join(s.value for s in ONLINE_SCHEMES)
            raise InvalidValueError(
                "scheme", parsed.value,
                f"one of {valid}: {parsed.value} needs activation scales calibrated on "
                "data, which online quantization cannot compute; load them from a "
                "pre-quantized checkpoint with checkpoint_format='pre_quantized'",
            )  # fmt: skip
        if block_size is not None:
            if parsed is not Scheme.FP8_BLOCK:
                raise InvalidValueError(
                    "block_size", block_size, f"None: only fp8_block has one, not {parsed.value}"
                )
            if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
                raise InvalidValueError("block_size", block_size, "a positive integer, e.g. 128")
        if not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows < 1:
            raise InvalidValueError("chunk_rows", chunk_rows, "a positive integer")
        rows = launch_table(launches)
        check_rows(catalog, rows)
        if caps is None:
            caps = default_caps()
        policy = Policy.from_env(os.environ, catalog) if policy is None else policy
        return cls(parsed, caps, policy, catalog, rows, chunk_rows, block_size)

    # -- select ------------------------------------------------------------------------

    def config(self, n: int, k: int, dtype: object, *, bias: bool = False) -> QuantConfig:
        """A layer's QuantConfig: ``dtype`` (a torch or kernelpick dtype) is in and out."""
        return quant_config(
            self.scheme, weight_shape=(n, k), out_dtype=Dtype.parse(dtype), bias=bias,
            block_size=self.block_size,
        )  # fmt: skip

    def select(
        self,
        config: QuantConfig,
        layer: str = "",
        caps: DeviceCaps | None = None,
        parallel: TensorParallel | None = None,
    ) -> Selected:
        """The kernel for ``config`` on ``caps`` (these steps' by default), or
        ``KernelSelectionError`` with every reason (and, for a tensor-parallel shard, its
        rank). Not logged: each path logs with ``log`` when its layer really gets the
        kernel."""
        caps = self.caps if caps is None else caps
        decision = choose(caps, config, self.policy, self.catalog)
        if isinstance(decision, Rejected):
            partition = "" if parallel is None else parallel.describe()
            raise KernelSelectionError(self.scheme.value, decision, layer, partition)
        return decision

    def log(self, state: LayerState) -> None:
        """Tell the ``kernelpick`` logger which kernel ``state``'s layer got (see ``_log``)."""
        log_selection(self.scheme.value, state.caps, state.config, state.decision, state.prefix)

    def state(
        self,
        config: QuantConfig,
        prefix: str,
        shards: Sequence[int],
        parallel: TensorParallel | None = None,
    ) -> LayerState:
        """A layer's state, its kernel selected; or ``KernelSelectionError``."""
        sizes = positive_sizes(shards)
        decision = self.select(config, prefix, parallel=parallel)
        return LayerState(config, decision, self.caps, prefix, sizes, parallel=parallel)

    # -- check, bind, quantize ---------------------------------------------------------

    def check_weight(self, state: LayerState, weight: torch.Tensor) -> None:
        """The read-only checks on a high-precision weight: shape, dtype, finite values."""
        name = state.label("weight")
        n, k = state.config.weight_shape
        dtype = torch_dtype(state.config.input_dtype)
        check_tensor(name, weight)  # a meta or sparse weight has nothing to quantize
        if tuple(weight.shape) != (n, k) or weight.dtype != dtype:
            raise reject(name, weight, f"shape [{n}, {k}], dtype {state.config.input_dtype}")
        check_finite(name, weight, self.chunk_rows)

    def check_bias(self, state: LayerState, bias: torch.Tensor) -> None:
        """A bias must be finite, as the weight must."""
        check_finite(state.label("bias"), bias.view(1, -1), self.chunk_rows)

    def bind(self, state: LayerState, device: torch.device) -> Kernel:
        """The selected kernel bound to ``device``, found in these steps' tables; fails when
        the caps name another platform."""
        return self._bind(state.decision, state.config, state.caps, device)

    def _bind(
        self, decision: Selected, config: QuantConfig, caps: DeviceCaps, device: torch.device
    ) -> Kernel:
        return bind(decision, config, caps, device, catalog=self.catalog, launches=self.launches)

    def quantize(
        self, state: LayerState, weight: torch.Tensor, reduce_amax: AmaxReduce | None = None
    ) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
        """A checked high-precision weight in the canonical layout, as frozen parameters:
        the FP8 or int8 weight and its fp32 scale (per the scheme: per channel, per tensor
        or per block; fp32 amax, clamp floor, a chunk of rows at a time). A
        tensor-parallel shard passes ``reduce_amax`` (see ``quantize_weight``)."""
        fp8, scale = quantize_weight(
            weight.detach(), state.config, chunk_rows=self.chunk_rows, reduce_amax=reduce_amax
        )
        return frozen(fp8), frozen(scale)

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
            caps = default_caps(device)
        config = attrs.evolve(state.config, input_dtype=dtype, out_dtype=dtype)
        decision = self.select(config, state.prefix, caps, state.parallel)
        moved = attrs.evolve(state, config=config, decision=decision, caps=caps)
        moved.kernel = self._bind(decision, config, caps, device)
        return moved


def install(
    layer: torch.nn.Module,
    state: LayerState,
    kernel: Kernel,
    weight: torch.nn.Parameter,
    scale: torch.nn.Parameter,
    input_scale: torch.nn.Parameter | None = None,
) -> None:
    """Give ``layer`` its canonical parameters and its kernel, once the kernel has checked
    them (the parameters may be shared with a layer tied to this one). Each carries a
    ``weight_loader`` that refuses: the layer is processed, and its tensors are final."""
    kernel.prepare_weights(weight, scale, input_scale)
    installed = {"weight": weight, "weight_scale": scale, "input_scale": input_scale}
    for name, param in installed.items():
        if param is not None:
            param.weight_loader = closed_loader(state, name)  # type: ignore[attr-defined]
            setattr(layer, name, param)
    state.kernel = kernel
    attach(layer, state)


def run(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Run a processed layer's kernel: ``x [..., K]`` -> ``[..., N]``. The kernel's layout
    is derived from the canonical parameters on each call, so it never goes stale."""
    state = layer_state(layer)
    kernel = state.kernel
    if kernel is None:
        raise InvalidValueError(
            "layer", state.name,
            "a layer whose weights were processed: call process_weights_after_loading first",
        )  # fmt: skip
    weight, scale = layer.get_parameter("weight"), layer.get_parameter("weight_scale")
    return kernel.run(x, weight, scale, layer._parameters.get("input_scale"), bias)
