"""What every fuzz target accepts as an outcome: a value, or a kernelpick error that names
the value it refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import kernelpick.core as core

T = TypeVar("T")


def outcome(call: Callable[[], T]) -> T | None:
    """``call()``'s value, or None after a well-formed kernelpick error; anything else raises."""
    try:
        return call()
    except core.KernelpickError as error:
        value = getattr(error, "value", None)
        if repr(value) not in str(error):
            raise AssertionError(
                f"{type(error).__name__} does not name {value!r}: {error}"
            ) from error
        return None
