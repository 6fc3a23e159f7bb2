"""The one error hierarchy of kernelpick.

Every error the library raises for bad input derives from :class:`KernelpickError`, which
is a :class:`ValueError`, so an engine that already catches ``ValueError`` around its
quantization set-up keeps working. Each error carries the value that explains it. The
small validators shared by several value classes live here too, next to the error they raise.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable
from typing import TypeGuard, TypeVar

import attrs

__all__ = [
    "InvalidValueError",
    "KernelInputError",
    "KernelpickError",
    "UnknownNameError",
    "close_matches",
    "is_bool",
    "is_positive_int",
    "parse_enum",
    "positive_int",
]

E = TypeVar("E", bound=enum.Enum)


class KernelpickError(ValueError):
    """Root of every kernelpick error."""


def close_matches(value: object, choices: Iterable[str]) -> tuple[str, ...]:
    """The choices ``value`` may have meant: the one it spells in other case, else every one
    it begins (``fp8`` begins five schemes, all equally meant), else the one nearest by
    spelling, else none."""
    text = str(value).strip().lower()
    names = list(choices)
    for test in (str.__eq__, str.startswith):
        found = tuple(c for c in names if text and test(c.lower(), text))
        if found:
            return found
    matches = difflib.get_close_matches(text, [c.lower() for c in names], n=1, cutoff=0.6)
    by_lower = {c.lower(): c for c in names}
    return tuple(by_lower[m] for m in matches)


class UnknownNameError(KernelpickError):
    """A name (device profile, scheme, kernel id, dtype, ...) that is not one of the known ones.

    ``kind`` says what was being named, ``value`` is what was given, ``choices`` the valid
    names and ``candidates`` those it may have meant (see ``close_matches``); ``closest`` is
    the one candidate, where there is exactly one.
    """

    def __init__(self, kind: str, value: object, choices: Iterable[str]) -> None:
        self.kind = kind
        self.value = value
        self.choices = tuple(choices)
        self.candidates = close_matches(value, self.choices)
        super().__init__(
            f"unknown {kind} {value!r}{_did_you_mean(self.candidates)} Known {kind}s: "
            f"{', '.join(self.choices) if self.choices else '(none)'}"
        )

    @property
    def closest(self) -> str | None:
        return self.candidates[0] if len(self.candidates) == 1 else None

    def __reduce__(self) -> tuple[type[UnknownNameError], tuple[str, object, tuple[str, ...]]]:
        return (type(self), (self.kind, self.value, self.choices))


def _did_you_mean(candidates: tuple[str, ...]) -> str:
    if not candidates:
        return "."
    if len(candidates) == 1:
        return f"; did you mean {candidates[0]!r}?"
    return f"; did you mean one of {', '.join(map(repr, candidates))}?"


class InvalidValueError(KernelpickError):
    """A value of the right kind but out of its valid range, or malformed.

    ``what`` names the field, ``value`` is what was given, ``expected`` says what is valid.
    """

    def __init__(self, what: str, value: object, expected: str) -> None:
        self.what = what
        self.value = value
        self.expected = expected
        super().__init__(f"invalid {what} {value!r}: expected {expected}")

    def __reduce__(self) -> tuple[type[InvalidValueError], tuple[str, object, str]]:
        return (type(self), (self.what, self.value, self.expected))


def is_bool(_inst: object, attribute: attrs.Attribute[bool], value: object) -> None:
    """An attrs validator: ``value`` is True or False (1, 0 and "yes" are refused)."""
    if not isinstance(value, bool):
        raise InvalidValueError(attribute.name, value, "True or False")


def is_positive_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int of 1 or more. bool is an int subclass, and True as a size
    or a count is always a slip, so it is refused."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(what: str, value: object, expected: str = "a positive integer") -> int:
    """``value`` if it is a positive int (see ``is_positive_int``), else
    ``InvalidValueError(what, value, expected)``."""
    if not is_positive_int(value):
        raise InvalidValueError(what, value, expected)
    return value


def parse_enum(cls: type[E], value: object, kind: str) -> E:
    """The member of a string-valued enum from a member or its value, case and spaces ignored."""
    if isinstance(value, cls):
        return value
    text = str(value).strip().lower()
    try:
        return cls(text)
    except ValueError:
        pass
    # Values that are not lower case themselves (KernelKind's "W8A8") are matched this way.
    for member in cls:
        if str(member.value).lower() == text:
            return member
    raise UnknownNameError(kind, value, [str(member.value) for member in cls])


class KernelInputError(KernelpickError):
    """A tensor handed to a kernel that it cannot take, caught before anything is launched.

    ``tensor`` names the argument; ``shape``, ``dtype`` and ``device`` describe what came;
    ``expected`` says what the kernel takes.
    """

    def __init__(
        self, tensor: str, shape: tuple[int, ...], dtype: str, device: str, expected: str
    ) -> None:
        self.tensor = tensor
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.expected = expected
        got = f"shape {list(shape)}, dtype {dtype}, device {device}"
        super().__init__(f"{tensor}: got {got}; expected {expected}")

    def __reduce__(
        self,
    ) -> tuple[type[KernelInputError], tuple[str, tuple[int, ...], str, str, str]]:
        return (type(self), (self.tensor, self.shape, self.dtype, self.device, self.expected))
