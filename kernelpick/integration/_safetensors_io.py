"""safetensors files on disk: one file or an index of shards in, one file out.

Reading goes through the header first (names, dtypes, shapes), so a checkpoint is checked
whole before a tensor is read; writing goes to a temporary file renamed into place, so a
failed save never leaves half a checkpoint under the real name.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from kernelpick.integration._errors import CheckpointError

__all__ = [
    "ALIASES",
    "INDEX_NAME",
    "WEIGHTS_NAME",
    "Checkpoint",
    "read_json",
    "unique_tensors",
    "write_atomically",
    "write_safetensors",
]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# Metadata of a file kernelpick writes: tensors saved once, under another name (tied).
ALIASES = "kernelpick.aliases"

# safetensors' dtype names.
_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(str(path), "", "no such file", "a JSON file") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(str(path), "", str(error), "a readable JSON file") from error
    if not isinstance(data, dict):
        raise CheckpointError(str(path), "", type(data).__name__, "a JSON object")
    return data


def _files(directory: Path) -> dict[Path, set[str] | None]:
    """Each safetensors file of a checkpoint, with the keys to take from it: one
    ``model.safetensors`` (all of its keys), or the shards its index maps each key to."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file():
        return {single: None}
    if not index.is_file():
        raise CheckpointError(str(directory), WEIGHTS_NAME, "no such file", "safetensors")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(str(index), "weight_map", repr(weight_map), "a mapping")
    files: dict[Path, set[str]] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name:
            raise CheckpointError(str(index), key, repr(name), "a file name in this directory")
        files.setdefault(directory / name, set()).add(key)
    return {path: keys for path, keys in files.items()}


class Checkpoint:
    """The tensors of a checkpoint directory, by name: headers read up front, data on demand.

    Use as a context manager; files stay open until it exits.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stack = contextlib.ExitStack()
        self._where: dict[str, Any] = {}
        self._path: dict[str, Path] = {}
        self.aliases: dict[str, str] = {}
        try:
            for path, keys in _files(directory).items():
                self._open(path, keys)
        except BaseException:
            self._stack.close()
            raise

    def _open(self, path: Path, keys: set[str] | None) -> None:
        """Open ``path`` and take ``keys`` from it (every key, for a single file)."""
        try:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
        except (OSError, SafetensorError) as error:
            raise CheckpointError(str(path), "", str(error), "a safetensors file") from error
        held: set[str] = set(handle.keys())
        missing = sorted((keys or set()) - held)
        if missing:
            listed = ", ".join(missing[:5])
            raise CheckpointError(
                str(path), "tensors", f"none for {listed}", "what the index lists"
            )
        for key in held if keys is None else keys:
            self._where[key] = handle
            self._path[key] = path
        self.aliases.update(json.loads((handle.metadata() or {}).get(ALIASES, "{}")))

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def keys(self) -> set[str]:
        return set(self._where)

    def source(self, key: str) -> str | None:
        """The stored name holding ``key``: itself, or what it was saved as an alias of."""
        if key in self._where:
            return key
        alias = self.aliases.get(key)
        return alias if alias in self._where else None

    def describe(self, key: str) -> tuple[torch.dtype | str, tuple[int, ...]]:
        """(dtype, or safetensors' name for one torch lacks; shape) from the header."""
        piece = self._where[key].get_slice(key)
        name = piece.get_dtype()
        return _DTYPES.get(name, name), tuple(piece.get_shape())

    def where(self, key: str) -> str:
        return f"{self._path[key]}: {key}"

    def read(self, key: str) -> torch.Tensor:
        tensor: torch.Tensor = self._where[key].get_tensor(key)
        return tensor


def unique_tensors(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors to write, each storage once (safetensors refuses shared memory), and the
    names dropped as aliases of a kept one (tied weights)."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    same: dict[tuple[object, ...], str] = {}
    storages: set[tuple[torch.device, int]] = set()
    for key, value in state.items():
        tensor = value.detach()
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        ident = (*storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                 tensor.dtype)  # fmt: skip
        if ident in same:
            aliases[key] = same[ident]
            continue
        if storage in storages or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()  # a view of a kept tensor: its own bytes
        same[ident] = key
        storages.add(storage)
        kept[key] = tensor
    return kept, aliases


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` to a temporary file beside ``path``, then rename it into place."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def write_safetensors(directory: Path, state: Mapping[str, torch.Tensor]) -> None:
    tensors, aliases = unique_tensors(state)
    metadata = {"format": "pt", ALIASES: json.dumps(aliases, sort_keys=True)}
    write_atomically(
        directory / WEIGHTS_NAME, lambda path: save_file(tensors, str(path), metadata=metadata)
    )
