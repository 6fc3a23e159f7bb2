"""The steps that make one linear a quantized layer: plan (select before allocating) and
bind; a layer's install, prepared state and forward are ``_prepare``'s.

The linear method (an engine's layers), ``quantize_model``, ``load_quantized`` and the
transformers quantizer all make their layers with these, so a layer is made the same way
whichever path made it. Checking and canonicalizing its tensors is ``_accept``'s; a layer
is given its parameters and kernel (``install``) only once they were accepted, and the
kernel prepares what it runs on then, once, not on every forward.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence

import attrs
import torch

from kernelpick.adapters import default_caps
from kernelpick.core import (
    Catalog,
    DeviceCaps,
    Dtype,
    InvalidValueError,
    Policy,
    QuantConfig,
    Rejected,
    Scheme,
    Selected,
    choose,
    positive_int,
)
from kernelpick.integration._errors import KernelSelectionError
from kernelpick.integration._log import LOGGER, log_selection
from kernelpick.integration.layer._parallel import TensorParallel
from kernelpick.integration.layer._plan import LayerPlan
from kernelpick.integration.layer._recipe import Recipe
from kernelpick.integration.layer._state import (
    LayerState,
    positive_sizes,
)
from kernelpick.kernels import (
    CHUNK_ROWS,
    Kernel,
    Launch,
    bind,
    check_rows,
    launch_table,
)

__all__ = [
    "LayerSteps",
    "check_allocatable",
    "frozen",
]


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
    """What every step needs: the recipe, the device to select for, the policy, the kernel
    tables (``catalog`` and ``launches``; kernelpick's own when None) and the rows
    quantized at a time. Made by ``create``, which checks and fills in the defaults."""

    recipe: Recipe
    caps: DeviceCaps
    policy: Policy
    catalog: Catalog | None
    launches: Mapping[str, Launch] | None
    chunk_rows: int

    @classmethod
    def create(
        cls,
        recipe: Recipe,
        caps: DeviceCaps | None,
        policy: Policy | None,
        *,
        catalog: Catalog | None = None,
        launches: Mapping[str, Launch] | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> LayerSteps:
        """The steps for ``recipe``. ``caps`` defaults to ``default_caps()`` (the current
        device), ``policy`` to ``Policy.from_env(os.environ)`` (so ``KERNELPICK_*``
        variables reach engines). Every catalog id needs a row in ``launches``."""
        positive_int("chunk_rows", chunk_rows)
        rows = launch_table(launches)
        check_rows(catalog, rows)
        caps = default_caps() if caps is None else caps
        policy = Policy.from_env(os.environ, catalog) if policy is None else policy
        return cls(recipe, caps, policy, catalog, rows, chunk_rows)

    @property
    def scheme(self) -> Scheme:
        return self.recipe.scheme

    @property
    def block_size(self) -> int | None:
        return self.recipe.block_size

    # -- plan --------------------------------------------------------------------------

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

    def config(
        self, n: int, k: int, dtype: object, *, bias: bool = False, k_parts: int = 1
    ) -> QuantConfig:
        """A layer's QuantConfig, from the recipe: ``dtype`` is in and out."""
        return self.recipe.config(n, k, dtype, bias=bias, k_parts=k_parts)

    def plan(
        self,
        config: QuantConfig,
        shards: Sequence[int],
        dtype: torch.dtype,
        prefix: str,
        *,
        parallel: TensorParallel | None = None,
        online: bool | None = None,
    ) -> LayerPlan:
        """One layer of ``config`` with fused shards of ``shards`` rows: the parameters it
        registers (``online``: the recipe's format by default; ``dtype``: the
        high-precision weight's), refused before anything is selected when torch could not
        size one, and its kernel selected (or ``KernelSelectionError``)."""
        sizes = positive_sizes(shards)
        online = self.recipe.online if online is None else online
        params = LayerPlan.params_of(config, sizes, dtype, online=online)
        for param in params:
            check_allocatable(prefix or "layer", param.shape, param.dtype)
        decision = self.select(config, prefix, parallel=parallel)
        return LayerPlan(config, decision, self.caps, prefix, sizes, parallel, params)

    def log(self, state: LayerState, logger: logging.Logger = LOGGER) -> None:
        """Tell ``logger`` (kernelpick's by default; an engine's own as a second
        destination) which kernel ``state``'s layer got, once per (device, config) and
        logger (see ``_log``)."""
        log_selection(
            self.scheme.value, state.caps, state.config, state.decision, state.prefix, logger
        )

    # -- bind --------------------------------------------------------------------------

    def bind(self, state: LayerState, device: torch.device) -> Kernel:
        """The selected kernel bound to ``device``, found in these steps' tables; fails when
        the caps name another platform."""
        return self._bind(state.decision, state.config, state.caps, device)

    def _bind(
        self, decision: Selected, config: QuantConfig, caps: DeviceCaps, device: torch.device
    ) -> Kernel:
        return bind(decision, config, caps, device, catalog=self.catalog, launches=self.launches)

    def retarget(self, state: LayerState, dtype: Dtype, device: torch.device) -> LayerState:
        """A processed layer's state once it computes in ``dtype`` on ``device``: selected
        and bound again (for the device's default caps, when it moves) where either changes,
        with nothing prepared yet. Raises ``KernelSelectionError`` when no kernel fits;
        ``state`` itself never changes."""
        kernel = state.bound
        if kernel is None:
            raise InvalidValueError("layer", state.name, "a layer whose weights were processed")
        if dtype is state.config.input_dtype and device == kernel.device:
            return state
        caps = state.caps if device == kernel.device else default_caps(device)
        config = attrs.evolve(state.config, input_dtype=dtype, out_dtype=dtype)
        decision = self.select(config, state.prefix, caps, state.parallel)
        plan = attrs.evolve(state.plan, config=config, decision=decision, caps=caps)
        return LayerState(plan, dict(state.loaded), self._bind(decision, config, caps, device))
