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
    "closest_match",
    "is_bool",
    "is_positive_int",
    "parse_enum",
    "positive_int",
]

E = TypeVar("E", bound=enum.Enum)


class KernelpickError(ValueError):
    """Root of every kernelpick error."""


def closest_match(value: object, choices: Iterable[str]) -> str | None:
    """The choice nearest to ``value`` by spelling, or None when nothing is close."""
    text = str(value).strip().lower()
    matches = difflib.get_close_matches(text, [c.lower() for c in choices], n=1, cutoff=0.6)
    if not matches:
        return None
    by_lower = {c.lower(): c for c in choices}
    return by_lower[matches[0]]


class UnknownNameError(KernelpickError):
    """A name (device profile, scheme, kernel id, dtype, ...) that is not one of the known ones.

    ``kind`` says what was being named, ``value`` is what was given, ``choices`` the valid
    names and ``closest`` the nearest valid name, if any is close.
    """

    def __init__(self, kind: str, value: object, choices: Iterable[str]) -> None:
        self.kind = kind
        self.value = value
        self.choices = tuple(choices)
        self.closest = closest_match(value, self.choices)
        hint = f"; did you mean {self.closest!r}?" if self.closest is not None else "."
        listed = ", ".join(self.choices) if self.choices else "(none)"
        super().__init__(f"unknown {kind} {value!r}{hint} Known {kind}s: {listed}")

    def __reduce__(self) -> tuple[type[UnknownNameError], tuple[str, object, tuple[str, ...]]]:
        return (type(self), (self.kind, self.value, self.choices))


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
