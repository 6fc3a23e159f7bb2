"""Linux's /proc/cpuinfo text, read for the facts kernel choice needs: pure, no I/O. The
CPU adapter's probe and the compiled kernels' check of the host before a load read the
same file, and must read it the same way."""

from __future__ import annotations

__all__ = ["KERNEL_ISA_FLAGS", "parse_cpuinfo"]

# The /proc/cpuinfo flags that decide which CPU kernel paths run and are fast: x86 vector,
# FMA, F16C (the compiled kernels decode FP8 with vcvtph2ps), AVX-512, VNNI (int8 dot
# products: oneDNN's int8 GEMM is exact only with them or AMX) and AMX units (x86 "flags"
# line), and Arm SIMD, SVE and bf16/int8 dot products (aarch64 "Features" line).
# Everything else in cpuinfo is noise for kernel choice.
KERNEL_ISA_FLAGS = frozenset(
    {
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_bf16",
        "avx512_fp16",
        "avx512_vnni",
        "avx_vnni",
        "avx512vbmi",
        "amx_bf16",
        "amx_int8",
        "amx_tile",
        "asimd",
        "asimdhp",
        "asimddp",
        "i8mm",
        "bf16",
        "sve",
        "sve2",
    }
)


def parse_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """The model name (None when absent) and the sorted kernel-relevant ISA flags of cpuinfo text.

    Reads the first processor's ``model name`` and its ``flags`` (x86) or ``Features``
    (aarch64) line, keeping only ``KERNEL_ISA_FLAGS``.
    """
    name: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and name is None and value.strip():
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = {flag.lower() for flag in value.split()} & KERNEL_ISA_FLAGS
    return name, sorted(flags)
