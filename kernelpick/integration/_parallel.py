"""Tensor parallelism: a linear layer split over the ranks of a ``torch.distributed`` group,
as engines split it (Megatron-LM's column and row parallelism).

Column-parallel: each rank holds ``N / world`` output channels (rows of the stored
``[N, K]`` weight) and computes its own columns of the output; the caller gathers them.
Row-parallel: each rank holds ``K / world`` inputs (columns of the weight) and computes a
partial output; the caller sums them with an all-reduce.

The ranks must agree on the weight's scales. A scale group inside one rank's part is
exact on that rank. A group spanning the split dimension (per channel under row
parallelism; per tensor under either) is scaled from its amax all-reduced (MAX) over the
group, so each rank uses the whole layer's scale and holds the whole layer's bytes. A
group straddling ranks without spanning them (a block that does not divide a rank's part)
is refused before anything is allocated. Activation scales are each rank's own.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch
import torch.distributed as dist

from kernelpick.core._errors import InvalidValueError, parse_enum
from kernelpick.core._quant import QuantConfig
from kernelpick.integration._errors import TensorParallelError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["DEFAULT_TIMEOUT", "AmaxExchange", "ParallelStyle", "TensorParallel"]

# How long a rank waits for its peers at a collective before giving up: NCCL's default
# process-group timeout. Ranks load and process the same layers in the same order, so a
# longer wait means a peer failed or hangs.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


class ParallelStyle(enum.Enum):
    """How a layer is split: ``COLUMN`` splits N (outputs), ``ROW`` splits K (inputs)."""

    COLUMN = "column"
    ROW = "row"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> ParallelStyle:
        return parse_enum(cls, value, "parallel style")


def _style(value: object) -> ParallelStyle:
    return ParallelStyle.parse(value)


def _world_size(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidValueError(attribute.name, value, "a positive int")


def _rank(inst: TensorParallel, attribute: attrs.Attribute[int], value: object) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or not 0 <= value < inst.world_size:  # type: ignore[operator]
        raise InvalidValueError(attribute.name, value, f"0..{inst.world_size - 1}")


def _timeout(_inst: object, attribute: attrs.Attribute[datetime.timedelta], value: object) -> None:
    if not isinstance(value, datetime.timedelta) or value <= datetime.timedelta(0):
        raise InvalidValueError(attribute.name, value, "a positive datetime.timedelta")


@attrs.frozen(eq=False)  # compared by identity: a process group has no value equality
class TensorParallel:
    """A layer's place in a tensor-parallel group: its ``style``, this process's ``rank``
    of ``world_size`` and the ``group`` whose collectives its scales are agreed over
    (None: torch.distributed's default group). ``timeout`` bounds each wait for the peers.

    Build it with ``of``, which reads the rank and size from the group; the plain
    constructor is for callers that know them (an engine's own parallel state), and the
    group is then checked to agree before its first collective."""

    style: ParallelStyle = attrs.field(converter=_style)
    rank: int = attrs.field(validator=_rank)  # attrs validates once every field is set
    world_size: int = attrs.field(validator=_world_size)
    group: ProcessGroup | None = None
    timeout: datetime.timedelta = attrs.field(default=DEFAULT_TIMEOUT, validator=_timeout)

    @classmethod
    def of(
        cls,
        style: ParallelStyle | str,
        group: ProcessGroup | None = None,
        *,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> TensorParallel:
        """This process's place in ``group`` (the default group when None)."""
        _check_initialized()
        return cls(style, dist.get_rank(group), dist.get_world_size(group), group, timeout)

    @property
    def split_dim(self) -> str:
        """The parameter attribute naming the dimension this style splits."""
        return "output_dim" if self.style is ParallelStyle.COLUMN else "input_dim"

    def describe(self) -> str:
        return f"on tensor-parallel rank {self.rank} of {self.world_size} ({self.style}-parallel)"

    def check_group(self) -> None:
        """Refuse a group this value's rank and size disagree with: narrowing by one rank
        and all-reducing as another would mix two ranks' parts."""
        _check_initialized()
        found = (dist.get_rank(self.group), dist.get_world_size(self.group))
        if found != (self.rank, self.world_size):
            raise InvalidValueError(
                "tensor-parallel rank and world size", (self.rank, self.world_size),
                f"the group's own, {found}: build TensorParallel with TensorParallel.of",
            )  # fmt: skip

    def reduces(self, config: QuantConfig) -> bool:
        """Whether ``config``'s weight scale groups span the split dimension, so that their
        amax is all-reduced (per channel under ROW, per tensor under either)."""
        return _group_extent(self, config) == -1

    def check_partition(
        self, config: QuantConfig, sizes: Sequence[int], input_size: int, output_size: int,
        layer: str,
    ) -> None:  # fmt: skip
        """Refuse a partition this group could not have made, or whose scale blocks would
        straddle two ranks, before anything is allocated."""
        world, k = self.world_size, config.k
        if self.style is ParallelStyle.ROW and input_size != k * world:
            raise InvalidValueError(
                f"input_size of {layer}", input_size,
                f"input_size_per_partition x world_size = {k} x {world} = {k * world}: a "
                "row-parallel rank holds an equal part of the inputs",
            )  # fmt: skip
        if self.style is ParallelStyle.COLUMN and output_size != sum(sizes) * world:
            raise InvalidValueError(
                f"output_size of {layer}", output_size,
                f"sum(output_partition_sizes) x world_size = {sum(sizes)} x {world} = "
                f"{sum(sizes) * world}: a column-parallel rank holds an equal part of each "
                "shard's outputs",
            )  # fmt: skip
        extent = _group_extent(self, config)
        parts = [k] if self.style is ParallelStyle.ROW else list(sizes)
        if extent > 1 and any(part % extent for part in parts):
            dim = "K" if self.style is ParallelStyle.ROW else "each shard's N"
            raise InvalidValueError(
                f"partition of {layer} {self.describe()}", parts,
                f"{dim} per rank a multiple of the scale block, {extent}: a block split "
                "between ranks would be scaled differently on each",
            )  # fmt: skip


def _group_extent(tp: TensorParallel, config: QuantConfig) -> int:
    """The weight scale group's extent along the split dimension (-1: all of it). Groups
    are written over the GEMM's ``[K, N]`` operand: rows are K, columns are N."""
    group = config.weight.scale.group
    return group.rows if tp.style is ParallelStyle.ROW else group.cols


def _check_initialized() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidValueError(
            "torch.distributed", "not initialized",
            "an initialized process group: call torch.distributed.init_process_group first",
        )  # fmt: skip


@attrs.frozen
class AmaxExchange:
    """The all-reduce (MAX) of one shard's weight amax over its group, passed to
    ``quantize_weight`` as ``reduce_amax``.

    A rank that fails before its amax is known calls ``fail``: it still joins the
    collective, marked failed, so its peers raise ``TensorParallelError`` naming it at
    once instead of waiting. No answer within the timeout (a peer hung, died or never
    reached the layer) is ``TensorParallelError`` too."""

    tp: TensorParallel
    layer: str
    config: QuantConfig
    device: torch.device

    def __call__(self, amax: torch.Tensor) -> torch.Tensor:
        return self._exchange(amax)

    def fail(self) -> None:
        """Join the collective as failed; the caller then raises its own error."""
        with contextlib.suppress(TensorParallelError):  # this rank's own error says more
            self._exchange(None)

    def _exchange(self, amax: torch.Tensor | None) -> torch.Tensor:
        tp = self.tp
        tp.check_group()
        (n, k), (rows, cols) = self.config.weight_shape, self.config.weight_block
        shape = (-(-n // rows), -(-k // cols))  # the scale groups, as quantize_weight has them
        numel = shape[0] * shape[1]
        flags = torch.zeros(tp.world_size, dtype=torch.float32, device=self.device)
        if amax is None:
            flags[tp.rank] = 1.0
            values = torch.zeros(numel, dtype=torch.float32, device=self.device)
        else:
            values = amax.reshape(-1).to(self.device, torch.float32)
        buffer = torch.cat([values, flags])
        seconds = tp.timeout.total_seconds()
        try:
            work = dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=tp.group, async_op=True)
            done = work is not None and work.wait(tp.timeout)
        except RuntimeError as error:  # gloo's "timed out", a closed connection, NCCL's errors
            cause = f"{type(error).__name__}: {error} (timeout {seconds:g} s)"
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, cause=cause) from error
        if not done:
            cause = f"the all-reduce did not complete within {seconds:g} s"
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, cause=cause)
        marks = buffer[numel:].tolist()
        failed = [rank for rank, mark in enumerate(marks) if mark > 0 and rank != tp.rank]
        if failed:
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, failed)
        return buffer[:numel].reshape(amax.shape if amax is not None else shape)
