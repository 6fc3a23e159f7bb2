"""Typing helpers the core needs without depending on typing_extensions."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["assert_never"]


def assert_never(value: NoReturn, /) -> NoReturn:
    """Mark a branch unreachable: mypy proves it, and at run time it raises.

    End a ``match`` on a ``Decision`` with it, so a new outcome type cannot go unhandled.
    """
    raise AssertionError(f"unhandled value: {value!r} ({type(value).__name__})")
