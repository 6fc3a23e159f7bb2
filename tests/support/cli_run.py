"""Running the ``kernelpick`` command in-process, and checking that wrapped text fits."""

from __future__ import annotations

import io

from kernelpick.cli import main

__all__ = ["Tty", "assert_fits", "run_cli", "words"]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_cli(
    *argv: str, env: dict[str, str] | None = None, tty: bool = False
) -> tuple[int, str, str]:
    out: io.StringIO = Tty() if tty else io.StringIO()
    err = io.StringIO()
    status = main(list(argv), env={} if env is None else env, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def words(text: str) -> str:
    return " ".join(text.split())


def assert_fits(out: str, width: int, whole: str) -> None:
    """No line of ``out`` is wider than ``width`` unless it holds one word, and every word of
    ``out`` is a word of ``whole`` (the same output unwrapped): none is cut, a kernel id at
    an underscore included. A header repeated as ``header:`` counts as its word."""
    allowed = set(whole.split())
    for line in out.splitlines():
        if len(line) > width:
            assert len(line.split()) == 1, (width, line)
        for word in line.split():
            assert word in allowed or word.removesuffix(":") in allowed, (width, word, line)
