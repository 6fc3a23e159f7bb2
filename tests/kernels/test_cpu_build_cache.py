"""The CPU kernel's build cache (kernels/_cpu_cache.py, used by kernels/_cpu_build.py): what
a killed or broken build leaves behind never stops a later process, a process that waits
says so, and a build directory that cannot be made is a kernelpick error naming it.

Every test builds under its own TORCH_EXTENSIONS_DIR, and a build that compiles runs in a
fresh process: the levels this test process has loaded stay as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernelpick.integration import ModelConversionError, quantize_model
from kernelpick.kernels import KernelBuildError, _cpu_build, _cpu_cache, _cpu_gemm
from tests.support.cpu_levels import LEVELS, NEEDS_A_LEVEL, caps_at

pytestmark = NEEDS_A_LEVEL

LEVEL = LEVELS[-1] if LEVELS else "avx2"  # avx2: every host that has a level has it

# Loads LEVEL in a fresh process, logging at INFO to stderr; prints the outcome.
_LOAD = (
    "import logging\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "from kernelpick.kernels import KernelBuildError\n"
    "from kernelpick.kernels._cpu_build import load_ops\n"
    "try:\n"
    f"    load_ops({LEVEL!r})\n"
    "except KernelBuildError as error:\n"
    "    print('KernelBuildError:', error)\n"
    "else:\n"
    "    print('loaded')\n"
)

# Holds build_lock(argv[2]) until killed, from _cpu_cache.py loaded alone (stdlib only, so
# the holder starts in milliseconds, without torch).
_HOLD = (
    "import importlib.util, pathlib, sys, time\n"
    "spec = importlib.util.spec_from_file_location('cache', sys.argv[1])\n"
    "cache = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(cache)\n"
    "with cache.build_lock(pathlib.Path(sys.argv[2])):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


@contextlib.contextmanager
def _holder(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """A live process holding ``directory``'s build lock; killed on exit."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, _cpu_cache.__file__, str(directory)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.communicate()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kernelpick.kernels" and r.levelno >= 30]


def test_a_lock_held_by_a_killed_process_is_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    directory = tmp_path / "build"
    with _holder(directory) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        started = time.monotonic()
        with _cpu_cache.build_lock(directory):
            assert time.monotonic() - started < 1.0
    assert not _warnings(caplog)


def test_a_waiter_says_at_once_which_lock_it_waits_on_and_for_how_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cpu_cache, "LOCK_WAIT_SECONDS", 1.0)
    caplog.set_level(logging.WARNING, logger="kernelpick")
    directory = tmp_path / "build"
    lock = _cpu_cache.lock_path(directory)
    with _holder(directory) as holder:
        with (
            pytest.raises(TimeoutError, match="still held") as raised,
            _cpu_cache.build_lock(directory),
        ):
            pytest.fail("the lock of a live holder was taken")
        gave_up = time.time()
    (warning,) = _warnings(caplog)
    message = warning.getMessage()
    assert str(lock) in message
    assert f"process {holder.pid}" in message
    assert "at most 1 s" in message
    assert gave_up - warning.created >= 1.0  # said before the wait, not after it
    assert str(lock) in str(raised.value)


def _cached(directory: Path, library: bytes, recorded: bytes) -> Path:
    # A build directory as torch and record_verified leave it.
    directory.mkdir(parents=True)
    (directory / f"{directory.name}.so").write_bytes(library)
    digest = hashlib.sha256(recorded).hexdigest()
    (directory / f"{directory.name}.so.sha256").write_text(f"{digest}\n")
    return directory


def test_a_library_unlike_its_recorded_hash_is_discarded_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kernelpick")
    directory = _cached(tmp_path / "build", b"truncated", b"the library as it was built")
    _cpu_cache.discard_unverified(directory)
    assert not directory.exists()
    (info,) = [r for r in caplog.records if r.name == "kernelpick.kernels"]
    assert info.levelno == logging.INFO
    assert str(directory) in info.getMessage()


@pytest.mark.parametrize("record", ["not text", "a directory"])
def test_a_record_that_is_no_digest_verifies_nothing(tmp_path: Path, record: str) -> None:
    """A record that cannot be read as a digest (bytes that are not UTF-8, a directory where
    the file goes) sends the build to a rebuild, not a raw error in every later process."""
    directory = _cached(tmp_path / "build", b"the library", b"unused")
    sha = directory / "build.so.sha256"
    sha.unlink()
    if record == "not text":
        sha.write_bytes(b"\xff\xfe\x00garbage")
    else:
        sha.mkdir()
    _cpu_cache.discard_unverified(directory)
    assert not directory.exists()


def test_a_lock_planted_as_a_link_is_never_followed(tmp_path: Path) -> None:
    """In a shared extensions directory, a link planted at the lock's name would have its
    target overwritten with the holder's pid; the lock refuses it instead."""
    directory = tmp_path / "build"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    _cpu_cache.lock_path(directory).symlink_to(victim)
    with pytest.raises(OSError, match="symbolic links"), _cpu_cache.build_lock(directory):
        pass
    assert victim.read_text() == "precious data\n"


def test_a_verified_library_stays_and_a_torch_lock_left_beside_it_goes(tmp_path: Path) -> None:
    directory = _cached(tmp_path / "build", b"the library", b"the library")
    (directory / "lock").touch()  # torch's FileBaton, left by a killed process
    with _cpu_cache.build_lock(directory):
        _cpu_cache.discard_unverified(directory)
    assert (directory / "build.so").exists()
    assert not (directory / "lock").exists()


def test_an_extensions_dir_under_a_file_is_a_kernelpick_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a_file" / "extensions"
    root.parent.write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    # As in a process that has not loaded the kernel yet.
    monkeypatch.setattr(_cpu_build, "_LOADED", set())
    monkeypatch.setattr(_cpu_build, "_FAILED", {})
    monkeypatch.setattr(_cpu_gemm, "_REGISTERED", {})
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    with pytest.raises(ModelConversionError) as raised:
        quantize_model(model, "fp8_per_channel", caps_at(LEVEL))
    ((_layer, error),) = raised.value.failures
    assert isinstance(error, KernelBuildError)
    assert f"TORCH_EXTENSIONS_DIR={root} must name a directory" in str(raised.value)
    assert isinstance(model[0], torch.nn.Linear)  # nothing was changed
    assert not _cpu_build._FAILED  # a directory fixed later is used: not remembered


_PROBED = """
import json, torch
import kernelpick as kp
from kernelpick.integration import quantize_model
caps = kp.probe("cpu")
model = torch.nn.Sequential(torch.nn.Linear(64, 32))
report = quantize_model(model, "fp8_per_channel", caps, kp.Policy(), progress=False)
decision = model[0].kernelpick_decision
reasons = [r.render() for v in decision.trace if v.kernel == "cpu_fp8_gemm" for r in v.reasons]
print(json.dumps({"features": sorted(caps.features), "kernel": report.layers[0].kernel,
                  "reasons": reasons}))
"""


def test_an_extensions_dir_the_probe_cannot_write_turns_the_compiled_kernels_down(
    tmp_path: Path,
) -> None:
    """As with no compiler: the probe reports no usable toolchain, and the layer runs on a
    kernel that needs no build, the compiled one's reason saying what to fix."""
    root = tmp_path / "a_file" / "extensions"
    root.parent.write_text("")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBED], env=env, capture_output=True, text=True, timeout=300,
        check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.splitlines()[-1])
    assert "cpp_toolchain" not in result["features"]
    assert {"cxx_compiler", "ninja"} <= set(result["features"])  # what was found
    assert result["kernel"] not in ("cpu_fp8_gemm", "cpu_fp8_w8a16_gemm", "cpu_int8_gemm")
    assert result["reasons"] == [
        "needs a C++ toolchain; no build root it can create and write (under "
        "TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions)"
    ]
    assert not root.parent.is_dir()  # the probe created nothing


def _load(env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_a_truncated_cached_library_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    # Two builds (tens of seconds each on 2 cores). Loading a truncated library would end
    # the process with SIGBUS, and ninja sees it newer than its sources: it never rebuilds.
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    first = _load(env)
    assert first.stdout == "loaded\n", first.stdout + first.stderr
    (library,) = tmp_path.glob("kernelpick/*/*.so")
    # A first use says what it compiles, for which level, and about how long it takes.
    compiling = f"INFO:kernelpick.kernels:building the CPU kernel for ISA level {LEVEL}"
    assert compiling in first.stderr
    assert f"into {library.parent}; this takes about" in first.stderr
    size = library.stat().st_size
    os.truncate(library, 4096)
    second = _load(env)
    assert second.returncode == 0, f"died with {second.returncode}: {second.stderr}"
    assert second.stdout == "loaded\n", second.stderr
    assert f"INFO:kernelpick.kernels:rebuilding the CPU kernel in {library.parent}" in (
        second.stderr
    )
    assert library.stat().st_size == size
    assert compiling in second.stderr
    # A verified library is loaded, silently.
    third = _load(env)
    assert third.stdout == "loaded\n", third.stderr
    assert compiling not in third.stderr


@contextlib.contextmanager
def _hanging_build(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str]]]:
    """A fresh process building LEVEL whose compile hangs, holding the build's locks
    (kernelpick's and torch's) until it is killed; and the environment in which a process
    builds the same directory with the same compiler, which then fails at once."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    assert compiler is not None
    hanging = tmp_path / "compiler.pid"
    script = tmp_path / "cxx"
    script.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -c "*)\n'
        '  if [ -n "$KP_HANG" ]; then echo $$ > "$KP_HANG.new"; mv "$KP_HANG.new" "$KP_HANG"\n'
        "    exec sleep 600; fi\n"
        '  echo "this compiler compiles nothing" >&2; exit 1;;\n'
        "esac\n"
        f'exec "{compiler}" "$@"\n'
    )
    script.chmod(0o755)
    env = {**os.environ, "CXX": str(script), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOAD], env={**env, "KP_HANG": str(hanging)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not hanging.exists():
            assert holder.poll() is None, "the hanging build ended early"
            assert time.monotonic() < deadline, "the hanging build never reached its compile"
            time.sleep(0.1)
        yield holder, env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)  # python and ninja
        holder.wait()
        if hanging.exists():  # ninja runs each compile in a process group of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(hanging.read_text()), signal.SIGKILL)


@pytest.mark.slow
def test_a_build_killed_holding_its_locks_does_not_block_the_next(tmp_path: Path) -> None:
    # torch's lock (a file it removes when its build ends) outlives a killed build, and
    # torch waits on it with no timeout; kernelpick's flock goes with its holder.
    with _hanging_build(tmp_path) as (holder, env):
        (baton,) = (tmp_path / "ext").glob("kernelpick/*/lock")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        run = _load(env, timeout=120)
    assert "this compiler compiles nothing" in run.stdout, run.stdout + run.stderr
    assert "waiting for the build lock" not in run.stderr
    assert f"rebuilding the CPU kernel in {baton.parent}" in run.stderr
    assert not baton.exists()
