"""What building the CPU kernel needs from this machine, found part by part: a C++ compiler,
ninja, and a build root this process can create and write.

ninja is a dependency of kernelpick (the ``ninja`` wheel), but its binary is on PATH only
where the environment is activated: a venv's ``bin/python`` run directly leaves it off.
``torch.utils.cpp_extension`` runs ``ninja`` from PATH and takes no other path, so the
build puts the wheel's folder on PATH for its own duration (``ninja_on_path``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kernelpick.core import FEATURE_BUILD_ROOT, FEATURE_CXX_COMPILER, FEATURE_NINJA

__all__ = ["build_root", "compiler", "ninja_on_path", "toolchain_parts"]


def compiler() -> str:
    """The C++ compiler ``torch.utils.cpp_extension`` builds with: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


def _packaged_ninja() -> str | None:
    # The ninja wheel's binary, wherever the interpreter's scripts folder is.
    try:
        import ninja
    except ImportError:
        return None
    return shutil.which("ninja", path=ninja.BIN_DIR) if ninja.BIN_DIR else None


def _ninja() -> str | None:
    return shutil.which("ninja") or _packaged_ninja()


def _runs(program: str) -> bool:
    try:
        subprocess.run([program, "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def build_root() -> Path:
    """The folder the CPU kernel's builds go in: ``kernelpick`` under torch's extension
    directory (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``)."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / "kernelpick"


def _build_root_writable() -> bool:
    """Whether the build root can be made: its nearest existing folder is a directory this
    process may write into (under a regular file, or a read-only tree, it cannot)."""
    root = build_root()
    for path in (root, *root.parents):
        if os.path.lexists(path):  # a dangling or looping link is there, and unusable
            return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
    return False


def toolchain_parts() -> dict[str, bool]:
    """Which parts of a toolchain this machine has, by their ``FEATURE_*`` names: a C++
    compiler on PATH, a ninja that runs (on PATH, else the ``ninja`` package's), a build root
    it can create and write.

    Cheap (PATH lookups, ``ninja --version`` and a look at the root's nearest existing
    folder); nothing is compiled or created. The CPU adapter's probe reports the answer, so
    a machine that cannot build gets the kernel rejected with a reason naming what is
    missing, rather than an error at first use.
    """
    ninja = _ninja()
    return {
        FEATURE_CXX_COMPILER: shutil.which(compiler()) is not None,
        FEATURE_NINJA: ninja is not None and _runs(ninja),
        FEATURE_BUILD_ROOT: _build_root_writable(),
    }


@contextlib.contextmanager
def ninja_on_path() -> Iterator[None]:
    """PATH with the ``ninja`` package's folder at its end while the block runs, where PATH
    itself has no ninja; the folder is taken off again after.

    Appended, so that nothing PATH already finds is shadowed; the process-wide change is
    held only for a build, which holds the build lock.
    """
    packaged = None if shutil.which("ninja") else _packaged_ninja()
    if packaged is None:  # on PATH already, or nowhere: torch's own error says so
        yield
        return
    folder = str(Path(packaged).parent)
    had_path = "PATH" in os.environ  # unset is not "": lookups then use os.defpath
    os.environ["PATH"] = os.pathsep.join(filter(None, (os.environ.get("PATH"), folder)))
    try:
        yield
    finally:
        # Only the folder appended goes, where it still is: PATH as another thread left it
        # during the build (which takes half a minute) otherwise stays as it left it.
        parts = os.environ.get("PATH", "").split(os.pathsep)
        if parts and parts[-1] == folder:
            rest = os.pathsep.join(parts[:-1])
            if rest or had_path:
                os.environ["PATH"] = rest
            else:
                os.environ.pop("PATH", None)
