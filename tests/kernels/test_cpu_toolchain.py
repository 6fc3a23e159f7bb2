"""What the CPU kernel's build needs, found part by part (kernels/_cpu_toolchain.py): the probe
says which part is missing, ninja comes from the ``ninja`` package where PATH has none, and
a first build says at INFO what it builds, why, where and for about how long.

PATH, CXX, TORCH_EXTENSIONS_DIR and the ninja package's folder are set per test; nothing is
compiled here but in the one slow test, in a fresh process.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ninja
import pytest

import kernelpick as kp
from kernelpick.adapters.cpu import _device as cpu_device
from kernelpick.core import FEATURE_BUILD_ROOT, FEATURE_CXX_COMPILER, FEATURE_NINJA
from kernelpick.kernels import _cpu_build, _cpu_toolchain, toolchain_parts
from tests.support.cpu_levels import LEVELS

COMPILER = shutil.which(os.environ.get("CXX", "c++"))
PACKAGED_NINJA = shutil.which("ninja", path=ninja.BIN_DIR) if ninja.BIN_DIR else None
needs_both = pytest.mark.skipif(
    COMPILER is None or PACKAGED_NINJA is None,
    reason="needs a C++ compiler and the ninja package's binary",
)
ALL = {FEATURE_CXX_COMPILER: True, FEATURE_NINJA: True, FEATURE_BUILD_ROOT: True}


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH of one folder, holding the C++ compiler and no ninja; CXX unset; a build root
    that can be made."""
    folder = tmp_path / "bin"
    folder.mkdir()
    assert COMPILER is not None
    (folder / "c++").symlink_to(COMPILER)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    return folder


def _unwritable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "a_file" / "extensions"))


def _no_packaged_ninja(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-ninja"
    empty.mkdir()
    monkeypatch.setattr(ninja, "BIN_DIR", str(empty))


def _no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "kernelpick-no-such-compiler")


def _nothing_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pass


# id, the change to the machine, the parts found, the reason's words after "needs ...; "
MACHINES = [
    ("all-present", _nothing_changed, ALL, None),
    ("compiler-missing", _no_compiler, {**ALL, FEATURE_CXX_COMPILER: False},
     "no C++ compiler on PATH ($CXX, else c++)"),
    ("ninja-missing", _no_packaged_ninja, {**ALL, FEATURE_NINJA: False},
     "no ninja (on PATH, or from the ninja package)"),
    ("root-unwritable", _unwritable_root, {**ALL, FEATURE_BUILD_ROOT: False},
     "no build root it can create and write (under TORCH_EXTENSIONS_DIR, by default "
     "~/.cache/torch_extensions)"),
]  # fmt: skip


@needs_both
@pytest.mark.usefixtures("bare_path")
@pytest.mark.parametrize(
    ("change", "parts", "missing"), [m[1:] for m in MACHINES], ids=[m[0] for m in MACHINES]
)
def test_the_probe_names_the_part_of_the_toolchain_that_is_missing(
    change: object,
    parts: dict[str, bool],
    missing: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PATH has the compiler but no ninja, as in a venv not activated: the ninja package's
    binary counts. Each part removed in turn is the one the reason names."""
    assert callable(change)
    change(tmp_path, monkeypatch)
    assert toolchain_parts() == parts
    caps = cpu_device.translate(cpu_device.read_properties(0))
    config = kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
    reason = kp.rules.NeedsToolchain().check(caps, config)
    assert (reason.found if reason is not None else None) == missing
    assert not (tmp_path / "extensions").exists()  # looked at, never created


@needs_both
def test_ninja_is_on_path_for_the_build_only(bare_path: Path) -> None:
    before = os.environ["PATH"]
    assert shutil.which("ninja") is None
    with _cpu_toolchain.ninja_on_path():
        found = shutil.which("ninja")
        assert found is not None
        assert Path(found).parent == Path(ninja.BIN_DIR)
        assert os.environ["PATH"].startswith(before)  # appended: PATH's own tools first
    assert os.environ["PATH"] == before


@needs_both
def test_a_path_changed_during_the_build_keeps_the_change(bare_path: Path) -> None:
    """Another thread may change PATH while a build (half a minute) runs: only the folder
    appended goes after."""
    before = os.environ["PATH"]
    with _cpu_toolchain.ninja_on_path():
        os.environ["PATH"] = os.pathsep.join(["/opt/app/bin", os.environ["PATH"]])
    assert os.environ["PATH"] == os.pathsep.join(["/opt/app/bin", before])


def test_ninja_on_path_leaves_a_path_that_has_one_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "bin"
    own.mkdir()
    (own / "ninja").write_text("#!/bin/sh\n")
    (own / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", str(own))
    with _cpu_toolchain.ninja_on_path():
        assert os.environ["PATH"] == str(own)
    assert os.environ["PATH"] == str(own)


# --- the first build says what it does -----------------------------------------------------


def _stub_build(calls: list[str]) -> object:
    def load(*, name: str, build_directory: str, **kwargs: object) -> None:
        # What a build leaves: the library, under the name torch gives it.
        calls.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"a library")

    return load


@pytest.mark.skipif(not LEVELS, reason="this CPU has no ISA level of the compiled kernel")
def test_a_first_build_says_what_why_where_and_how_long_and_a_cached_one_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch.utils import cpp_extension

    level = LEVELS[-1]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    calls: list[str] = []
    monkeypatch.setattr(cpp_extension, "load", _stub_build(calls))
    caplog.set_level(logging.INFO, logger="kernelpick")
    for _process in range(2):  # a first process builds; the next finds the build cached
        monkeypatch.setattr(_cpu_build, "_LOADED", set())
        monkeypatch.setattr(_cpu_build, "_FAILED", {})
        _cpu_build.load_ops(level)
    assert len(calls) == 2  # torch loads (or rebuilds) a cached build itself
    infos = [r for r in caplog.records if r.name == "kernelpick.kernels"]
    assert len(infos) == 1  # the first build only
    message = infos[0].getMessage()
    directory = tmp_path / "kernelpick" / calls[0]
    for said in (
        "_cpu_fp8_gemm.cpp",  # what
        f"ISA level {level}",
        "first use with this torch, compiler and source, so nothing is cached",  # why
        str(directory),  # where
        f"about {_cpu_build.BUILD_TIME}",  # how long
    ):
        assert said in message, (said, message)
    assert infos[0].levelno == logging.INFO


_BUILD_OFF_PATH = """
import os, shutil, sys
from kernelpick.kernels._cpu_build import load_ops
assert shutil.which("ninja") is None
path = os.environ["PATH"]
load_ops(sys.argv[1])
assert os.environ["PATH"] == path
print("built")
"""


@needs_both
@pytest.mark.slow
def test_a_venv_not_activated_builds_with_the_ninja_packages_binary(tmp_path: Path) -> None:
    # Seconds: a real build of the AVX2 level. PATH holds the compiler and its assembler and
    # linker only, as a python run by its path from an unactivated venv would see.
    if "avx2" not in LEVELS:
        pytest.skip("this CPU has no AVX2 level")
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("c++", "as", "ld"):
        found = COMPILER if tool == "c++" else shutil.which(tool)
        assert found is not None, tool
        (folder / tool).symlink_to(found)
    env = {
        "HOME": str(tmp_path),
        "PATH": str(folder),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_OFF_PATH, "avx2"], env=env, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["built"]
