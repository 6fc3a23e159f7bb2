"""The ``kernelpick`` command: explain, matrix, devices, kernels, bench.

Exit status: 0 when a kernel is selected (and for the listing commands), 2 when every
kernel was turned down, 1 on bad input, usage errors included, so that argparse's own
status 2 is never read as a rejection.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

import kernelpick as kp
from kernelpick.cli._commands import COMMANDS, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED
from kernelpick.cli._parser import UsageError, parser

__all__ = ["EXIT_BAD_INPUT", "EXIT_REJECTED", "EXIT_SELECTED", "main"]

# One line of what to do next, by what was unknown.
_HINTS = {
    "device profile": "'kernelpick devices' lists the profiles; --device auto probes this machine",
    "kernel id": "'kernelpick kernels' lists the kernel ids",
    "scheme": "schemes: " + ", ".join(s.value for s in kp.Scheme),
    "dtype": "dtypes: bfloat16, float16, float32",
}


def _hint(error: kp.KernelpickError) -> str:
    if isinstance(error, UsageError):
        return ""
    if isinstance(error, kp.UnknownNameError):
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
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        # argparse prints --help to sys.stdout and exits; send it to ``out`` and return.
        with contextlib.redirect_stdout(out):
            args = parser().parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_BAD_INPUT
    except kp.KernelpickError as error:
        return _fail(error, err)
    try:
        return COMMANDS[args.command](args, env, out)
    except kp.KernelpickError as error:
        return _fail(error, err)


def _fail(error: kp.KernelpickError, err: TextIO) -> int:
    print(f"kernelpick: error: {error}", file=err)
    hint = _hint(error)
    if hint:
        print(f"hint: {hint}", file=err)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
