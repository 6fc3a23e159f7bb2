"""read_json_object: an untrusted JSON file is one regular, bounded, UTF-8 object with each
key once, or a CheckpointError naming the file; never a hang, an unbounded read or another
exception type."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import MAX_JSON_BYTES, read_json_object


def _text(text: str | bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(text.encode() if isinstance(text, str) else text)

    return write


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opening it would wait for a writer for ever


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")  # a read of it never ends


def _large(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(MAX_JSON_BYTES + 1)  # sparse: no disk spent


REFUSED = [
    ("missing", lambda path: None, "no such file"),
    ("a directory", lambda path: path.mkdir(), "not a regular file"),
    ("a FIFO", _fifo, "not a regular file"),
    ("a link to /dev/zero", _zero, "not a regular file"),
    ("too large", _large, f"{MAX_JSON_BYTES + 1} bytes"),
    ("not UTF-8", _text(b'{"a": "\xff"}'), "not one JSON object"),
    ("not JSON", _text("{"), "not one JSON object"),
    ("a key twice", _text('{"a": 1, "a": 2}'), "the key 'a' is given twice"),
    ("a key twice, nested", _text('{"b": {"a": 1, "a": 2}}'), "given twice"),
    ("nested past the recursion limit", _text("[" * 100_000 + "]" * 100_000),
     "not one JSON object"),
    ("a list", _text("[]"), "list"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "found"), [pytest.param(*row[1:], id=row[0]) for row in REFUSED])
def test_a_file_that_could_be_read_two_ways_or_not_at_all_is_refused_by_name(
    tmp_path: Path, make: Callable[[Path], None], found: str
) -> None:
    path = tmp_path / "config.json"
    make(path)
    with pytest.raises(CheckpointError, match=r"config\.json") as info:
        read_json_object(path, "a model's config")
    assert found in str(info.value)


def test_a_json_object_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "sizes": {"hidden": 8}}')
    assert read_json_object(path) == {"model_type": "llama", "sizes": {"hidden": 8}}
