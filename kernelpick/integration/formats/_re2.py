"""RE2 (the ``google-re2`` bindings) behind one small typed wrapper.

RE2 matches in time linear in the text, where Python's backtracking ``re`` can take
exponential time (``(.*.*)*X``), so patterns read from a checkpoint's config are matched
here. The bindings are imported on the first compile, so that ``import kernelpick`` works
where they are absent; then a pattern that needs them raises ``Re2UnavailableError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import attrs

from kernelpick.core import KernelpickError

__all__ = ["Re2UnavailableError", "Regex", "compile_re2"]


class Re2UnavailableError(KernelpickError):
    """A regular expression from a quantization config is to be matched where the
    ``google-re2`` bindings cannot be imported."""

    def __init__(self, pattern: str, cause: str) -> None:
        self.pattern = pattern
        self.cause = cause
        super().__init__(
            f"the pattern {pattern!r} is matched by RE2, in linear time, and google-re2 "
            f"cannot be imported here ({cause}): pip install google-re2"
        )

    def __reduce__(self) -> tuple[type[Re2UnavailableError], tuple[str, str]]:
        return (type(self), (self.pattern, self.cause))


_loaded: list[ModuleType] = []  # the bindings, once imported


def _bindings(pattern: str) -> ModuleType:
    if not _loaded:
        try:
            _loaded.append(importlib.import_module("re2"))
        except ImportError as error:
            raise Re2UnavailableError(pattern, f"{type(error).__name__}: {error}") from error
    return _loaded[0]


@attrs.frozen
class Regex:
    """A compiled RE2 pattern. Positions are characters of the text, which stays the
    context of every anchor: ``$`` matches at its end only, ``\\b`` looks past ``end``."""

    _compiled: Any

    def matches_prefix(self, text: str) -> bool:
        """Whether it matches some prefix of ``text`` (Python's ``re.match``)."""
        return self._compiled.match(text) is not None

    def matches_exactly(self, text: str, end: int) -> bool:
        """Whether it matches ``text[:end]`` whole, with ``text`` as the context."""
        return self._compiled.fullmatch(text, 0, end) is not None


def compile_re2(pattern: str) -> Regex | str:
    """``pattern`` compiled by RE2, or RE2's reason it cannot be (a syntax RE2 does not
    have: lookaround, back-references, ...). Raises ``Re2UnavailableError`` where the
    bindings are absent."""
    re2 = _bindings(pattern)
    options = re2.Options()
    options.log_errors = False  # the reason is returned, not printed to stderr by absl
    try:
        return Regex(re2.compile(pattern, options))
    except re2.error as error:
        reason = error.args[0] if error.args else error
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    except UnicodeEncodeError as error:  # a lone surrogate: RE2 reads UTF-8
        return f"not UTF-8 text ({error.reason} at position {error.start})"
