"""Running the ``kernelpick`` command in-process, and checking that wrapped text fits."""

from __future__ import annotations

import io
import re

from kernelpick.cli import main

__all__ = ["Tty", "assert_fits", "fragments", "joined", "parts", "run_cli", "words"]


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


def parts(word: str) -> list[str]:
    return re.findall(r"[^_-]*[_-]|[^_-]+", word) or [word]


def fragments(text: str) -> set[str]:
    """The words of ``text`` and every run of their parts between underscores and hyphens:
    all that a line wrapped without cutting a word can hold."""
    found = set()
    for word in text.split():
        pieces = parts(word)
        found |= {
            "".join(pieces[i:j]) for i in range(len(pieces)) for j in range(i + 1, len(pieces) + 1)
        }
    return found


def assert_fits(out: str, width: int, whole: str) -> None:
    """No line of ``out`` is wider than ``width`` unless it holds one word that cannot break,
    and every word is whole, or cut only after an underscore or a hyphen (``whole``: the
    same output unwrapped). A header repeated as ``header:`` counts as its word."""
    allowed = fragments(whole)
    for line in out.splitlines():
        if len(line) > width:
            assert len(line.split()) == 1, (width, line)
            assert len(parts(line.strip())) == 1, (width, line)
        for word in line.split():
            assert word in allowed or word.removesuffix(":") in allowed, (width, word, line)


def joined(text: str) -> str:
    # Words, with the breaks after an underscore or a hyphen closed up again.
    return re.sub(r"(?<=[_-]) ", "", words(text))
