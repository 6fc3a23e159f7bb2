"""Typed reads of a device-property mapping, shared by the cpu, cuda and rocm translates."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kernelpick.core import InvalidValueError

__all__ = ["Properties", "check_index"]


@attrs.frozen
class Properties:
    """A property mapping (a probe dump or a JSON fixture) read key by key, with errors
    that name the property: ``invalid CUDA property 'major' ...``."""

    values: Mapping[str, object] = attrs.field()
    label: str

    @values.validator
    def _mapping(self, attribute: attrs.Attribute[Mapping[str, object]], value: object) -> None:
        if not isinstance(value, Mapping):
            raise InvalidValueError(
                f"{self.label} properties", value, "a mapping of property names to values"
            )

    def _bad(self, key: str, expected: str) -> InvalidValueError:
        return InvalidValueError(f"{self.label} property {key!r}", self.values.get(key), expected)

    def text(self, key: str) -> str:
        value = self.values.get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def count(self, key: str) -> int:
        value = self.values.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self._bad(key, "a non-negative integer")
        return value

    def flag(self, key: str) -> bool:
        value = self.values.get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def names(self, key: str) -> list[str]:
        value = self.values.get(key)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of names")
        return [str(v) for v in value]

    def toolkit(self, key: str, example: str) -> str:
        """A toolkit version; torch reports None for it on a build for another platform."""
        if key in self.values and self.values[key] is None:
            expected = f"a version such as {example!r}: this torch is not a {self.label} build"
            raise self._bad(key, expected)
        return self.text(key)


def check_index(device_index: object, count: int, label: str) -> int:
    """``device_index`` if it names one of ``count`` visible devices, else an error naming
    the valid range. Never defaults to 0: the caller says which device it means."""
    if (
        not isinstance(device_index, int)
        or isinstance(device_index, bool)
        or not 0 <= device_index < count
    ):
        expected = (
            f"an index from 0 to {count - 1} ({count} {label} device(s) visible)"
            if count > 0
            else f"a {label} device index, but no {label} device is visible"
        )
        raise InvalidValueError(f"{label} device index", device_index, expected)
    return device_index
