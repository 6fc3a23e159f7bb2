"""The integration's errors, in the one hierarchy rooted at ``kp.KernelpickError``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelpick.core import KernelpickError, Rejected

__all__ = [
    "CheckpointError",
    "KernelSelectionError",
    "ModelConversionError",
    "TensorParallelError",
]


class KernelSelectionError(KernelpickError):
    """No kernel can implement a layer's quantization on the device; raised before any
    weight is allocated.

    The message is ``quantization="<scheme>": `` then the layer (when named), the
    tensor-parallel rank (for a shard) and the full Reasons list; ``rejected`` is the
    decision itself, ``layer`` the layer's prefix, ``partition`` the shard's rank and
    shape in words (empty for a whole layer).
    """

    def __init__(
        self, scheme: str, rejected: Rejected, layer: str = "", partition: str = ""
    ) -> None:
        self.scheme = scheme
        self.rejected = rejected
        self.layer = layer
        self.partition = partition
        where = " ".join(part for part in (f"layer {layer!r}" if layer else "", partition) if part)
        where = f"{where}: " if where else ""
        super().__init__(f'quantization="{scheme}": {where}{rejected.render()}')

    def __reduce__(self) -> tuple[type[KernelSelectionError], tuple[str, Rejected, str, str]]:
        return (type(self), (self.scheme, self.rejected, self.layer, self.partition))


def _names(names: Sequence[str], shown: int = 6) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _without_layer(error: KernelpickError) -> str:
    """What an error says apart from which layer it is about, so that layers failing the
    same way are listed once."""
    if isinstance(error, KernelSelectionError):
        return f'quantization="{error.scheme}": {error.rejected.render()}'
    return str(error)


class ModelConversionError(KernelpickError):
    """A model could not be converted (``quantize_model``) or loaded (``load_quantized``).

    ``failures`` pairs each layer that cannot be converted with the error that explains
    it; then nothing was changed. ``stopped_at`` names the layer an exception of any kind
    (``KeyboardInterrupt`` and out-of-memory included, chained as ``__cause__``) cut
    short; then ``converted`` lists the layers converted before it. Every layer is either
    as it was or fully converted, and the same call again finishes the job.
    """

    def __init__(
        self,
        failures: Sequence[tuple[str, KernelpickError]] = (),
        converted: Sequence[str] = (),
        stopped_at: str = "",
        cause: str = "",
    ) -> None:
        self.failures = tuple(failures)
        self.converted = tuple(converted)
        self.stopped_at = stopped_at
        self.cause = cause
        if stopped_at:
            count = len(self.converted)
            done = (
                f"{count} layer(s) were converted before it ({_names(self.converted)})"
                if count
                else "no layer was converted"
            )
            super().__init__(
                f"conversion stopped at layer {stopped_at!r} by {cause}; {done}, and every "
                "other layer is as it was. Run the same call again to finish."
            )
            return
        groups: dict[str, list[tuple[str, KernelpickError]]] = {}
        for name, error in self.failures:
            groups.setdefault(_without_layer(error), []).append((name, error))
        lines = []
        for reason, members in groups.items():
            if len(members) == 1:
                lines.append(f"{members[0][0]}: {members[0][1]}")
            else:
                names = [name for name, _ in members]
                lines.append(f"{len(names)} layers ({_names(names)}): {reason}")
        super().__init__(
            f"cannot convert the model; nothing was changed. {len(self.failures)} layer(s) "
            "failed:\n" + "\n".join(lines)
        )

    @classmethod
    def stopped(
        cls, layer: str, converted: Sequence[str], error: BaseException
    ) -> ModelConversionError:
        """The error for an exception that cut a conversion short at ``layer``."""
        cause = f"{type(error).__name__}({error})" if str(error) else type(error).__name__
        return cls(converted=converted, stopped_at=layer or "(none)", cause=cause)

    def __reduce__(
        self,
    ) -> tuple[
        type[ModelConversionError],
        tuple[tuple[tuple[str, KernelpickError], ...], tuple[str, ...], str, str],
    ]:
        return (type(self), (self.failures, self.converted, self.stopped_at, self.cause))


class CheckpointError(KernelpickError):
    """A checkpoint kernelpick cannot read, or cannot write, as it is: a configuration it
    does not support, a missing or unexpected tensor, a tensor of the wrong dtype or shape.
    ``path`` is the file or directory, ``key`` the tensor or setting, ``expected`` what
    would be valid. Nothing was changed."""

    def __init__(self, path: str, key: str, found: str, expected: str) -> None:
        self.path = path
        self.key = key
        self.found = found
        self.expected = expected
        super().__init__(f"{path}: {key}: found {found}; expected {expected}")

    def __reduce__(self) -> tuple[type[CheckpointError], tuple[str, str, str, str]]:
        return (type(self), (self.path, self.key, self.found, self.expected))


class TensorParallelError(KernelpickError):
    """A tensor-parallel shard could not agree with its peers on a layer's scales: another
    rank failed while processing the same layer (``failed`` lists them), the ranks reached
    different layers, or no answer came within the timeout (a peer hung, crashed or never
    reached the layer); ``cause`` says which, and what torch reported. ``layer`` is the
    layer, ``rank`` and ``world_size`` this rank's place in the group. The layer is left
    unprocessed; tear the group down, as after any failed collective."""

    def __init__(
        self,
        layer: str,
        rank: int,
        world_size: int,
        failed: Sequence[int] = (),
        cause: str = "",
    ) -> None:
        self.layer = layer
        self.rank = rank
        self.world_size = world_size
        self.failed = tuple(failed)
        self.cause = cause
        where = f"layer {layer!r} on tensor-parallel rank {rank} of {world_size}"
        what = cause
        if self.failed:
            ranks = ", ".join(map(str, self.failed))
            what = (
                f"rank(s) {ranks} failed while processing their shard, so this rank stops too: "
                "its weight scales would not be the whole layer's (see that rank's error)"
            )
        super().__init__(f"{where}: {what}")

    def __reduce__(
        self,
    ) -> tuple[type[TensorParallelError], tuple[str, int, int, tuple[int, ...], str]]:
        return (type(self), (self.layer, self.rank, self.world_size, self.failed, self.cause))
