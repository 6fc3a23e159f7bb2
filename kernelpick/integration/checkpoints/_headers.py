"""A safetensors file's header, read and checked without touching its data.

The header is parsed here rather than by ``safetensors.safe_open`` so that every refusal
names the file and the entry at fault and says what is valid (safe_open reports one
message for the file), and so that nothing of the data is mapped: ``read_ints`` reads the
bytes of one small integer tensor, the only data ``inspect`` ever reads. The checks are
safetensors' own, so a file read here is one its loaders take: an 8-byte little-endian
length, a header of at most ``MAX_HEADER`` bytes inside the file, a JSON object (a
duplicate name refused: it could be read two ways) of string metadata and tensors of a
known dtype, a shape of non-negative ints and ``data_offsets`` whose span holds exactly
the tensor's bytes; the tensors tile the data section end to end, with no gap, no overlap
and nothing after the last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._safetensors_io import DTYPES, MAX_HEADER

__all__ = ["FileHeader", "TensorEntry", "read_header", "read_ints"]

_LENGTH = 8  # the header's length, a little-endian u64, comes first
_INTS = {"I32": 4, "I64": 8}  # the dtypes read_ints reads, by element size


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _Duplicate(key)
        found[key] = value
    return found


@attrs.frozen
class TensorEntry:
    """One tensor of a header: its safetensors ``dtype`` name, ``shape`` and the bytes of
    the data section it spans, ``[start, end)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


@attrs.frozen
class FileHeader:
    """A safetensors file's header: its tensors in header order, its string ``metadata``,
    the file's ``size`` and where its data section begins (``base``)."""

    path: Path
    size: int
    base: int
    metadata: tuple[tuple[str, str], ...]
    tensors: tuple[TensorEntry, ...]


def _refuse(path: Path, key: str, found: str, expected: str) -> CheckpointError:
    return CheckpointError(str(path), key, found, expected)


def _shape(path: Path, name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise _refuse(path, name, f"shape {value!r}", "a shape: a list of non-negative ints")
    return tuple(value)


def _entry(path: Path, name: str, value: object, data: int) -> TensorEntry:
    """One tensor's entry, checked against the ``data`` bytes the file holds after its header."""
    if not isinstance(value, dict):
        raise _refuse(path, name, repr(value)[:80], "an object of dtype, shape and data_offsets")
    dtype = value.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _refuse(
            path,
            name,
            f"dtype {dtype!r}",
            f"one of safetensors' dtypes kernelpick reads: {', '.join(DTYPES)}",
        )
    shape = _shape(path, name, value.get("shape"))
    offsets = value.get("data_offsets")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise _refuse(path, name, f"data_offsets {offsets!r}",
                      "[start, end]: two non-negative ints, start <= end")  # fmt: skip
    start, end = offsets
    if end > data:
        raise _refuse(path, name, f"bytes {start}..{end} of the data section",
                      f"a range inside the file: its data section has {data} bytes")  # fmt: skip
    numel = 1
    for extent in shape:
        numel *= extent
    size = numel * DTYPES[dtype].itemsize
    if end - start != size:
        raise _refuse(path, name, f"{end - start} bytes for {dtype} {list(shape)}",
                      f"{size} bytes: the elements times their size")  # fmt: skip
    return TensorEntry(name, dtype, shape, start, end)


def _metadata(path: Path, value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _refuse(path, "__metadata__", repr(value)[:80], "an object of strings")
    return tuple(value.items())


def _check_tiling(path: Path, tensors: list[TensorEntry], data: int) -> None:
    end = 0
    for entry in sorted(tensors, key=lambda t: (t.start, t.end)):
        if entry.start != end:
            raise _refuse(
                path, entry.name, f"data from byte {entry.start}, the one before ending at {end}",
                "tensors laid end to end from the start of the data section: no gap, no overlap",
            )  # fmt: skip
        end = entry.end
    if end != data:
        raise _refuse(path, "data", f"{data - end} bytes after the last tensor",
                      "a data section that ends with its last tensor")  # fmt: skip


def read_header(path: Path) -> FileHeader:
    """``path``'s header, checked as safetensors checks it (see the module), or a
    ``CheckpointError`` naming the file and the entry; no tensor data is read."""
    try:
        with path.open("rb") as file:
            size = path.stat().st_size
            head = file.read(_LENGTH)
            length = int.from_bytes(head, "little") if len(head) == _LENGTH else None
            if length is None or length > min(MAX_HEADER, size - _LENGTH):
                found = f"a file of {size} bytes" if length is None else (
                    f"a header of {length} bytes in a file of {size}"
                )  # fmt: skip
                raise _refuse(path, "header", found, f"an 8-byte length, then a header of at "
                              f"most {MAX_HEADER} bytes that the file holds")  # fmt: skip
            text = file.read(length)
    except OSError as error:
        raise _refuse(path, "", str(error), "a readable safetensors file") from error
    try:
        parsed = json.loads(text.decode("utf-8"), object_pairs_hook=_unique)
    except _Duplicate as duplicate:
        raise _refuse(path, duplicate.key, "two entries", "one entry per name") from None
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested past the limit
        raise _refuse(path, "header", str(error), "a JSON object in UTF-8") from None
    if not isinstance(parsed, dict):
        raise _refuse(path, "header", type(parsed).__name__, "a JSON object")
    data = size - _LENGTH - length
    metadata = _metadata(path, parsed.pop("__metadata__", {}))
    tensors = [_entry(path, name, value, data) for name, value in parsed.items()]
    _check_tiling(path, tensors, data)
    return FileHeader(path, size, _LENGTH + length, metadata, tuple(tensors))


def read_ints(header: FileHeader, entry: TensorEntry) -> tuple[int, ...]:
    """The values of ``entry``, a small int32 or int64 tensor of ``header``'s file: the one
    read of tensor data ``inspect`` makes (a layer's ``weight_shape``)."""
    width = _INTS.get(entry.dtype)
    if width is None:
        raise _refuse(header.path, entry.name, entry.dtype, f"one of {', '.join(_INTS)}")
    try:
        with header.path.open("rb") as file:
            file.seek(header.base + entry.start)
            raw = file.read(entry.nbytes)
    except OSError as error:
        raise _refuse(header.path, entry.name, str(error), "a readable tensor") from error
    if len(raw) != entry.nbytes:  # the file shrank since its header was read
        raise _refuse(header.path, entry.name, f"{len(raw)} bytes", f"{entry.nbytes} bytes")
    return tuple(
        int.from_bytes(raw[i : i + width], "little", signed=True) for i in range(0, len(raw), width)
    )
