"""save_quantized against hostile directories, failures at every step, crashes and rival
saves: the directory holds the old checkpoint, byte for byte, or the whole new one; no
write follows a link; every failure is a CheckpointError naming the path."""

from __future__ import annotations

import errno
import multiprocessing
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

import kernelpick as kp
from kernelpick.integration import CheckpointError, load_quantized, quantize_model, save_quantized
from kernelpick.integration.checkpoints._atomic_files import locked
from kernelpick.integration.checkpoints._safetensors_io import ALIASES, Checkpoint

CPU = kp.device_profile("cpu")
WEIGHTS, CONFIG = "model.safetensors", "config.json"
# The renames and syncs of a save. Over an old checkpoint: config.json aside, the weights
# aside and in, config.json in; each new file synced, then the directory after each stage
# of the commit. Over no checkpoint: nothing goes aside, and nothing is synced after it.
CALLS = {"a checkpoint": {"rename": 4, "fsync": 5}, "a tokenizer": {"rename": 2, "fsync": 4}}
RENAMES = CALLS["a checkpoint"]["rename"]
# What a directory holds: each entry by name, as its bytes, its link target or its listing.
Listing = dict[str, tuple[str, object]]


def _model(seed: int, scheme: str = "fp8_per_channel") -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    quantize_model(model, scheme, CPU, kp.Policy())
    return model


def _skeleton() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))


def _listing(directory: Path) -> Listing:
    found: Listing = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_symlink():
            found[entry.name] = ("link", os.readlink(path))
        elif entry.is_dir():
            found[entry.name] = ("directory", _listing(path))
        else:
            found[entry.name] = ("file", path.read_bytes())
    return found


def _saved(directory: Path, model: torch.nn.Module) -> Listing:
    """The listing of ``directory`` holding ``model``'s checkpoint and a tokenizer."""
    (directory / "tokenizer.json").write_text('{"model": "tokens"}')
    save_quantized(model, directory)
    return _listing(directory)


def _failing(name: str, at: int, raised: BaseException) -> Callable[..., Any]:
    """``os.<name>`` raising ``raised`` at its call ``at`` (from 0), the others as they were."""
    real = getattr(os, name)
    calls = iter(range(10**6))

    def fake(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == at:
            raise raised
        return real(*args, **kwargs)

    return fake


def _counting(counts: dict[str, int], name: str) -> Callable[..., Any]:
    real = getattr(os, name)

    def fake(*args: Any, **kwargs: Any) -> Any:
        counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)

    return fake


def _over(directory: Path, over: str) -> Listing:
    if over == "a checkpoint":
        return _saved(directory, _model(0))
    (directory / "tokenizer.json").write_text("{}")
    return _listing(directory)


@pytest.mark.parametrize("over", CALLS)
def test_a_save_makes_the_renames_and_syncs_the_failure_tests_cover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: str
) -> None:
    _over(tmp_path, over)
    counts: dict[str, int] = {}
    for name in ("rename", "fsync"):
        monkeypatch.setattr(os, name, _counting(counts, name))
    save_quantized(_model(1), tmp_path)
    assert counts == CALLS[over]


def _failures() -> Iterator[Any]:
    disk_full = OSError(errno.ENOSPC, "No space left on device")
    for over, calls in CALLS.items():
        for call, count in calls.items():  # fsync 0: the weights written, 1: the config
            for at in range(count):
                yield pytest.param(over, call, at, disk_full, id=f"{over}-{call}-{at}")
        last = calls["rename"] - 1
        yield pytest.param(over, "rename", last, KeyboardInterrupt(), id=f"{over}-interrupt")
        yield pytest.param(over, "write", 0, disk_full, id=f"{over}-writing-the-weights")


@pytest.mark.parametrize(("over", "call", "at", "raised"), list(_failures()))
def test_a_save_stopped_at_any_step_leaves_the_directory_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: str, call: str, at: int,
    raised: BaseException,
) -> None:  # fmt: skip
    before = _over(tmp_path, over)
    monkeypatch.setattr(os, call, _failing(call, at, raised))
    with pytest.raises(type(raised) if isinstance(raised, KeyboardInterrupt) else CheckpointError):
        save_quantized(_model(1, "fp8_per_tensor"), tmp_path)
    monkeypatch.undo()
    assert _listing(tmp_path) == before


def test_a_config_write_that_fails_leaves_the_old_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _saved(tmp_path, _model(0))
    real_write, real_fsync = os.write, os.fsync
    synced: list[int] = []

    def write(fd: int, data: Any) -> int:
        if synced:  # the weights are written and synced: this is the config
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / CONFIG}: save: found Input/output"):
        save_quantized(_model(1), tmp_path)
    monkeypatch.undo()
    assert _listing(tmp_path) == before


@pytest.mark.parametrize(
    ("tensor", "found"),
    [
        (torch.empty(3, device="meta"), "a tensor on the meta device"),
        (torch.zeros(3, dtype=torch.complex64), "torch.complex64; expected a dtype of"),
    ],
)
def test_a_tensor_safetensors_cannot_hold_is_refused_before_anything_changes(
    tmp_path: Path, tensor: torch.Tensor, found: str
) -> None:
    before = _saved(tmp_path, _model(0))
    model = _model(1)
    model.register_buffer("extra", tensor)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / WEIGHTS}: extra: found {found}"):
        save_quantized(model, tmp_path)
    assert _listing(tmp_path) == before


def test_a_failed_save_into_new_folders_removes_them_and_keeps_the_ones_there(
    tmp_path: Path,
) -> None:
    """The folders a save made for itself go with its failure; one that was there stays,
    and so does one another writer filled meanwhile."""
    model = _model(1)
    model.register_buffer("extra", torch.empty(3, device="meta"))  # refused as it writes
    target = tmp_path / "new" / "deeper" / "checkpoint"
    with pytest.raises(CheckpointError):
        save_quantized(model, target)
    assert list(tmp_path.iterdir()) == []

    def stopped_after_another_writer() -> None:
        with locked(target):
            (tmp_path / "new" / "theirs").write_text("another writer's")
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        stopped_after_another_writer()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["theirs"]


def test_a_failed_save_removes_only_folders_it_made_whatever_the_path_says(
    tmp_path: Path,
) -> None:
    """``new/../kept`` names a folder that was there: new is made, kept is not, so only new
    goes with the failure, and kept stays though empty."""
    (tmp_path / "kept").mkdir()
    model = _model(1)
    model.register_buffer("extra", torch.empty(3, device="meta"))
    with pytest.raises(CheckpointError):
        save_quantized(model, tmp_path / "new" / ".." / "kept")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_name_the_file_system_refuses_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="a directory kernelpick can create"):
        save_quantized(_model(1), tmp_path / ("a" * 300))
    assert list(tmp_path.iterdir()) == []


def test_every_dtype_the_reader_knows_is_written_as_safetensors_writes_it(tmp_path: Path) -> None:
    """The writer streams the format itself (no path is reopened): the bytes and the header
    safetensors' own reader finds are those of every tensor, for every dtype, E8M0 included."""
    from kernelpick.integration.checkpoints._safetensors_io import DTYPES, write_safetensors

    generator = torch.Generator().manual_seed(0)
    state = {
        name: torch.randint(0, 100, (3, 5), generator=generator).to(dtype)
        for name, dtype in DTYPES.items()
    }
    chunks: list[bytes] = []
    write_safetensors(lambda data: chunks.append(bytes(data)), state, "x")
    (tmp_path / WEIGHTS).write_bytes(b"".join(chunks))
    with safetensors.safe_open(str(tmp_path / WEIGHTS), framework="pt") as handle:
        for name, tensor in state.items():
            assert handle.get_slice(name).get_dtype() == name
            read = handle.get_tensor(name)
            assert read.dtype == tensor.dtype
            assert torch.equal(read.view(torch.uint8), tensor.view(torch.uint8)), name


@pytest.mark.parametrize("name", ["__metadata__", "bad\ud800name"])
def test_a_name_no_reader_takes_is_refused_before_anything_is_written(name: str) -> None:
    from kernelpick.integration.checkpoints._safetensors_io import write_safetensors

    chunks: list[bytes] = []
    with pytest.raises(CheckpointError, match="a name no reader takes"):
        write_safetensors(lambda data: chunks.append(bytes(data)), {name: torch.ones(2)}, "x")
    assert chunks == []


def test_empty_tensors_are_each_written_not_aliased(tmp_path: Path) -> None:
    """Two empty tensors of one shape share no bytes (their data pointers are both 0):
    each is written under its own name, as stock readers look them up."""
    from kernelpick.integration.checkpoints._safetensors_io import write_safetensors

    chunks: list[bytes] = []
    state = {"a": torch.zeros(0, 4), "b": torch.zeros(0, 4)}
    write_safetensors(lambda data: chunks.append(bytes(data)), state, "x")
    (tmp_path / WEIGHTS).write_bytes(b"".join(chunks))
    assert set(safetensors.torch.load_file(str(tmp_path / WEIGHTS))) == {"a", "b"}


def test_a_save_keeps_the_other_files_and_leaves_nothing_of_its_own(tmp_path: Path) -> None:
    before = _saved(tmp_path, _model(0))
    model = _model(1, "fp8_per_tensor")
    save_quantized(model, tmp_path)
    after = _listing(tmp_path)
    assert sorted(after) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert after["tokenizer.json"] == before["tokenizer.json"]
    assert after[WEIGHTS] != before[WEIGHTS]
    skeleton = _skeleton()
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    x = torch.randn(2, 32)
    with torch.no_grad():
        assert torch.equal(skeleton(x), model(x))


@pytest.mark.parametrize("name", [CONFIG, WEIGHTS])
@pytest.mark.parametrize("kind", ["a symbolic link", "a directory"])
def test_a_config_or_weights_entry_that_is_no_regular_file_is_refused(
    tmp_path: Path, name: str, kind: str
) -> None:
    directory, outside = tmp_path / "checkpoint", tmp_path / "outside"
    directory.mkdir()
    outside.write_text("not to be touched")
    if kind == "a directory":
        (directory / name).mkdir()
        (directory / name / "inside").write_text("kept")
    else:
        (directory / name).symlink_to(outside)
    before = _listing(tmp_path)
    with pytest.raises(CheckpointError, match=rf"{directory / name}: entry: found {kind}"):
        save_quantized(_model(0), directory)
    assert _listing(tmp_path) == before


def test_links_planted_at_the_old_temporary_names_are_not_followed(tmp_path: Path) -> None:
    directory, outside = tmp_path / "checkpoint", tmp_path / "outside"
    directory.mkdir()
    outside.write_text("not to be touched")
    (directory / ".config.json.partial").symlink_to(outside)
    (directory / ".model.safetensors.partial").symlink_to(tmp_path / "planted")
    save_quantized(_model(0), directory)
    assert outside.read_text() == "not to be touched"
    assert not (tmp_path / "planted").exists()
    for name in (CONFIG, WEIGHTS):
        assert not (directory / name).is_symlink()
        assert (directory / name).is_file()


def test_a_link_planted_at_the_very_temporary_name_is_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    names = iter(f"{n:016x}" for n in range(100))
    monkeypatch.setattr(secrets, "token_hex", lambda _: next(names))
    # The weights would take name 0 and the config name 2 (1 is left for the weights).
    (directory / f".{WEIGHTS}.{0:016x}.kernelpick-new").symlink_to(tmp_path / "weights")
    (directory / f".{CONFIG}.{2:016x}.kernelpick-new").symlink_to(tmp_path / "config")
    save_quantized(_model(0), directory)
    assert not (tmp_path / "weights").exists()
    assert not (tmp_path / "config").exists()
    assert sorted(os.listdir(directory)) == [CONFIG, WEIGHTS]  # the leftovers removed too


def test_a_target_that_is_a_file_or_under_one_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("a file")
    with pytest.raises(CheckpointError, match=rf"{target}: directory: found a file that is not"):
        save_quantized(_model(0), target)
    with pytest.raises(CheckpointError, match=rf"{target / 'x'}: directory: found Not a dir"):
        save_quantized(_model(0), target / "x")
    assert target.read_text() == "a file"


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
def test_a_directory_that_cannot_be_created_or_written_is_refused() -> None:
    with pytest.raises(
        CheckpointError, match=r"/sys/x: directory: found (Operation not|Permission)"
    ):
        save_quantized(_model(0), "/sys/x")
    with pytest.raises(CheckpointError, match=r"/sys/kernel/\S+: lock: found Permission denied"):
        save_quantized(_model(0), "/sys/kernel")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match=rf"{tmp_path}/\S+: lock: found Permission"):
            save_quantized(_model(0), tmp_path)
    finally:
        tmp_path.chmod(0o755)


def test_a_symbolic_link_to_a_directory_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    save_quantized(_model(0), tmp_path / "link")
    assert (tmp_path / "link").is_symlink()
    assert sorted(os.listdir(tmp_path / "real")) == [CONFIG, WEIGHTS]


@pytest.mark.parametrize(
    "aliases",
    ["not json", "[1, 2]", '{"tied.weight": ["0.weight"]}', '{"tied.weight": 3}', '"x"'],
)
def test_aliases_metadata_that_is_not_a_map_of_names_is_refused(
    tmp_path: Path, aliases: str
) -> None:
    path = tmp_path / WEIGHTS
    safetensors.torch.save_file({"0.weight": torch.ones(2)}, str(path), {ALIASES: aliases})
    expected = rf"{path}: {ALIASES}: found .*; expected a JSON object mapping tensor names to"
    with pytest.raises(CheckpointError, match=expected), Checkpoint(tmp_path) as checkpoint:
        checkpoint.source("tied.weight")


# Rival processes. Each is spawned: it builds its own model, then saves.


def _save_after(ready: Any, directory: str, seed: int) -> None:
    model = _model(seed)
    ready.set()
    save_quantized(model, directory)


def _save_many(start: Any, directory: str, seed: int, scheme: str, times: int) -> None:
    model = _model(seed, scheme)
    save_quantized(model, Path(directory).parent / f"alone-{seed}")
    start.wait()
    for _ in range(times):
        save_quantized(model, directory)


def _save_until_killed(directory: str, seed: int, at: int) -> None:
    model = _model(seed, "fp8_per_tensor")
    real = os.rename
    calls = iter(range(10**6))

    def rename(*args: Any, **kwargs: Any) -> None:
        if next(calls) == at:
            os._exit(3)  # killed mid-commit: no handler, no undo
        real(*args, **kwargs)

    os.rename = rename
    save_quantized(model, directory)


@pytest.mark.slow
def test_a_save_waits_for_the_one_holding_the_directory(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    with locked(tmp_path):
        child = context.Process(target=_save_after, args=(ready, str(tmp_path), 0))
        child.start()
        assert ready.wait(120)
        time.sleep(2)
        assert child.is_alive()
        assert WEIGHTS not in os.listdir(tmp_path)
    child.join(60)
    assert child.exitcode == 0
    load_quantized(_skeleton(), tmp_path, CPU, kp.Policy())


@pytest.mark.slow
def test_two_processes_saving_into_one_directory_take_turns(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    shared = tmp_path / "shared"
    rivals = [
        context.Process(target=_save_many, args=(start, str(shared), seed, scheme, 15))
        for seed, scheme in ((0, "fp8_per_channel"), (1, "fp8_per_tensor"))
    ]
    for rival in rivals:
        rival.start()
    for rival in rivals:
        rival.join(180)
    assert [rival.exitcode for rival in rivals] == [0, 0]
    final = _listing(shared)
    assert final in (_listing(tmp_path / "alone-0"), _listing(tmp_path / "alone-1"))


@pytest.mark.slow
def test_a_save_killed_mid_commit_never_pairs_old_and_new(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    directories = [tmp_path / f"at-{at}" for at in range(RENAMES)]
    old = {}
    for directory in directories:
        directory.mkdir()
        old[directory] = _saved(directory, _model(0))
    children = [
        context.Process(target=_save_until_killed, args=(str(directory), 1, at))
        for at, directory in enumerate(directories)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [3] * RENAMES
    for at, directory in enumerate(directories):
        listing = _listing(directory)
        shown = {name for name in listing if not name.startswith(".")}
        if at == 0:  # before the commit: the old checkpoint, and hidden leftovers
            assert {name: listing[name] for name in shown} == {
                name: entry for name, entry in old[directory].items()
            }
        else:  # config.json is aside: no reader takes the directory for a model
            assert CONFIG not in shown
            with pytest.raises(CheckpointError, match=r"config\.json: : found no such file"):
                load_quantized(_skeleton(), directory, CPU, kp.Policy())
            aside = [n for n in listing if n.startswith(".config.json.") and n.endswith("-old")]
            assert [listing[name] for name in aside] == [old[directory][CONFIG]]
        save_quantized(_model(2), directory)  # the next save clears what the crash left
        assert sorted(os.listdir(directory)) == [CONFIG, WEIGHTS, "tokenizer.json"]
