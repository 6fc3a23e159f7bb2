"""The ``kernelpick`` command: explain, matrix, devices, kernels, bench, plan, inspect.

Exit status: 0 when a kernel is selected (and for the listing commands), 2 when every
kernel was turned down (``plan``: for any layer on any device; ``inspect --device``: for
any layer), 1 on bad input, usage errors included, so that argparse's own status 2 is
never read as a rejection.

A reader that goes away early (``kernelpick matrix | head -1``) changes nothing but where
the rest of the output goes: from then on it is dropped, as /dev/null would take it, and
the command ends with its own status, without a traceback. The status cannot depend on the
reader: a reader that leaves after the last write (all of it fitted the pipe's buffer) is
never seen, so "141, as for SIGPIPE" would be 0 or 141 by timing, and ``set -o pipefail``
would fail at random. A stream closed before the command starts (``2>&-``, ``>&-``) takes
nothing either: without a stderr, progress and errors are dropped, never sent to stdout.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TextIO

from kernelpick.cli._bench import bench
from kernelpick.cli._commands import COMMANDS, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED
from kernelpick.cli._inspect import inspect
from kernelpick.cli._parser import UsageError, parser
from kernelpick.cli._plan import plan
from kernelpick.core import KernelpickError, Scheme, UnknownNameError

__all__ = ["EXIT_BAD_INPUT", "EXIT_REJECTED", "EXIT_SELECTED", "main"]

_COMMANDS = {**COMMANDS, "bench": bench, "plan": plan, "inspect": inspect}

# One line of what to do next, by what was unknown.
_HINTS = {
    "device profile": "'kernelpick devices' lists the profiles; --device auto probes this machine",
    "kernel id": "'kernelpick kernels' lists the kernel ids",
    "scheme": "schemes: " + ", ".join(s.value for s in Scheme),
    "dtype": "dtypes: bfloat16, float16, float32",
}


def _hint(error: KernelpickError) -> str:
    if isinstance(error, UsageError):
        return ""
    if isinstance(error, UnknownNameError):
        return _HINTS.get(error.kind, "")
    return ""


def main(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the command line and return its exit status (the console script exits with it)."""
    env = os.environ if env is None else env
    out = _UntilClosed(_open_or_discard(sys.stdout if out is None else out))
    err = _UntilClosed(_open_or_discard(sys.stderr if err is None else err))
    status = _run(argv, env, out, err)
    out.flush()  # here, not at exit, so that a reader gone by now is handled as any other
    return status


def _run(argv: Sequence[str] | None, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    try:
        # argparse prints --help and --version to sys.stdout and exits; send them to ``out``.
        with contextlib.redirect_stdout(out):
            args = parser().parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_BAD_INPUT
    except KernelpickError as error:
        return _fail(error, err)
    try:
        with _library_log(err):
            return _COMMANDS[args.command](args, env, out, err)
    except KernelpickError as error:
        return _fail(error, err)


@contextlib.contextmanager
def _library_log(err: TextIO) -> Iterator[None]:
    """The library's warnings (a degraded or slow selection) on the command's ``err``, as
    its other diagnostics are, for the command's duration. Without a handler, logging's
    last resort would write them to sys.stderr, which may be closed (``2>&-``) or be the
    stream a ``--json`` reader was promised only JSON on. Nothing else of the logger's is
    changed: records still reach an application's own handlers, and overlapping commands
    (threads) each remove only their own handler."""
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("kernelpick: %(levelname)s: %(message)s"))
    logger = logging.getLogger("kernelpick")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


class _DevNull(io.StringIO):
    """A stream that drops what it is given, as /dev/null does."""

    def write(self, text: str) -> int:
        return len(text)


def _open_or_discard(stream: TextIO | None) -> TextIO:
    # A stream closed from the start (``2>&-``) is None in sys, and print(file=None) writes to
    # sys.stdout: bench's progress and the error lines would land in the --json a script
    # reads. A closed stream, or one whose descriptor is closed, takes nothing either.
    if stream is None or stream.closed:
        return _DevNull()
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a StringIO): it can take text
        return stream
    try:
        os.fstat(fd)
    except OSError:
        return _DevNull()
    return stream


class _UntilClosed(io.StringIO):
    """``stream`` until its reader goes away (a write or a flush meets a broken pipe), then
    nothing, as /dev/null would take it: the command runs to its own end and status."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream: TextIO | None = stream

    def write(self, text: str) -> int:
        self._pass(lambda stream: stream.write(text))
        return len(text)

    def flush(self) -> None:
        self._pass(lambda stream: stream.flush())

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        if self._stream is None:
            return super().fileno()  # io.UnsupportedOperation, as for any stream without one
        return self._stream.fileno()

    def _pass(self, call: Callable[[TextIO], object]) -> None:
        if self._stream is None:
            return
        try:
            call(self._stream)
        except BrokenPipeError:
            _discard(self._stream)
            self._stream = None


def _discard(stream: TextIO) -> None:
    # What is still buffered for the closed pipe would make the interpreter's last flush
    # print "Exception ignored ... BrokenPipeError": point the descriptor at /dev/null.
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file: nothing flushes it at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _fail(error: KernelpickError, err: TextIO) -> int:
    print(f"kernelpick: error: {error}", file=err)
    hint = _hint(error)
    if hint:
        print(f"hint: {hint}", file=err)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
