"""Probe the host CPU and the torch build: raw properties, a pure translate, a cached probe."""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from kernelpick.adapters._props import Properties
from kernelpick.core import (
    CPP_TOOLCHAIN_PARTS,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    INT8_DOT_ISA,
    KERNEL_ISA_FLAGS,
    DeviceCaps,
    InvalidValueError,
    parse_cpuinfo,
    toolchain_features,
)
from kernelpick.kernels import toolchain_parts

__all__ = [
    "KERNEL_ISA_FLAGS",
    "parse_cpuinfo",
    "probe",
    "read_properties",
    "translate",
    "usable_isa",
]

# oneDNN, which runs torch's CPU int8 GEMM, uses no ISA that ONEDNN_MAX_CPU_ISA (or its old
# name DNNL_MAX_CPU_ISA) leaves out. Each level, with the int8 dot products (see
# INT8_DOT_ISA) it lets oneDNN use: none below VNNI, where _int_mm's sums saturate; only
# AVX2's VNNI at the AVX2 VNNI levels, only AVX-512's at the AVX-512 ones (neither level
# contains the other), all of them at the AMX levels and by default. An unknown level
# leaves none: int8 then runs on a kernel that needs none, rather than perhaps wrong.
_ONEDNN_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
_INT8_DOT_FLAGS = INT8_DOT_ISA.flags
_AVX2_VNNI, _AVX512_VNNI = frozenset({"avx_vnni"}), frozenset({"avx512_vnni"})
_AMX_UNITS = frozenset({"amx_bf16", "amx_int8", "amx_tile"})
_ONEDNN_INT8_DOT: dict[str, frozenset[str]] = {
    **dict.fromkeys(("SSE41", "AVX", "AVX2", "AVX512_CORE"), frozenset()),
    **dict.fromkeys(("AVX2_VNNI", "AVX2_VNNI_2"), _AVX2_VNNI),
    **dict.fromkeys(
        ("AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512",
         "AVX10_2_512"),
        _AVX512_VNNI,
    ),
    **dict.fromkeys(
        ("AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
         "AVX10_2_512_AMX_2", "DEFAULT"),
        _INT8_DOT_FLAGS,
    ),
}  # fmt: skip

_CPUINFO = Path("/proc/cpuinfo")
# Only the host CPU exists as a device for this adapter.
_CPU_INDEX = 0
# Small enough to cost microseconds, and 16 satisfies _scaled_mm's alignment rule.
_TRIAL_SIZE = 16
# What a torch build without the op, or without this scaling mode, raises. Recent builds
# raise ValueError for a scale layout they do not support, older ones RuntimeError.
_UNSUPPORTED = (RuntimeError, NotImplementedError, AttributeError, TypeError, ValueError)


def usable_isa(flags: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """The CPU's ``flags`` less the int8 dot products and AMX units oneDNN is told not to
    use (its ``ONEDNN_MAX_CPU_ISA`` names a level without them), sorted."""
    level = next((environ[key] for key in _ONEDNN_CAPS if environ.get(key)), "")
    if not level.strip():
        return sorted(set(flags))
    allowed = _ONEDNN_INT8_DOT.get(level.strip().upper(), frozenset())
    # AMX is what the AMX levels allow (their int8 dot products include amx_int8): below
    # them oneDNN runs the avx512_amx build's bf16 tiles (at::native::cpublas::brgemm) and
    # torch's bf16 GEMM on AVX-512 instead.
    if "amx_int8" not in allowed:
        flags = set(flags) - _AMX_UNITS
    return sorted(set(flags) - (_INT8_DOT_FLAGS - allowed))


def _amx_granted() -> bool:
    # Linux lends AMX's tile state only to a process that asks (arch_prctl, kernel 5.16 and
    # later): where it refuses (an older kernel, a seccomp filter), cpuinfo still lists the
    # units, and neither oneDNN nor the avx512_amx build may use them.
    init = getattr(torch.cpu, "_init_amx", None)
    return bool(init()) if callable(init) else False


def _read_cpuinfo() -> str:
    try:
        return _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        # Not Linux, or a sandbox without /proc: no name and no flags, not an error.
        return ""


def _check_index(device_index: object) -> int:
    if (
        not isinstance(device_index, int)
        or isinstance(device_index, bool)
        or device_index != _CPU_INDEX
    ):
        raise InvalidValueError("CPU device index", device_index, "0, the only CPU device")
    return device_index


def _trial_scaled_mm(rowwise: bool) -> bool:
    """Whether this torch build runs ``_scaled_mm`` on CPU, with row-wise or scalar scales.

    A version string cannot tell: CPU support arrived per scaling mode and per build.
    """
    try:
        fp8 = torch.float8_e4m3fn
        a = torch.ones(_TRIAL_SIZE, _TRIAL_SIZE).to(fp8)
        # _scaled_mm wants b column-major [K, N]; the transpose of a row-major tensor is.
        b = torch.ones(_TRIAL_SIZE, _TRIAL_SIZE).to(fp8).t()
        if rowwise:
            scale_a = torch.ones(_TRIAL_SIZE, 1, dtype=torch.float32)
            scale_b = torch.ones(1, _TRIAL_SIZE, dtype=torch.float32)
        else:
            scale_a = torch.tensor(1.0, dtype=torch.float32)
            scale_b = torch.tensor(1.0, dtype=torch.float32)
        torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)
    except _UNSUPPORTED:
        return False
    return True


def read_properties(device_index: int = 0) -> dict[str, object]:
    """The raw facts of the host CPU and torch build, JSON-ready (``translate`` reads them).

    Keys: ``machine``, ``name``, ``isa`` (sorted ``KERNEL_ISA_FLAGS`` present, less the
    int8 dot products ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN from, see ``usable_isa``, and
    less the AMX units where Linux does not grant this process their tile state),
    ``torch_version``, ``scaled_mm`` / ``scaled_mm_rowwise`` found by a tiny trial call, and
    the parts of a C++ toolchain (``CPP_TOOLCHAIN_PARTS``: ``cxx_compiler``, ``ninja``,
    ``writable_build_root``; nothing is compiled or created). Only index 0 exists.
    """
    _check_index(device_index)
    machine = platform.machine()
    model, isa = parse_cpuinfo(_read_cpuinfo())
    if _AMX_UNITS & set(isa) and not _amx_granted():
        isa = sorted(set(isa) - _AMX_UNITS)
    return {
        "machine": machine,
        "name": model or platform.processor() or machine or "CPU",
        "isa": usable_isa(isa, os.environ),
        "torch_version": str(torch.__version__),
        "scaled_mm": _trial_scaled_mm(rowwise=False),
        "scaled_mm_rowwise": _trial_scaled_mm(rowwise=True),
        **toolchain_parts(),
    }


def translate(props: Mapping[str, object]) -> DeviceCaps:
    """The ``DeviceCaps`` of a CPU from its properties (as ``read_properties`` returns them).

    Pure: reads ``machine``, ``name``, ``isa``, ``torch_version``, ``scaled_mm``,
    ``scaled_mm_rowwise`` and each of ``CPP_TOOLCHAIN_PARTS``; a missing or wrongly typed one
    raises ``InvalidValueError``. The toolchain is ``FEATURE_CPP_TOOLCHAIN`` where every part
    was found, else the parts that were (``toolchain_features``).
    """
    read = Properties(props, "CPU")
    found = {
        FEATURE_SCALED_MM: read.flag("scaled_mm"),
        FEATURE_SCALED_MM_ROWWISE: read.flag("scaled_mm_rowwise"),
    }
    parts = [part for part in CPP_TOOLCHAIN_PARTS if read.flag(part)]
    return DeviceCaps.cpu(
        machine=read.text("machine"),
        isa=read.names("isa"),
        name=read.text("name"),
        torch_version=read.text("torch_version"),
        features=[*(f for f, present in found.items() if present), *toolchain_features(parts)],
    )


@functools.cache
def _probe(device_index: int) -> DeviceCaps:
    return translate(read_properties(device_index))


def probe(device_index: int = 0) -> DeviceCaps:
    """The host CPU's ``DeviceCaps``, probed once per process (only index 0 exists)."""
    # Checked before the cache so that probe() and probe(0) share one entry.
    return _probe(_check_index(device_index))
