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
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch
import torch.distributed as dist

from kernelpick.core import (
    InvalidValueError,
    KernelpickError,
    QuantConfig,
    is_positive_int,
    parse_enum,
    positive_int,
)
from kernelpick.integration._errors import TensorParallelError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "DEFAULT_TIMEOUT",
    "AmaxExchange",
    "ParallelStyle",
    "TensorParallel",
    "check_split_blocks",
]

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
    positive_int(attribute.name, value, "a positive int")


def _rank(inst: TensorParallel, attribute: attrs.Attribute[int], value: object) -> None:
    world = inst.world_size
    if not is_positive_int(world):
        _world_size(inst, attrs.fields(TensorParallel).world_size, world)  # named first
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or not 0 <= value < world:  # type: ignore[operator]
        raise InvalidValueError(attribute.name, value, f"0..{world - 1}")


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
        rank = dist.get_rank(group)
        if rank < 0:  # torch answers -1 for a group this process is not in
            expected = "a group this process is a member of (dist.new_group(ranks) lists them)"
            raise InvalidValueError("tensor-parallel group", f"rank {rank}", expected)
        return cls(style, rank, dist.get_world_size(group), group, timeout)

    def __deepcopy__(self, memo: dict[int, object]) -> TensorParallel:
        return self  # a frozen value whose process group is a handle to share, not copy

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
        self.check_blocks(config, sizes, layer)

    def check_blocks(self, config: QuantConfig, sizes: Sequence[int], layer: str) -> None:
        """Refuse a partition whose scale blocks would straddle two ranks (each would scale
        its half differently, and a checkpoint's block scales would be narrowed to other
        blocks): per rank, K (row-parallel) or every shard's N (column-parallel) must be
        a multiple of the block."""
        if self.world_size > 1:
            column = self.style is ParallelStyle.COLUMN
            split = list(sizes) if column else []
            check_split_blocks(config, split, not column, f"{layer} {self.describe()}")


def check_split_blocks(
    config: QuantConfig, split: Sequence[int], k_split: bool, layer: str
) -> None:
    """Refuse a part of a layer whose weight scale blocks would straddle the split, by
    kernelpick's tensor parallelism or an engine's own: each of the ``split`` shards' rows
    (N), and K where ``k_split``, a multiple of the scale group's extent along it."""
    group = config.weight.scale.group  # over the GEMM's [K, N]: rows are K, columns are N
    if k_split and group.rows > 1 and config.k % group.rows:
        dim, parts, extent = "K", [config.k], group.rows
    elif group.cols > 1 and any(part % group.cols for part in split):
        dim, parts, extent = "each shard's N", list(split), group.cols
    else:
        return
    raise InvalidValueError(
        f"partition of {layer}", parts,
        f"{dim} per rank a multiple of the scale block, {extent}: a block split between "
        "ranks would be scaled differently on each",
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


@attrs.define
class AmaxExchange:
    """The all-reduce (MAX) of one shard's weight amax over its group, passed to
    ``quantize_canonical`` as ``reduce_amax``.

    A small header goes first: which layer this rank is at (a hash of its name and shape,
    all-reduced as its MAX and the MAX of its negation, which agree only if every rank
    sent the same) and which ranks failed. Ranks at different layers, a failed rank (one
    that calls ``fail``) and no answer within the timeout each raise
    ``TensorParallelError`` before any amax is combined. ``sent`` says whether this
    rank's header went: a rank that fails before it must ``fail``, or its peers wait for
    it until the timeout."""

    tp: TensorParallel
    layer: str
    config: QuantConfig
    device: torch.device
    sent: bool = False

    def __call__(self, amax: torch.Tensor) -> torch.Tensor:
        # Made before the header: nothing this rank does may fail between the two.
        payload = amax.reshape(-1).to(self.device, torch.float32, copy=True)
        self._header(failed=False)
        self._all_reduce(payload)
        return payload.reshape(amax.shape).to(amax.device)

    def fail(self) -> None:
        """Tell the peers this rank failed; the caller then raises its own error."""
        # Whatever stops the mark (its own collective failing, a group now refused), the
        # caller's error is this rank's own and says more.
        with contextlib.suppress(KernelpickError, RuntimeError):
            self._header(failed=True)

    def _header(self, failed: bool) -> None:
        tp = self.tp
        tp.check_group()
        ident = _identity(self.layer, self.config)
        header = torch.zeros(2 + tp.world_size, dtype=torch.float64, device=self.device)
        header[0], header[1] = ident, -ident
        header[2 + tp.rank] = float(failed)
        self.sent = True  # from here on the peers are paired with this rank's collectives
        self._all_reduce(header)
        if header[0].item() != ident or header[1].item() != -ident:
            cause = (
                "the ranks reached different layers at this all-reduce, so their amaxes "
                "cannot be combined: every rank must process the same layers in the same "
                "order, under the same prefixes"
            )
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, cause=cause)
        marks = header[2:].tolist()
        others = [rank for rank, mark in enumerate(marks) if mark > 0 and rank != tp.rank]
        if others:
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, others)

    def _all_reduce(self, buffer: torch.Tensor) -> None:
        tp = self.tp
        seconds = tp.timeout.total_seconds()
        try:
            work = dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=tp.group, async_op=True)
            done = work is not None and work.wait(tp.timeout)
        except RuntimeError as error:  # gloo's "timed out", a closed connection, NCCL's errors
            cause = (
                f"the all-reduce with the other ranks failed ({type(error).__name__}: "
                f"{error}; this rank waits at most {seconds:g} s): a peer failed, hung or "
                "never reached this layer, or the backend refused the buffer"
            )
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, cause=cause) from error
        if not done:
            cause = f"the all-reduce did not complete within {seconds:g} s"
            raise TensorParallelError(self.layer, tp.rank, tp.world_size, cause=cause)


def _identity(layer: str, config: QuantConfig) -> float:
    """A layer's name and shape as a float64 integer (52 bits of a hash: exact in fp64,
    and the same in every process, unlike ``hash``). Layers of one shape are told apart
    by name only: create_weights' ``prefix`` is what identifies a layer across ranks."""
    text = f"{layer}|{config.weight_shape}|{config.weight_block}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return float(int.from_bytes(digest, "big") >> 12)
