"""Every tensor a checkpoint stores, from its headers alone, for ``inspect``: each file's
header, each key in the file its index names (a shard lacking a key the index lists for
it, or holding one the index maps elsewhere, is refused), and the names saved as aliases
of a stored tensor (tied weights, ``kernelpick.aliases``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._headers import FileHeader, TensorEntry, read_header
from kernelpick.integration.checkpoints._safetensors_io import (
    ALIASES,
    INDEX_NAME,
    checkpoint_files,
    read_aliases,
)

__all__ = ["Stored", "read_stored"]


@attrs.frozen
class Stored:
    """Every tensor a checkpoint stores, by name (the header and entry holding it), and
    the names saved as aliases of one (tied weights)."""

    directory: Path
    entries: Mapping[str, tuple[FileHeader, TensorEntry]]
    aliases: Mapping[str, str]

    def get(self, name: str) -> tuple[FileHeader, TensorEntry] | None:
        found = self.entries.get(name)
        return found if found is not None else self.entries.get(self.aliases.get(name, ""))

    def names(self) -> Iterator[str]:
        """Stored names in file order, then the aliases."""
        yield from self.entries
        yield from (name for name in self.aliases if name not in self.entries)


def read_stored(root: Path) -> tuple[Stored, tuple[FileHeader, ...]]:
    """Every file's header, each key where the index (if any) says it is, and the aliases."""
    entries: dict[str, tuple[FileHeader, TensorEntry]] = {}
    aliases: dict[str, str] = {}
    headers = []
    for path, keys in checkpoint_files(root).items():
        header = read_header(path)
        names = {entry.name for entry in header.tensors}
        missing = sorted((keys or set()) - names)
        if missing:
            raise CheckpointError(str(path), "tensors", f"none for {', '.join(missing[:5])}",
                                  f"the tensors {INDEX_NAME} lists for it")  # fmt: skip
        for entry in header.tensors:
            if keys is not None and entry.name not in keys:
                raise CheckpointError(
                    str(path), entry.name, "a tensor the index maps to another file, or none",
                    f"only the tensors {INDEX_NAME} maps to {path.name}",
                )  # fmt: skip
            entries[entry.name] = (header, entry)
        aliases.update(read_aliases(path, dict(header.metadata)))
        headers.append(header)
    for alias, target in aliases.items():
        if alias in entries or target not in entries:
            found = f"{alias} -> {target}" + (", both stored" if alias in entries else
                                              ", which no file stores")  # fmt: skip
            raise CheckpointError(str(root), ALIASES, found,
                                  "an unstored name for a stored tensor")  # fmt: skip
    return Stored(root, entries, aliases), tuple(headers)
