"""The ``kernelpick`` command: explain, matrix, devices, kernels, bench, plan, inspect.

Exit status: 0 when a kernel is selected (and for the listing commands), 2 when every
kernel was turned down (``plan``: for any layer on any device), 1 on bad input, usage
errors included, so that argparse's own status 2 is never read as a rejection. 141 (128
+ SIGPIPE, what a shell reports for a C tool killed by the signal) when stdout was
closed early, as in ``kernelpick matrix | head -1``: the command stops quietly, without
a traceback, and ``set -o pipefail`` still sees that the output was cut short. A stream
closed before the command starts (``2>&-``, ``>&-``) takes nothing, as /dev/null would:
without a stderr, progress and errors are dropped, never sent to stdout.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TextIO

from kernelpick.cli._bench import bench
from kernelpick.cli._commands import COMMANDS, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED
from kernelpick.cli._inspect import inspect
from kernelpick.cli._parser import UsageError, parser
from kernelpick.cli._plan import plan
from kernelpick.core import KernelpickError, Scheme, UnknownNameError

__all__ = ["EXIT_BAD_INPUT", "EXIT_BROKEN_PIPE", "EXIT_REJECTED", "EXIT_SELECTED", "main"]

EXIT_BROKEN_PIPE = 141
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
    out = _open_or_discard(sys.stdout if out is None else out)
    err = _open_or_discard(sys.stderr if err is None else err)
    try:
        status = _run(argv, env, out, err)
        out.flush()  # here, not at exit, so that a closed pipe is caught below
    except BrokenPipeError:
        _discard(out)
        return EXIT_BROKEN_PIPE
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
    stream a ``--json`` reader was promised only JSON on."""
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("kernelpick: %(levelname)s: %(message)s"))
    logger = logging.getLogger("kernelpick")
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # the application's own handlers, if any, are not ours to use
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


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


def _discard(out: TextIO) -> None:
    # What is still buffered for the closed pipe would make the interpreter's last flush
    # print "Exception ignored ... BrokenPipeError": point the descriptor at /dev/null.
    try:
        fd = out.fileno()
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
