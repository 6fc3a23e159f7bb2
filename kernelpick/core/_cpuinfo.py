"""Linux's /proc/cpuinfo text, read for the facts kernel choice needs: pure, no I/O. The
CPU adapter's probe and the compiled kernels' check of the host before a load read the
same file, and must read it the same way."""

from __future__ import annotations

__all__ = ["ISA_CLASSES", "KERNEL_ISA_FLAGS", "isa_class", "parse_cpuinfo"]

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


# What a CPU has for the products quantized kernels make, best first: the fact that decides
# whether a quantized CPU layer beats F.linear (docs/benchmarks.md). With AMX, torch's bf16
# F.linear itself runs on tiles; with AVX512-BF16, kernelpick's kernels take bf16 products
# that AVX2 lacks; VNNI gives int8 dot products. The first row whose flags the CPU has all
# of names it.
ISA_CLASSES: tuple[tuple[str, frozenset[str]], ...] = (
    ("AMX", frozenset({"amx_tile", "amx_bf16"})),
    ("AVX-512 with BF16 and VNNI", frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})),
    ("AVX-512 with VNNI", frozenset({"avx512f", "avx512_vnni"})),
    ("AVX-512", frozenset({"avx512f"})),
    ("AVX2 with AVX-VNNI", frozenset({"avx2", "avx_vnni"})),
    ("AVX2 only", frozenset({"avx2"})),
    ("Arm with BF16 and I8MM", frozenset({"bf16", "i8mm"})),
    ("Arm with dot products", frozenset({"asimddp"})),
    ("Arm NEON", frozenset({"asimd"})),
)


def isa_class(isa: frozenset[str]) -> str:
    """What ``isa`` (kernel-relevant flags) has for quantized products: the first row of
    ``ISA_CLASSES`` it has every flag of, else ``"no AVX2 or NEON"``."""
    return next((name for name, flags in ISA_CLASSES if flags <= isa), "no AVX2 or NEON")
