"""Build and load the CPU FP8 GEMM extension: compiled once per ISA level, cached on disk.

The kernels in ``_cpu_fp8_gemm.cpp`` are compiled at first use with
``torch.utils.cpp_extension`` (a C++ compiler and ninja, found by ``_cpu_toolchain``'s
``toolchain_parts``, which the CPU adapter's probe reports). The build is cached
under torch's extension directory (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), so later processes only load it. The ISA level is chosen
from the device's probed ISA flags, never from the build machine's, and names the build:
one library per level, so an AVX2 build can sit beside an AVX-512 one. Its lock and the
check of a cached library before it is loaded are in ``_cpu_cache``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from kernelpick.core import CPU_BF16_ISA, CPU_FP8_ISA, KernelpickError, parse_cpuinfo
from kernelpick.kernels._cpu_cache import (
    LOGGER,
    build_lock,
    discard_unverified,
    record_verified,
)
from kernelpick.kernels._cpu_toolchain import build_root, compiler, ninja_on_path

__all__ = [
    "BUILD_TIME",
    "ISA_LEVELS",
    "LOCK",
    "VNNI_LEVELS",
    "KernelBuildError",
    "compile_failed",
    "isa_level",
    "levels_within",
    "load_ops",
    "op_name",
]

_SOURCE = Path(__file__).with_name("_cpu_fp8_gemm.cpp")
# The int4 kernel, a second translation unit of the same library (its op only where the
# level has AVX512-BF16).
_INT4_SOURCE = Path(__file__).with_name("_cpu_int4_gemv.cpp")
# The headers it includes: ninja tracks them, and the build name hashes them with it.
_HEADERS = tuple(
    Path(__file__).with_name(n)
    for n in (
        "_cpu_bf16_amx.h",
        "_cpu_bf16_outer.h",
        "_cpu_fp8_codec.h",
        "_cpu_fp8_dot.h",
        "_cpu_fp8_scales.h",
        "_cpu_int8_codec.h",
    )
)

# Each level: the ISA flags the device's caps must show and the compiler flags that enable
# them, best first. Every level needs what the catalog rows' CpuIsa rule names (CPU_FP8_ISA:
# AVX2 + FMA + F16C, whose vcvtph2ps decodes the FP8 weight), the AVX2 level nothing more;
# AVX512-VNNI adds vpdpbusd, four int8 products per int32 lane, for the int8 layers (Cascade
# Lake, Ice Lake); AVX512-BF16 adds vdpbf16ps, two FP8 products per fp32 lane, and uses
# vpdpbusd too: every CPU with AVX512-BF16 has AVX512-VNNI (Cooper Lake, Sapphire Rapids,
# Zen 4 and 5), which _host_lacks checks before a load. The caps cannot be asked for it:
# the CPU adapter drops avx512_vnni where ONEDNN_MAX_CPU_ISA keeps oneDNN from it (see
# usable_isa in kernelpick/adapters/cpu/_device.py), which must not cost FP8 vdpbf16ps.
# On a Cascade Lake or Ice Lake so capped, the avx512 level runs (int8 with vpmaddwd).
# AVX-VNNI (avx_vnni: Alder Lake to Arrow Lake, with no AVX-512) adds the 256-bit vpdpbusd
# to the AVX2 level; a CPU with AVX-512 takes an AVX-512 level instead.
_ANY_LEVEL = CPU_FP8_ISA.flags
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl"})
_AVX512_CFLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl")
_VNNI_CFLAG = "-mavx512vnni"
_AVX_VNNI_CFLAG = "-mavxvnni"
_BF16 = CPU_BF16_ISA.flags  # the AVX-512 ones and VBMI with avx512_bf16
_BF16_CFLAGS = (*_AVX512_CFLAGS, "-mavx512vbmi", "-mavx512bf16", _VNNI_CFLAG)
ISA_LEVELS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "avx512_amx": (
        _BF16 | {"amx_bf16", "amx_tile"},
        (*_BF16_CFLAGS, "-mamx-tile", "-mamx-bf16", "-DKERNELPICK_AMX"),
    ),
    "avx512_bf16": (_BF16, _BF16_CFLAGS),
    "avx512_vnni": (_ANY_LEVEL | _AVX512 | {"avx512_vnni"}, (*_AVX512_CFLAGS, _VNNI_CFLAG)),
    "avx512": (_ANY_LEVEL | _AVX512, _AVX512_CFLAGS),
    "avx2_vnni": (_ANY_LEVEL | {"avx_vnni"}, (_AVX_VNNI_CFLAG,)),
    "avx2": (_ANY_LEVEL, ()),
}
# The levels whose int8 layers sum with vpdpbusd (_cpu_int8_codec.h U8x64, U8x32).
VNNI_LEVELS = frozenset(
    level
    for level, (_, cflags) in ISA_LEVELS.items()
    if {_VNNI_CFLAG, _AVX_VNNI_CFLAG} & set(cflags)
)
# Every level also needs these (the AVX-512 levels use AVX2 code for tails and reductions).
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers, serial without it. The
# library links libgomp.so.1, the soname torch itself loads, so one OpenMP runtime serves
# both and torch.set_num_threads governs the kernel too.
# The C++ standard is torch's own (-std=c++17 or newer, set by cpp_extension).
_BASE_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp")
_LINK_FLAGS = ("-fopenmp",)

# How the build directory is kept (its lock, the hash of its library: see _cpu_cache), in
# the build's name: a kernelpick that keeps it another way never shares a directory with
# this one, which removes torch locks it finds there as left by killed builds.
_CACHE_LAYOUT = "flock+sha256"

# How long a cold build takes, as the log says it before one (docs/kernels.md has the
# figures): 33.5 s on a 2-core AVX2 machine; with an empty TORCH_EXTENSIONS_DIR on a 2-core
# EPYC (Zen 4, gcc 12.2), 25.5 s for the avx512_bf16 level and 13.3 s for avx2.
BUILD_TIME = "half a minute on 2 cores"

# Held while a level is built, loaded and its op registered (re-entrant: the registration
# holds it around load_ops).
LOCK = threading.RLock()
_LOADED: set[str] = set()
# A level whose build failed, with its error: a retry in the same process would only report
# that the library is missing (torch's build records see nothing to rebuild), hiding why.
_FAILED: dict[str, KernelBuildError] = {}


class KernelBuildError(KernelpickError):
    """The CPU kernel could not be compiled or loaded although a toolchain was found.

    ``level`` is the ISA level that was being built; ``detail`` is the compiler's message.
    """

    def __init__(self, level: str, detail: str) -> None:
        self.level = level
        self.detail = detail
        super().__init__(
            f"building the {level} CPU FP8 kernel failed: {detail.strip()[-2000:]}\n"
            "Set KERNELPICK_DISABLED_KERNELS=cpu_fp8_gemm,cpu_fp8_w8a16_gemm,cpu_int8_gemm to run "
            "without it; if the compiler failed, fix the toolchain (a C++17 compiler, ninja)."
        )

    def __reduce__(self) -> tuple[type[KernelBuildError], tuple[str, str]]:
        return (type(self), (self.level, self.detail))


def levels_within(isa: Iterable[str]) -> list[str]:
    """Every ISA level whose flags ``isa`` has (see ``ISA_LEVELS``), best first."""
    flags = frozenset(isa)
    return [level for level, (needs, _cflags) in ISA_LEVELS.items() if needs <= flags]


def isa_level(isa: Iterable[str]) -> str | None:
    """The best ISA level whose flags ``isa`` has (see ``ISA_LEVELS``), or None."""
    return next(iter(levels_within(isa)), None)


def op_name(level: str) -> str:
    """The custom op name of one level: each build registers ``kernelpick::fp8_gemm_<level>``."""
    return f"fp8_gemm_{level}"


def _cflags(level: str) -> list[str]:
    return [*_BASE_FLAGS, *ISA_LEVELS[level][1], f"-DKP_LEVEL={level}"]


def _compiler_identity() -> str:
    # Its path and its version line: a compiler upgraded in place is a new build too.
    path = shutil.which(compiler()) or compiler()
    try:
        run = subprocess.run(
            [path, "--version"], capture_output=True, text=True, errors="replace", timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return path
    return f"{path} {run.stdout.splitlines()[0] if run.stdout else ''}"


def _build_name(level: str) -> str:
    # Everything the library depends on is in the name: the source, the flags, the compiler
    # and torch (whose headers ninja does not track), so an edit or an upgrade is a new
    # build, never a stale load. torch's install path too: two venvs with the same torch
    # write their own include paths into one build.ninja, and would rebuild each other's.
    import torch

    parts = [
        *(path.read_bytes() for path in (_SOURCE, _INT4_SOURCE, *_HEADERS)),
        " ".join(_cflags(level) + list(_LINK_FLAGS)).encode(),
        _compiler_identity().encode(),
        f"{torch.__version__} {torch.version.git_version} {Path(torch.__file__).parent}".encode(),
        _CACHE_LAYOUT.encode(),
    ]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]
    return f"kernelpick_cpu_fp8_{level}_{digest}"


def _build_directory(name: str) -> Path:
    return build_root() / name


def _unusable(directory: Path, error: OSError) -> str:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    valid = (
        f"TORCH_EXTENSIONS_DIR={root} must name a directory this process can create and "
        "write, or be unset (torch's default: ~/.cache/torch_extensions)"
        if root
        else "set TORCH_EXTENSIONS_DIR to a directory this process can create and write"
    )
    return f"its build directory {directory} cannot be created or written ({error}); {valid}"


def _host_cpuinfo_flags() -> frozenset[str]:
    # torch reports no AVX-VNNI; Linux's cpuinfo does, read as the CPU adapter's probe reads
    # it. Elsewhere none is known, and the probe reports no ISA at all.
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    return frozenset(parse_cpuinfo(text)[1])


def _host_lacks(level: str) -> bool:
    # The level comes from the caps' ISA flags, which may describe another machine; loading
    # it on a CPU without those instructions (the bf16 level's VNNI included, which its
    # flags do not name) would end the process with SIGILL.
    import torch

    cpu = torch.cpu
    has: dict[str, bool] = {
        "avx2": cpu._is_avx2_supported(),
        "avx512": cpu._is_avx512_supported(),
        "avx512_vnni": cpu._is_avx512_supported() and cpu._is_vnni_supported(),
        "avx512_bf16": cpu._is_avx512_bf16_supported() and cpu._is_vnni_supported(),
    }
    has["avx512_amx"] = has["avx512_bf16"] and cpu._is_amx_tile_supported()
    has["avx2_vnni"] = has["avx2"] and "avx_vnni" in _host_cpuinfo_flags()
    return not has[level]


def compile_failed(level: str) -> bool:
    """Whether building ``level`` failed in this process because the compiler failed (an
    older compiler may lack a level's flags: -mavxvnni and -mamx-tile need GCC 11), which
    the next level down may not; a lock, a directory or the CPU failing is no such cause."""
    return level in _FAILED


def load_ops(level: str) -> None:
    """Compile (first use on this machine) or load the extension of ``level``, once per process.

    Registers ``torch.ops.kernelpick.fp8_gemm_<level>``. Raises ``KernelBuildError`` if
    this CPU lacks the level's instructions, if the build directory cannot be created or
    written, if another process's build holds its lock past ``LOCK_WAIT_SECONDS``, or if
    the compiler fails.
    """
    if level not in ISA_LEVELS:
        raise KeyError(level)
    if level in _LOADED:
        return
    with LOCK:
        if level in _LOADED:
            return
        if level in _FAILED:
            raise _FAILED[level]
        _build_and_load(level)
        _LOADED.add(level)


def _announce(level: str, directory: Path) -> None:
    # The one wait a user meets on a first use, said before it starts (only the selected
    # level is built); a cached build says nothing.
    sources = ", ".join(path.name for path in (_SOURCE, _INT4_SOURCE))
    LOGGER.info(
        "building the CPU kernel for ISA level %s (%s, compiled with %s): its first use with "
        "this torch, compiler and source, so nothing is cached yet; into %s; this takes "
        "about %s, once",
        level, sources, ", ".join(sorted(ISA_LEVELS[level][0])), directory, BUILD_TIME,
    )  # fmt: skip


def _build_and_load(level: str) -> None:
    if _host_lacks(level):
        flags = ", ".join(sorted(ISA_LEVELS[level][0]))
        raise KernelBuildError(level, f"this CPU lacks some of that level's instructions ({flags})")
    # Imported here: it pulls in setuptools, and most processes never build anything.
    from torch.utils import cpp_extension

    name = _build_name(level)
    directory = _build_directory(name)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(build_lock(directory))
            discard_unverified(directory)
            directory.mkdir(parents=True, exist_ok=True)
        except TimeoutError as error:
            raise KernelBuildError(level, str(error)) from error
        except OSError as error:
            raise KernelBuildError(level, _unusable(directory, error)) from error
        if not (directory / f"{name}.so").exists():
            _announce(level, directory)
        try:
            with ninja_on_path():
                cpp_extension.load(
                    name=name,
                    sources=[str(_SOURCE), str(_INT4_SOURCE)],
                    extra_cflags=_cflags(level),
                    extra_ldflags=list(_LINK_FLAGS),
                    build_directory=str(directory),
                    is_python_module=False,
                    verbose=False,
                )
        except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
            # Remembered: the compiler's message is the cause a retry must report again. (A
            # held lock, an unusable directory or a CPU without the ISA is not: those can
            # change while we run.)
            failure = KernelBuildError(level, str(error))
            _FAILED[level] = failure
            raise failure from error
        try:
            record_verified(directory)
        except OSError as error:
            # This process has its kernel; only the next one pays, with a rebuild.
            LOGGER.warning(
                "could not record the CPU kernel built in %s as verified (%s); the next "
                "process will build it again",
                directory, error,
            )  # fmt: skip
