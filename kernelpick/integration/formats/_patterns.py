"""Which modules the patterns of a quantization config name, by the engines' own rules,
matched in time linear in the name.

Two rules, both written for Python's ``re``:

- transformers' ``modules_to_not_convert`` (``should_convert_module``), which kernelpick's
  own config, its vLLM plugin and FineGrainedFP8 checkpoints use: a pattern keeps a module
  when it matches the name from the start up to a module boundary (``"model.layers.1"``
  keeps ``model.layers.1.mlp.up_proj``, not ``model.layers.11.mlp.up_proj``), as a regex
  with the same boundary (``"model.layers.*"``), or as a suffix of the name
  (``"down_proj"``). ``"mlp"`` alone keeps nothing inside the layers.
- compressed-tensors' ``re:`` prefix: the regex matched from the start of the name.

A config is untrusted input, and Python's backtracking takes exponential time on patterns
such as ``(.*.*)*X``; so the patterns are matched by RE2, and a pattern is read only if both
regex engines read it alike: Python's ``re`` compiles it as the engine's rule does (else vLLM or
transformers raise ``re.error`` later), RE2 compiles it (no lookaround, back-references,
``\\Z``, atomic or possessive repeats), and it spells nothing the two read differently
(``_READ_TWO_WAYS``). A pattern with no regex syntax at all is matched as the text it is,
without RE2.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from kernelpick.core import InvalidValueError
from kernelpick.integration.formats._re2 import Regex, compile_re2

__all__ = ["check_patterns", "ct_matches", "ct_refusal", "kept", "not_convert_refusal"]

# transformers' boundary (should_convert_module): after a dot, before one, or at the end.
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"
# The characters that mean something to a regex (those re.escape escapes).
_SYNTAX = frozenset("()[]{}?*+-|^$\\.&~# \t\n\r\v\f")
# Spellings Python's re and RE2 read differently (or RE2 not at all), and what each makes of them.
_READ_TWO_WAYS = {
    "{,": "{,n} is a repetition to Python's re and text to RE2: write {0,n}",
    "[:": "[:name:] inside a set is a POSIX class to RE2 and characters to Python's re",
    **dict.fromkeys(
        (f"\\{digit}" for digit in "123456789"),
        "\\1 to \\99 are back-references to Python's re, which RE2 does not have (RE2 reads "
        "\\12 as an octal escape)",
    ),
}


def _literal(pattern: str) -> bool:
    return _SYNTAX.isdisjoint(pattern)


def _refusal(pattern: str, as_python_reads_it: str) -> str | None:
    if _literal(pattern):
        return None
    for spelling, why in _READ_TWO_WAYS.items():
        if spelling in pattern:
            return why
    try:
        re.compile(as_python_reads_it)
    except (re.error, RecursionError, OverflowError) as error:
        return f"Python's re cannot read it ({error})"
    compiled = _compiled(pattern)
    if isinstance(compiled, str):
        return f"RE2, which matches in linear time, cannot read it ({compiled})"
    return None


def not_convert_refusal(pattern: str) -> str | None:
    """Why the ``modules_to_not_convert`` entry ``pattern`` cannot be matched as
    transformers matches it, or None when it can."""
    return _refusal(pattern, rf"(?:{pattern}){_BOUNDARY}")


def ct_refusal(regex: str) -> str | None:
    """Why a compressed-tensors ``re:`` pattern (``regex``, without the prefix) cannot be
    matched as compressed-tensors matches it, or None when it can."""
    return _refusal(regex, regex)


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> Regex | str:
    return compile_re2(pattern)


# Classes RE2 reads as ASCII and Python's re as Unicode: the same on an ASCII name only.
_ASCII_CLASSES = tuple(f"\\{c}" for c in "wWdDsSbB")


def _regex(pattern: str, name: str) -> Regex:
    """``pattern`` compiled (once), to be matched against ``name``; one no config check has
    read (a model's own ``_keep_in_fp32_modules``) is refused here, and so is a class the
    two engines read differently on this name's non-ASCII characters."""
    if not name.isascii() and any(c in pattern for c in _ASCII_CLASSES):
        raise InvalidValueError(
            f"module pattern for the non-ASCII name {name!r}", pattern,
            "a pattern without \\w, \\d, \\s or \\b (RE2 reads them as ASCII, Python's re as "
            "Unicode): spell the characters out in a set",
        )  # fmt: skip
    compiled = _compiled(pattern)
    if isinstance(compiled, str):
        raise InvalidValueError("module pattern", pattern, f"a regex RE2 reads ({compiled})")
    return compiled


def _boundary(name: str, end: int) -> bool:
    return end == len(name) or name[end] == "." or (end > 0 and name[end - 1] == ".")


def _keeps(name: str, pattern: str) -> bool:
    if name.endswith(pattern):
        return True
    if _literal(pattern):
        return name.startswith(pattern) and _boundary(name, len(pattern))
    regex = _regex(pattern, name)
    # Exactly name[:end] for each boundary end, the whole name staying the context, so an
    # anchor inside the pattern means what it means to Python's re over the whole name.
    return regex.matches_prefix(name) and any(
        regex.matches_exactly(name, end) for end in range(len(name) + 1) if _boundary(name, end)
    )


def kept(name: str, patterns: Iterable[str]) -> bool:
    """Whether the ``modules_to_not_convert`` entries ``patterns`` keep the module called
    ``name`` in high precision (transformers' rule)."""
    return any(_keeps(name, pattern) for pattern in patterns)


def ct_matches(name: str, regex: str) -> bool:
    """Whether a compressed-tensors ``re:`` pattern (``regex``) matches ``name`` from its
    start."""
    if _literal(regex):
        return name.startswith(regex)
    return _regex(regex, name).matches_prefix(name)


def check_patterns(patterns: object) -> tuple[str, ...]:
    """``patterns`` as a tuple of ``modules_to_not_convert`` entries, non-empty strings that
    ``kept`` can match; or ``InvalidValueError`` naming the first that is not."""
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
        expected = "a list of module names or patterns (non-empty strings)"
        raise InvalidValueError("modules_to_not_convert", patterns, expected)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            expected = "module names or patterns: non-empty strings"
            raise InvalidValueError("modules_to_not_convert entry", pattern, expected)
        refusal = not_convert_refusal(pattern)
        if refusal is not None:
            expected = f"a name, a suffix or a regex Python's re and RE2 read alike: {refusal}"
            raise InvalidValueError("modules_to_not_convert entry", pattern, expected)
    return tuple(patterns)
