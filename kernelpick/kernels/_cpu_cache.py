"""The on-disk cache of the CPU kernel's builds: one process at a time builds or loads a
build, and a cached library is loaded only once it is verified.

What a killed or broken build leaves behind must not stop every later process:

- Its lock. torch's own (``lock`` in the build directory, a file created exclusively and
  removed when the build ends: ``torch.utils.file_baton.FileBaton``) outlives a killed
  process, and torch waits on it with no timeout. kernelpick first takes an ``flock`` on
  ``<build>.lock`` beside the directory, which the kernel releases when its holder dies.
  Whoever holds it knows that a torch lock found in the directory belongs to a build that
  died (a live one would hold the ``flock``), and removes it.
- Its library. A truncated one (a build killed while linking, a full disk) ends the process
  that loads it with SIGBUS, and ninja, seeing it newer than its sources, never rebuilds
  it. A library's sha256 is written beside it once it has loaded; a build directory whose
  library does not match is removed whole (its objects may be as broken) and built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "LOCK_WAIT_SECONDS",
    "LOGGER",
    "build_lock",
    "discard_unverified",
    "lock_path",
    "record_verified",
]

LOGGER = logging.getLogger("kernelpick.kernels")

# The longest a process waits for another one's build of the same level: a build takes
# seconds to a minute, so a holder this slow is hung.
LOCK_WAIT_SECONDS = 600.0
_LOCK_POLL_SECONDS = 0.2
# torch's lock file in the build directory (torch.utils.cpp_extension._jit_compile).
_TORCH_LOCK = "lock"


def lock_path(directory: Path) -> Path:
    """The file ``build_lock`` locks: beside the build directory, which may be removed."""
    return directory.with_name(f"{directory.name}.lock")


def _library(directory: Path) -> Path:
    # The name torch gives the library it builds: <name>.so in the build directory.
    return directory / f"{directory.name}.so"


def _record(directory: Path) -> Path:
    return directory / f"{directory.name}.so.sha256"


def _try_lock(file: IO[str]) -> bool:
    import fcntl  # POSIX only, as the kernel's build is

    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the build lock of ``directory`` (in this process, under ``_cpu_build.LOCK``).

    While another live process holds it, says so at once at WARNING and waits, at most
    ``LOCK_WAIT_SECONDS``, then raises ``TimeoutError``. A holder that died released it.
    Raises ``OSError`` if the lock's folder cannot be created or the file opened.
    """
    import fcntl

    path = lock_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Never truncated on opening, so a waiter can read which process holds it; never a
    # link (one planted in a shared cache would have its target overwritten), nor a file
    # of another kind.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    with open(fd, "a+", encoding="utf-8") as file:
        if not _try_lock(file):
            file.seek(0)
            holder = file.read().strip() or "another process"
            LOGGER.warning(
                "waiting for the build lock %s (held by %s, building or loading the same CPU "
                "kernel) for at most %.0f s",
                path, holder, LOCK_WAIT_SECONDS,
            )  # fmt: skip
            deadline = time.monotonic() + LOCK_WAIT_SECONDS
            while not _try_lock(file):
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the build lock {path} is still held by {holder} after "
                        f"{LOCK_WAIT_SECONDS:.0f} s: that build is hung; end it, or wait for "
                        "it and try again"
                    )
                time.sleep(_LOCK_POLL_SECONDS)
        try:
            file.truncate(0)
            file.write(f"process {os.getpid()}")
            file.flush()
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unverified(directory: Path) -> str | None:
    """Why the library in ``directory`` must not be loaded, or None if it is verified. A
    record that cannot be read as a digest (not a file, not text) verifies nothing."""
    library = _library(directory)
    try:
        recorded = _record(directory).read_bytes().strip()
    except FileNotFoundError:
        if library.exists():
            return f"{library.name} was never recorded as loaded (its build was interrupted)"
        return "an earlier build did not finish"
    except OSError as error:  # a directory, a special file: not a record
        return f"its sha256 record cannot be read ({error.strerror or error})"
    if not library.is_file():
        return f"{library.name} is missing"
    if _sha256(library).encode() != recorded:
        return f"{library.name} does not match the sha256 recorded when it was built"
    return None


def discard_unverified(directory: Path) -> None:
    """Make ``directory`` safe to build in and load from; call it holding ``build_lock``.

    A build whose library is not verified is removed, so torch builds it again from
    scratch; a torch lock left by a killed build is removed. Both are said at INFO.
    """
    if not directory.exists():
        return
    reason = _unverified(directory)
    if reason is not None:
        LOGGER.info("rebuilding the CPU kernel in %s: %s", directory, reason)
        if directory.is_symlink() or not directory.is_dir():
            directory.unlink()  # a link or a file where the build goes: never followed
        else:
            shutil.rmtree(directory)
        return
    baton = directory / _TORCH_LOCK
    if baton.exists():
        LOGGER.info("removing %s, left by a build of the CPU kernel that was killed", baton)
        baton.unlink(missing_ok=True)


def record_verified(directory: Path) -> None:
    """Record the sha256 of the library just loaded from ``directory``; call it holding
    ``build_lock``. ``OSError`` if it cannot be written (the next process then rebuilds)."""
    record = _record(directory)
    temporary = record.with_name(f"{record.name}.tmp")
    temporary.write_text(f"{_sha256(_library(directory))}\n", encoding="utf-8")
    os.replace(temporary, record)  # whole or absent, never a partial hash
