"""Files of a directory replaced together: a reader finds the old set or the new one.

The directory is opened once (a symbolic link to it is followed then, and only then) and
every step goes through that descriptor, so re-pointing its path mid-save changes nothing.
Writers take turns by an exclusive ``flock`` on a lock file in it (a lock file, not the
directory, as NFS locks only a file open for writing), which the holder removes before
letting go. Each new file is created under a random name with ``O_CREAT | O_EXCL |
O_NOFOLLOW``, so a name planted in advance, a link included, is never opened, and written
through the descriptor that created it.

The commit renames, in this order: the key file (the one without which no reader takes
the directory: ``config.json``) aside, each other old file aside and its new one in, then
the new key file in; the directory is synced between, so the order holds through a crash.
An exception at any step renames back what was renamed, so the directory is as it was.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration._log import LOGGER

__all__ = ["LOCK_NAME", "NEW", "OLD", "Directory", "Sink", "Writer", "locked"]

# The suffixes of the hidden files a save makes beside the real ones: a new file being
# written, and an old one moved aside. A crash during the commit leaves them (see docs).
NEW, OLD = ".kernelpick-new", ".kernelpick-old"
LOCK_NAME = ".kernelpick-save.lock"
# A file's bytes go to a sink, which writes them all or raises; a writer feeds one.
Sink = Callable[[bytes | memoryview], None]
Writer = Callable[[Sink], None]
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RANDOM = 8  # bytes of a temporary name's random part
# What an earlier save killed mid-way left: ``.<name>.<random hex><NEW or OLD>``.
_LEFTOVER = re.compile(rf"\.(.+)\.[0-9a-f]{{{2 * _RANDOM}}}({re.escape(NEW)}|{re.escape(OLD)})")
_LOCK = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _failed(path: Path, what: str, error: OSError, expected: str) -> CheckpointError:
    return CheckpointError(str(path), what, error.strerror or str(error), expected)


def _make(path: Path, made: list[Path]) -> None:
    """Make ``path`` and its missing parents one level at a time, from the root down,
    adding to ``made`` each folder this call made: only what ``mkdir`` itself created, so
    a folder another process makes meanwhile, or one ``new/../kept`` names, is not ours."""
    for folder in (*reversed(path.parents), path):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        made.append(folder)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[Directory]:
    """``path``, created if needed (with its parents), opened and locked against every
    other ``locked`` of it, in this process or another, until the block ends. When the
    block fails, the folders made for it are removed again where still empty: a failed
    save leaves the file system as it was."""
    expected = "a directory kernelpick can create, open and write into"
    made: list[Path] = []
    try:
        try:
            if path.exists() and not path.is_dir():
                found = "a file that is not a directory"
                raise CheckpointError(str(path), "directory", found, expected)
            _make(path, made)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise _failed(path, "directory", error, expected) from error
        try:
            lock = _lock(path, fd)
            try:
                yield Directory(path, fd)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(LOCK_NAME, dir_fd=fd)  # before letting go: see _lock
                os.close(lock)
        finally:
            os.close(fd)
    except BaseException:
        for folder in reversed(made):  # deepest first; one another save has filled stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _lock(path: Path, fd: int) -> int:
    """The descriptor of ``LOCK_NAME`` in the directory ``fd``, locked, once this process
    is the one holding it: a waiter may get the lock of a file its holder has just
    removed, so it holds it only if the name still leads to that file."""
    while True:
        try:
            lock = os.open(LOCK_NAME, _LOCK, 0o666, dir_fd=fd)
        except OSError as error:
            raise _failed(path / LOCK_NAME, "lock", error, "a lock file it can create") from error
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits for another save to finish
            held = os.fstat(lock)
            named = os.stat(LOCK_NAME, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(lock)
            continue
        except BaseException as error:  # KeyboardInterrupt while waiting, too
            os.close(lock)
            if isinstance(error, OSError):
                expected = "a file system with flock"
                raise _failed(path / LOCK_NAME, "lock", error, expected) from error
            raise
        if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
            return lock
        os.close(lock)


class Directory:
    """A directory opened and locked by ``locked``."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def names(self) -> list[str]:
        """Every entry's name, hidden ones included."""
        try:
            return os.listdir(self._fd)
        except OSError as error:
            raise _failed(self.path, "entries", error, "a directory it can list") from error

    def replace(self, files: Mapping[str, Writer], key: str) -> None:
        """Write each of ``files`` (name: what writes its bytes) and put them all in place
        of the files of those names; ``key`` is the one no reader does without.

        An entry of one of those names that is not a regular file (a link, a directory) is
        refused before anything is written. On any exception the directory is as it was,
        and an ``OSError`` arrives as a ``CheckpointError`` naming the file.
        """
        stale = [n for n in self.names() if (m := _LEFTOVER.fullmatch(n)) and m[1] in files]
        temps: list[str] = []  # every name this save created: none stays
        renamed: list[tuple[str, str]] = []  # undone in reverse on failure
        at = self.path
        try:
            for name in files:
                at = self.path / name
                self._check(name)
            new = {}
            for name, write in files.items():
                at = self.path / name
                new[name] = self._write(name, write, temps)
            old = {name: self._reserve(name, temps) for name in files if self._has(name)}
            at = self.path / key
            if key in old:
                self._rename(key, old[key], renamed)
                self._sync()  # the key file is gone, on disk too, before any other changes
            for name in files:
                if name != key:
                    at = self.path / name
                    if name in old:
                        self._rename(name, old[name], renamed)
                    self._rename(new[name], name, renamed)
            self._sync()
            at = self.path / key
            self._rename(new[key], key, renamed)
            self._sync()
        except BaseException as error:
            try:
                self._undo(renamed, temps)
            finally:
                self._remove(temps)
            if isinstance(error, OSError):
                raise _failed(at, "save", error, "a file kernelpick can write") from error
            raise
        self._remove(temps + stale)  # the new files are in: what a crash left is moot

    def _check(self, name: str) -> None:
        try:
            mode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISREG(mode):
            return
        found = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory"}.get(
            stat.S_IFMT(mode), "a special file"
        )
        expected = "a regular file (which is replaced) or none"
        raise CheckpointError(str(self.path / name), "entry", found, expected)

    def _has(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def _create(self, name: str, suffix: str, temps: list[str]) -> tuple[str, int]:
        """A new, empty hidden file beside ``name``, and its descriptor."""
        for _ in range(100):
            temp = f".{name}.{secrets.token_hex(_RANDOM)}{suffix}"
            try:
                fd = os.open(temp, _CREATE, 0o666, dir_fd=self._fd)
            except FileExistsError:
                continue  # taken (by chance, or planted): another name
            temps.append(temp)
            return temp, fd
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(self.path / name))

    def _reserve(self, name: str, temps: list[str]) -> str:
        """A name for the old ``name`` to be moved aside to, its own empty file till then."""
        temp, fd = self._create(name, OLD, temps)
        os.close(fd)
        return temp

    def _write(self, name: str, write: Writer, temps: list[str]) -> str:
        temp, fd = self._create(name, NEW, temps)
        try:
            write(lambda data: _write_all(fd, data))
            os.fsync(fd)
        finally:
            os.close(fd)
        return temp

    def _rename(self, source: str, target: str, renamed: list[tuple[str, str]]) -> None:
        os.rename(source, target, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        renamed.append((source, target))

    def _sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOTSUP):
                raise  # (those say the file system does not sync a directory by itself)

    def _undo(self, renamed: list[tuple[str, str]], temps: list[str]) -> None:
        """Rename back what ``replace`` renamed. A file that cannot go back stays where it
        is, and the error names it, after every other one went back."""
        stuck: list[tuple[str, str, OSError]] = []
        for source, target in reversed(renamed):
            try:
                os.rename(target, source, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            except OSError as error:
                stuck.append((source, target, error))
        if stuck:
            for _, target, _ in stuck:
                if target in temps:
                    temps.remove(target)  # it may hold an old file: kept
            found = "; ".join(f"{s} is at {t} ({e.strerror or e})" for s, t, e in stuck)
            where = str(self.path)
            raise CheckpointError(where, "restore", found, "files that could be renamed back")

    def _remove(self, temps: list[str]) -> None:
        for temp in temps:
            try:
                os.unlink(temp, dir_fd=self._fd)
            except FileNotFoundError:
                continue  # renamed into place
            except OSError as error:  # a hidden leftover, which must not hide what happened
                LOGGER.warning("could not remove %s: %s", self.path / temp, error)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]
