"""A JSON object read from an untrusted file (a model's ``config.json``, a checkpoint's
index): a regular file of bounded size, UTF-8, one object, each key once. Anything else is
a ``CheckpointError`` naming the file, never a hang (a FIFO), an unbounded read (a link to
``/dev/zero``), another exception type (JSON nested past the recursion limit) or a value
read one of two ways (a key given twice, which ``json.loads`` would settle silently)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from kernelpick.integration._errors import CheckpointError

__all__ = ["MAX_JSON_BYTES", "read_json_object"]

# The largest JSON file read: an index of DeepSeek-V3's 90,000 tensors is about 9 MiB, a
# model's config a few KiB.
MAX_JSON_BYTES = 64 * 2**20


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} is given twice")
        found[key] = value
    return found


def read_json_object(path: Path, what: str = "a JSON file") -> dict[str, Any]:
    """The JSON object in the file ``path`` (``what`` says what it should be, for errors)."""
    shown = str(path)
    try:
        info = os.stat(path)  # follows a link: what is read is what it points to
    except FileNotFoundError:
        raise CheckpointError(shown, "", "no such file", what) from None
    except OSError as error:
        raise CheckpointError(shown, "", f"a file that cannot be read ({error})", what) from error
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block, a device never end
        raise CheckpointError(shown, "", "not a regular file", what)
    if info.st_size > MAX_JSON_BYTES:
        found = f"{info.st_size} bytes"
        raise CheckpointError(shown, "", found, f"{what} of at most {MAX_JSON_BYTES} bytes")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_JSON_BYTES + 1)  # a file grown since the stat: bounded
    except OSError as error:
        raise CheckpointError(shown, "", f"a file that cannot be read ({error})", what) from error
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointError(shown, "", "more bytes than its size said", what)
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        found = f"text that is not one JSON object with each key once ({error})"
        raise CheckpointError(shown, "", found, what) from error
    if not isinstance(data, dict):
        raise CheckpointError(shown, "", type(data).__name__, f"{what}: one JSON object")
    return data
