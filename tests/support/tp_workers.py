"""A harness for tests that need several ``torch.distributed`` ranks: it spawns one process
per rank, joins them to a gloo group over loopback, runs module-level scenario functions
``(rank, world_size) -> picklable result`` and brings every rank's result back.

Each scenario of a batch runs in a process group of its own (a fresh ``FileStore`` file,
torn down after it), so one scenario's collectives never meet another's. An exception
raised in a rank comes back as data (``Raised``: the type, the message, the error's
attributes) for the test to assert on. A rank that does not finish by the deadline is
killed and its result is ``Missing``, saying which scenario it was in: nothing here waits
without a bound. Results travel by plain pickle (tensors by value).
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection
from typing import Any

import numpy as np
import torch

__all__ = [
    "Batch",
    "Missing",
    "Raised",
    "Scenario",
    "as_numpy",
    "fp8_bytes",
    "run_batch",
    "run_ranks",
    "scratch_dir",
    "values",
]

Scenario = Callable[[int, int], object]

_SCRATCH = "KERNELPICK_TEST_TP_SCRATCH"  # set in each rank: a directory the ranks share

# The attributes a kernelpick error may carry that the tests read (those present are kept).
_ATTRIBUTES = ("failed", "layer", "rank", "world_size", "cause", "partition", "scheme")


@dataclass(frozen=True)
class Raised:
    """An exception a rank raised: its type name, message, kernelpick attributes (and for
    a ``KernelSelectionError`` the rendered decision and its reasons' codes) and the
    formatted traceback, for failure messages."""

    type_name: str
    message: str
    attributes: dict[str, object] = field(default_factory=dict)
    traceback: str = ""

    @classmethod
    def of(cls, error: BaseException) -> Raised:
        found: dict[str, object] = {}
        for name in _ATTRIBUTES:
            if hasattr(error, name):
                found[name] = _plain(getattr(error, name))
        rejected = getattr(error, "rejected", None)
        if rejected is not None:
            found["rejected"] = rejected.render()
            found["reason_codes"] = tuple(str(reason.code) for reason in rejected.reasons)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return cls(type(error).__name__, str(error), found, text)


def _plain(value: object) -> object:
    """``value`` if it is plain data that pickles anywhere, else its repr."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, tuple) and all(isinstance(v, (str, int, float, bool)) for v in value):
        return value
    return repr(value)


@dataclass(frozen=True)
class Missing:
    """No result from a rank: it was killed at the deadline, or exited, while in the
    scenario named (or before reaching it)."""

    reason: str


@dataclass
class Batch:
    """Each scenario's results, one per rank (a value, ``Raised`` or ``Missing``), and
    what went wrong with the processes themselves."""

    results: dict[str, list[object]]
    problems: list[str]
    seconds: float

    def __getitem__(self, name: str) -> list[object]:
        return self.results[name]


def values(outcomes: Sequence[object], scenario: str = "") -> list[dict[str, Any]]:
    """Every rank's result, each a dict; an ``AssertionError`` showing each rank that
    raised (with its traceback) or gave no result."""
    bad = [
        f"rank {rank}: {_describe(outcome)}"
        for rank, outcome in enumerate(outcomes)
        if not isinstance(outcome, dict)
    ]
    if bad:
        raise AssertionError(f"scenario {scenario!r} did not complete:\n" + "\n".join(bad))
    return [outcome for outcome in outcomes if isinstance(outcome, dict)]


def _describe(outcome: object) -> str:
    if isinstance(outcome, Raised):
        return f"raised {outcome.type_name}: {outcome.message}\n{outcome.traceback}"
    if isinstance(outcome, Missing):
        return f"no result: {outcome.reason}"
    return f"returned {type(outcome).__name__}, not a dict: {outcome!r}"


def as_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """A detached CPU copy of ``tensor`` as numpy (fp8 as its raw bytes)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        tensor = tensor.view(torch.uint8)
    return tensor.clone().numpy()


def fp8_bytes(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """The bytes of an FP8 (or int8) tensor, to compare exactly."""
    if tensor.dtype.itemsize != 1:
        raise TypeError(f"expected a one-byte dtype, got {tensor.dtype}")
    return as_numpy(tensor)


def scratch_dir() -> str:
    """In a rank: a directory every rank of this run shares (for files that tell a peer
    when to go on), removed with the run."""
    return os.environ[_SCRATCH]


def run_ranks(
    scenario: Scenario,
    world_size: int = 2,
    timeout_s: float = 60.0,
    *,
    group_timeout_s: float = 30.0,
) -> list[object]:
    """Run one scenario on ``world_size`` ranks; its result on each rank (see ``run_batch``)."""
    batch = run_batch([scenario], world_size, timeout_s, group_timeout_s=group_timeout_s)
    return batch[scenario.__name__]


def run_batch(
    scenarios: Sequence[Scenario],
    world_size: int = 2,
    timeout_s: float = 60.0,
    *,
    group_timeout_s: float = 30.0,
) -> Batch:
    """Run ``scenarios`` (module-level functions, which a rank imports by module and name)
    in order on ``world_size`` spawned ranks, each in a gloo group of its own whose
    collectives time out after ``group_timeout_s``. Every rank must finish within
    ``timeout_s`` of the start (spawning and imports included); one still running then is
    killed, and its results from the scenario it was in on are ``Missing``, as are those
    of a rank that exits early."""
    names = [scenario.__name__ for scenario in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names repeat: {names}")
    context = torch.multiprocessing.get_context("spawn")
    run = _Run(names, world_size)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kp-tp-") as store_dir:
        processes: list[Any] = []
        readers: dict[connection.Connection, int] = {}
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker,
                args=(rank, world_size, list(scenarios), store_dir, writer, group_timeout_s),
                name=f"tp-rank-{rank}",
                daemon=True,
            )
            process.start()
            writer.close()  # the rank holds the only writer: its exit is EOF here
            processes.append(process)
            readers[reader] = rank
        deadline = start + timeout_s
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for ready in connection.wait(list(readers), timeout=left):
                assert isinstance(ready, connection.Connection)
                try:
                    run.handle(pickle.loads(ready.recv_bytes()))
                except EOFError:  # the rank ended: "done" came first, or it died
                    del readers[ready]
                    ready.close()
        for rank, process in enumerate(processes):
            process.join(timeout=5.0 if run.finished[rank] else 0.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
                if run.finished[rank]:
                    run.problems.append(f"rank {rank} sent all its results but did not exit")
                else:
                    run.missing(rank, f"killed after {timeout_s:g} s")
            elif not run.finished[rank]:
                run.missing(rank, f"exited with code {process.exitcode}")
        for reader in readers:
            reader.close()
    return Batch(run.results, run.problems, time.monotonic() - start)


class _Run:
    """What the ranks of one ``run_batch`` reported so far."""

    def __init__(self, names: list[str], world_size: int) -> None:
        self.names = names
        self.results: dict[str, list[object]] = {
            name: [Missing("the rank never started it")] * world_size for name in names
        }
        self.current: list[str | None] = [None] * world_size
        self.finished = [False] * world_size
        self.problems: list[str] = []

    def handle(self, message: tuple[Any, ...]) -> None:
        kind, rank = message[0], message[1]
        if kind == "start":
            self.current[rank] = message[2]
        elif kind == "result":
            self.results[message[2]][rank] = message[3]
        elif kind == "done":
            self.finished[rank] = True

    def missing(self, rank: int, what: str) -> None:
        """Mark ``rank``'s results from the scenario it was in on (all when none) missing."""
        at = self.current[rank]
        reason = f"rank {rank} {what}, in scenario {at!r}"
        self.problems.append(reason)
        for name in self.names[0 if at is None else self.names.index(at) :]:
            if isinstance(self.results[name][rank], Missing):
                later = name != at and at is not None
                self.results[name][rank] = Missing(
                    reason + (", so never ran this" if later else "")
                )


def _worker(
    rank: int,
    world_size: int,
    scenarios: list[Scenario],
    store_dir: str,
    writer: connection.Connection,
    group_timeout_s: float,
) -> None:
    """A rank: each scenario in a group of its own, its result sent (synchronously) as it
    finishes. It ends with ``os._exit``: a group left with a collective pending (a
    scenario about a hung peer) could block an orderly shutdown."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ[_SCRATCH] = store_dir
    torch.set_num_threads(1)
    import torch.distributed as dist

    def send(*message: object) -> None:
        # Plain pickle, not torch's ForkingPickler: tensors go by value, not as shared
        # memory that would die with this process.
        try:
            data = pickle.dumps(message)
        except Exception as error:  # an unpicklable result: say so instead
            data = pickle.dumps((*message[:3], Raised.of(error)))
        writer.send_bytes(data)

    for index, scenario in enumerate(scenarios):
        name = scenario.__name__
        send("start", rank, name)
        try:
            dist.init_process_group(
                "gloo",
                init_method=f"file://{store_dir}/{index}-{name}.store",
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=group_timeout_s),
            )
            outcome: object = scenario(rank, world_size)
        except BaseException as error:
            outcome = Raised.of(error)
        send("result", rank, name, outcome)
        if index < len(scenarios) - 1 and dist.is_initialized():
            dist.destroy_process_group()
    send("done", rank)
    writer.close()
    os._exit(0)
