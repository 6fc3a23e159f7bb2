"""safetensors files on disk: one file or an index of shards in, one file out.

Reading goes through the header first (names, dtypes, shapes), so a checkpoint is checked
whole before a tensor is read. Writing streams the format (header, then each tensor's bytes)
to a sink, not to a path: the file it goes to is one ``_atomic_files`` created exclusively and
holds open, so no name is opened twice and nothing written follows a link; a tensor is
copied to the CPU one at a time, never the whole model at once.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._atomic_files import Sink
from kernelpick.integration.formats import read_json_object

__all__ = [
    "ALIASES",
    "DTYPES",
    "INDEX_NAME",
    "MAX_HEADER",
    "WEIGHTS_NAME",
    "Checkpoint",
    "checkpoint_files",
    "read_aliases",
    "read_json",
    "unique_tensors",
    "write_safetensors",
]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# Metadata of a file kernelpick writes: tensors saved once, under another name (tied).
ALIASES = "kernelpick.aliases"

# safetensors' dtype names.
DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,  # the MX formats' block scales
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (its config, its index), read as untrusted input."""
    return read_json_object(path, "a checkpoint's JSON file (config.json, an index)")


def checkpoint_files(directory: Path) -> dict[Path, set[str] | None]:
    """Each safetensors file of a checkpoint, with the keys to take from it: one
    ``model.safetensors`` (all of its keys), or the shards its index maps each key to.

    A directory holding both is refused unless the index maps every key to
    ``model.safetensors``: vLLM reads the shards an index names, other readers the single
    file, so the two would be read as two checkpoints."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if not index.is_file():
        if single.is_file():
            return {single: None}
        raise CheckpointError(str(directory), WEIGHTS_NAME, "no such file", "safetensors")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(str(index), "weight_map", repr(weight_map), "a mapping")
    if not weight_map:  # no tensor at all, or a model.safetensors beside it read as none
        raise CheckpointError(str(index), "weight_map", "{}",
                              "each tensor's key mapped to the file holding it")  # fmt: skip
    files: dict[str, set[str]] = {}
    beside = single.is_file()
    for key, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name:
            raise CheckpointError(str(index), key, repr(name), "a file name in this directory")
        if name != WEIGHTS_NAME and beside:
            raise CheckpointError(
                str(index), key, f"{name}, beside a {WEIGHTS_NAME} it does not name",
                f"one checkpoint: {WEIGHTS_NAME} alone, or the index and the shards it names "
                f"(vLLM reads the shards, other readers {WEIGHTS_NAME}); remove the stale one",
            )  # fmt: skip
        keys = files.get(name)
        if keys is None:  # a new shard: one look for it, however many keys it holds
            if not (directory / name).is_file():
                raise CheckpointError(str(index), key, f"{name}, no such file", "a shard beside it")
            keys = files[name] = set()
        keys.add(key)
    return {directory / name: keys for name, keys in files.items()}


def read_aliases(path: Path, metadata: Mapping[str, str]) -> dict[str, str]:
    """The tied names a file's metadata records (``ALIASES``), each mapped to the stored one."""
    text = metadata.get(ALIASES)
    if text is None:
        return {}
    expected = "a JSON object mapping tensor names to tensor names, as save_quantized writes"
    try:
        aliases = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit
        aliases = None
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        shown = text if len(text) <= 80 else f"{text[:77]}..."
        raise CheckpointError(str(path), ALIASES, repr(shown), expected)
    return aliases


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
            for path, keys in checkpoint_files(directory).items():
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
        self.aliases.update(read_aliases(path, handle.metadata() or {}))

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
        return DTYPES.get(name, name), tuple(piece.get_shape())

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
        if ident in same and tensor.numel():  # empty tensors share no bytes: each is its own
            aliases[key] = same[ident]
            continue
        if storage in storages or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()  # a view of a kept tensor: its own bytes
        same[ident] = key
        storages.add(storage)
        kept[key] = tensor
    return kept, aliases


# safetensors' readers refuse a larger header (safetensors' MAX_HEADER_SIZE).
MAX_HEADER = 100_000_000


def _unencodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return True
    return False


def write_safetensors(out: Sink, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Write ``state`` to ``out`` as one safetensors file (``where`` names it in errors): each
    storage once, the tied names in the metadata (``ALIASES``).

    The header lists the tensors by element size, largest first, so each one's bytes start
    at a multiple of it (the header's length is padded to 8), as safetensors lays them out.
    """
    if sys.byteorder != "little":  # torch's bytes are the host's, safetensors' little-endian
        raise CheckpointError(where, "", "a big-endian host", "a little-endian one")
    tensors, aliases = unique_tensors(state)
    for key, tensor in tensors.items():
        if key == "__metadata__" or _unencodable(key):
            expected = "a tensor name safetensors can store (UTF-8 text, not __metadata__)"
            raise CheckpointError(where, repr(key), "a name no reader takes", expected)
        if tensor.is_meta:
            raise CheckpointError(where, key, "a tensor on the meta device", "a tensor with data")
        if tensor.dtype not in _NAMES:
            valid = ", ".join(str(dtype) for dtype in _NAMES)
            raise CheckpointError(where, key, str(tensor.dtype), f"a dtype of {valid}")
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, Any] = {
        "__metadata__": {"format": "pt", ALIASES: json.dumps(aliases, sort_keys=True)}
    }
    offset = 0
    for key in order:
        tensor = tensors[key]
        size = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER:
        found = f"a header of {len(text)} bytes ({len(tensors)} tensors)"
        raise CheckpointError(where, "", found, f"at most {MAX_HEADER} bytes, safetensors' limit")
    out(len(text).to_bytes(8, "little") + text)
    for key in order:
        flat = tensors[key].detach().to("cpu").contiguous().reshape(-1)
        out(flat.view(torch.uint8).numpy().data)
