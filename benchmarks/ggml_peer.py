"""llama.cpp's Q4_0 as a peer of the int4 layers, where the machine has ggml.

``KERNELPICK_GGML`` names a ggml install prefix (its ``include/`` and ``lib/``: llama.cpp's
``ggml`` folder built and installed with CMake, see docs/benchmarks.md). ``ggml_peer()``
then compiles ``ggml_q4_0.c`` against it, once per source and prefix, under the system's
temporary folder, and returns the peer; without the variable it returns None and says why.
A failed build raises: a figure asked for is never left out silently.

Q4_0 is not kernelpick's int4: 32 values share one fp16 scale (4.5 bits a value, against
4.25 for groups of 128 with fp32 scales), and ggml multiplies on int8, the activations
quantized to Q8_0 per 32 values; the peer times the product a llama.cpp decode step runs.
Each weight also keeps a graph, with its x and y, for each of up to 8 counts of tokens it
was called at (not in its ``nbytes``: that is the weight's).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from benchmarks.rotation import Peer

__all__ = ["GGML_ENV", "GgmlWeight", "ggml_peer"]

GGML_ENV = "KERNELPICK_GGML"
_SOURCE = Path(__file__).with_name("ggml_q4_0.c")
_LIBS = ("ggml", "ggml-base", "ggml-cpu")


_POINTER, _INT64 = ctypes.c_void_p, ctypes.c_int64
# The helper's calls: argument types and result type (ggml_q4_0.c).
_CALLS: dict[str, tuple[list[type], type | None]] = {
    "kp_ggml_threads": ([ctypes.c_int], ctypes.c_int),
    "kp_ggml_weight": ([_POINTER, _INT64, _INT64, ctypes.c_int], _POINTER),
    "kp_ggml_repacked": ([_POINTER], ctypes.c_int),
    "kp_ggml_bytes": ([_POINTER], ctypes.c_size_t),
    "kp_ggml_matmul": ([_POINTER, _POINTER, _INT64, _POINTER], ctypes.c_int),
    "kp_ggml_free": ([_POINTER], None),
}


class _Library:
    """The compiled helper's calls, typed."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        for name, (arguments, result) in _CALLS.items():
            call = getattr(lib, name)
            call.argtypes, call.restype = arguments, result
        self._threads = lib.kp_ggml_threads
        self._weight = lib.kp_ggml_weight
        self._repacked = lib.kp_ggml_repacked
        self._bytes = lib.kp_ggml_bytes
        self._matmul = lib.kp_ggml_matmul
        self._free = lib.kp_ggml_free

    def threads(self, count: int) -> None:
        if self._threads(count) != 0:
            raise RuntimeError(f"ggml could not start a pool of {count} threads")

    def weight(self, source: torch.Tensor, repack: bool) -> int:
        fp32 = source.to(torch.float32).contiguous()
        n, k = fp32.shape
        handle = self._weight(fp32.data_ptr(), n, k, int(repack))
        if not handle:
            raise RuntimeError(f"ggml could not quantize a [{n}, {k}] weight to Q4_0 (K % 32)")
        return int(handle)

    def nbytes(self, handle: int) -> int:
        return int(self._bytes(handle))

    def repacked(self, handle: int) -> bool:
        return bool(self._repacked(handle))

    def matmul(self, handle: int, x: torch.Tensor, out: torch.Tensor) -> None:
        status = self._matmul(handle, x.data_ptr(), x.shape[0], out.data_ptr())
        if status != 0:
            raise RuntimeError(f"ggml's Q4_0 product failed (status {status})")

    def free(self, handle: int) -> None:
        self._free(handle)


class GgmlWeight:
    """One weight in Q4_0 (``repacked`` into CPU_REPACK's eight-row tiles where the backend
    took it), freed with this object."""

    def __init__(self, lib: _Library, source: torch.Tensor, repack: bool) -> None:
        self.n, self.k = source.shape
        self._lib = lib
        self._handle = 0  # until ggml holds the weight
        self._handle = lib.weight(source, repack)
        self.nbytes = lib.nbytes(self._handle)
        self.repacked = lib.repacked(self._handle)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.k:  # the helper copies M * K values of x
            raise ValueError(f"x {list(x.shape)}: expected [M, {self.k}] for this weight")
        fp32 = x.to(torch.float32).contiguous()
        out = torch.empty(x.shape[0], self.n, dtype=torch.float32)
        self._lib.matmul(self._handle, fp32, out)
        return out.to(x.dtype)

    def __del__(self) -> None:
        if self._handle:
            self._lib.free(self._handle)


def _build(prefix: Path) -> Path:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise RuntimeError(f"{GGML_ENV} is set, but no C compiler (cc, or $CC) is on PATH")
    for header in ("ggml.h", "ggml-cpu.h"):
        if not (prefix / "include" / header).is_file():
            raise RuntimeError(f"{GGML_ENV}={prefix}: no include/{header}; install ggml there")
    lib = prefix / "lib"
    # The helper is rebuilt for another source, prefix or ggml build at that prefix.
    stamps = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(lib.glob("*"))]
    key = hashlib.sha256("\n".join([_SOURCE.read_text(), str(prefix), *stamps]).encode())
    out = Path(tempfile.gettempdir()) / f"kernelpick-ggml-{key.hexdigest()[:16]}.so"
    if not out.exists():
        partial = f"{out}.{os.getpid()}.tmp"
        command = [
            compiler, "-O2", "-shared", "-fPIC", str(_SOURCE), "-I", str(prefix / "include"),
            "-L", str(lib), f"-Wl,-rpath,{lib}", *(f"-l{name}" for name in _LIBS),
            "-o", partial,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building {_SOURCE.name} against {prefix} failed:\n{done.stderr}")
        os.replace(partial, out)
    return out


def ggml_peer(threads: int, repack: bool = True) -> tuple[Peer | None, str]:
    """The Q4_0 peer on a pool of ``threads`` threads and what it runs, or None and why;
    ``repack`` False keeps the plain Q4_0 rows (llama.cpp's ``--no-repack``)."""
    prefix = os.environ.get(GGML_ENV)
    if not prefix:
        return None, f"not run: set {GGML_ENV} to a ggml install prefix"
    root = Path(prefix).resolve()  # absolute: the helper's rpath
    lib = _Library(_build(root))
    lib.threads(threads)
    peer = Peer(
        "q4_0",
        lambda source, _dtype: GgmlWeight(lib, source, repack),
        lambda x, weight: weight(x),
    )
    layout = "repacked to CPU_REPACK's 8-row tiles where N % 8" if repack else "not repacked"
    return peer, f"llama.cpp ggml Q4_0 ({root}), {layout}, {threads} threads"
