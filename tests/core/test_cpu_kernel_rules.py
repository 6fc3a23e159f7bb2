"""The compiled CPU kernels' device rules (docs/design.md#the-catalog-and-its-hardware-facts):
``cpu_fp8_gemm`` and ``cpu_fp8_w8a16_gemm`` need a C++ toolchain (``NeedsToolchain``,
``FEATURE_CPP_TOOLCHAIN``) and AVX2 + FMA + F16C (``CpuIsa``). An example table over
CPUs built by hand, a property over any CPU and layer, and the live probe of this machine.

Nothing is patched: a CPU without a toolchain is a ``DeviceCaps`` without the feature.
"""

from __future__ import annotations

import os
import re
import shutil

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import (
    CPP_TOOLCHAIN_PARTS,
    FEATURE_BUILD_ROOT,
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_CXX_COMPILER,
    FEATURE_NINJA,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    CpuArch,
    GroupShape,
    evaluate,
    scheme_of,
)
from tests.support.values import static_per_token_config

FP8_GEMM = "cpu_fp8_gemm"
W8A16_GEMM = "cpu_fp8_w8a16_gemm"
COMPILED = (FP8_GEMM, W8A16_GEMM)
CATALOG = kp.default_catalog()
# The catalog as it was before the compiled kernels: what a CPU they cannot run on gets.
BEFORE = kp.Catalog(tuple(spec for spec in CATALOG if spec.id not in COMPILED))
# Only the compiled kernels: a CPU they cannot run on is rejected, with hints.
ONLY_COMPILED = kp.Catalog(tuple(spec for spec in CATALOG if spec.id in COMPILED))

NEEDED_ISA = frozenset({"avx2", "fma", "f16c"})
AVX2 = ("avx2", "fma", "f16c")
AVX512 = (*AVX2, "avx512f", "avx512bw", "avx512vl", "avx512_bf16")
NO_F16C = ("avx2", "fma")
ARM = ("asimd", "asimdhp", "sve")
SCALED_MM = (FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE)
EVERYTHING = (*SCALED_MM, FEATURE_CPP_TOOLCHAIN)

PTPC = "fp8_per_channel"
SQUARE = (4096, 4096)
UNALIGNED = (4096, 4100)

C = kp.RejectCode
NO_COMPILER = "no C++ compiler on PATH ($CXX, else c++)"
NO_NINJA = "no ninja (on PATH, or from the ninja package)"
NO_ROOT = (
    "no build root it can create and write (under TORCH_EXTENSIONS_DIR, by default "
    "~/.cache/torch_extensions)"
)
NO_TOOLCHAIN = f"{NO_COMPILER}; {NO_NINJA}; {NO_ROOT}"  # a device that shows no part of it
TOOLCHAIN_LINE = f"  - cpu_fp8_gemm: needs a C++ toolchain; {NO_TOOLCHAIN}"


def _cpu(
    isa: tuple[str, ...] = AVX2, features: tuple[str, ...] = EVERYTHING, machine: str = "x86_64"
) -> kp.DeviceCaps:
    return kp.DeviceCaps.cpu(
        machine=machine, isa=isa, name="test CPU", torch_version="2.13.0", features=features
    )


def _verdict(decision: kp.Decision, kernel: str) -> kp.Verdict:
    return next(v for v in decision.trace if v.kernel == kernel)


def _codes(decision: kp.Decision, kernel: str) -> list[kp.RejectCode]:
    return [r.code for r in _verdict(decision, kernel).reasons]


# --- examples ------------------------------------------------------------------------------

Row = tuple[str, kp.DeviceCaps, str, tuple[int, int], str, list[kp.RejectCode], list[kp.RejectCode]]
EXAMPLES: list[Row] = [
    # id, caps, scheme, shape, selected, cpu_fp8_gemm's codes, cpu_fp8_w8a16_gemm's codes
    ("avx2-toolchain-ptpc", _cpu(), PTPC, SQUARE, FP8_GEMM, [], [C.WEIGHT_ONLY_ACTIVATION]),
    ("avx512-toolchain-ptpc", _cpu(AVX512), PTPC, SQUARE, FP8_GEMM, [], [C.WEIGHT_ONLY_ACTIVATION]),
    ("unaligned-k", _cpu(), PTPC, UNALIGNED, FP8_GEMM, [], [C.WEIGHT_ONLY_ACTIVATION]),
    (
        "weight-only",
        _cpu(),
        "fp8_weight_only",
        SQUARE,
        W8A16_GEMM,
        [C.ACTIVATION_REQUIRED],
        [],
    ),
    # Per-tensor, dynamic or static: the compiled kernel quantizes with one scale itself,
    # ahead of torch's _scaled_mm emulation (15.6x fp32's time per layer on an AVX2 EPYC).
    ("per-tensor", _cpu(), "fp8_per_tensor", SQUARE, FP8_GEMM, [], []),
    ("per-tensor-static", _cpu(), "fp8_per_tensor_static", SQUARE, FP8_GEMM, [], []),
    (
        "per-tensor-no-scaled-mm",
        _cpu(features=(FEATURE_CPP_TOOLCHAIN,)),
        "fp8_per_tensor",
        SQUARE,
        FP8_GEMM,
        [],
        [],
    ),
    (
        "per-tensor-no-toolchain",
        _cpu(features=SCALED_MM),
        "fp8_per_tensor_static",
        SQUARE,
        "cpu_tensorwise_scaled_mm",
        [C.TOOLCHAIN],
        [C.TOOLCHAIN],
    ),
    # No toolchain: both compiled kernels are turned down, and the choice is as before.
    (
        "no-toolchain-ptpc",
        _cpu(features=SCALED_MM),
        PTPC,
        SQUARE,
        "cpu_rowwise_scaled_mm",
        [C.TOOLCHAIN],
        [C.WEIGHT_ONLY_ACTIVATION, C.TOOLCHAIN],
    ),
    (
        "no-toolchain-unaligned",
        _cpu(features=SCALED_MM),
        PTPC,
        UNALIGNED,
        "cpu_dequant_reference",
        [C.TOOLCHAIN],
        [C.WEIGHT_ONLY_ACTIVATION, C.TOOLCHAIN],
    ),
    (
        "no-toolchain-weight-only",
        _cpu(features=SCALED_MM),
        "fp8_weight_only",
        SQUARE,
        "cpu_w8a16_reference",
        [C.ACTIVATION_REQUIRED, C.TOOLCHAIN],
        [C.TOOLCHAIN],
    ),
    # An ISA without F16C, or not x86 at all: turned down for the instructions.
    (
        "no-f16c",
        _cpu(NO_F16C),
        PTPC,
        SQUARE,
        "cpu_rowwise_scaled_mm",
        [C.CPU_ISA],
        [C.WEIGHT_ONLY_ACTIVATION, C.CPU_ISA],
    ),
    (
        "no-f16c-no-toolchain",
        _cpu(NO_F16C, SCALED_MM),
        PTPC,
        SQUARE,
        "cpu_rowwise_scaled_mm",
        [C.CPU_ISA, C.TOOLCHAIN],
        [C.WEIGHT_ONLY_ACTIVATION, C.CPU_ISA, C.TOOLCHAIN],
    ),
    (
        "aarch64",
        _cpu(ARM, machine="aarch64"),
        PTPC,
        SQUARE,
        "cpu_rowwise_scaled_mm",
        [C.CPU_ISA],
        [C.WEIGHT_ONLY_ACTIVATION, C.CPU_ISA],
    ),
    (
        "aarch64-weight-only",
        _cpu(ARM, machine="aarch64"),
        "fp8_weight_only",
        SQUARE,
        "cpu_w8a16_reference",
        [C.ACTIVATION_REQUIRED, C.CPU_ISA],
        [C.CPU_ISA],
    ),
]


@pytest.mark.parametrize(
    ("caps", "scheme", "shape", "selected", "gemm_codes", "w8a16_codes"),
    [row[1:] for row in EXAMPLES],
    ids=[row[0] for row in EXAMPLES],
)
def test_compiled_cpu_kernels(
    caps: kp.DeviceCaps,
    scheme: str,
    shape: tuple[int, int],
    selected: str,
    gemm_codes: list[kp.RejectCode],
    w8a16_codes: list[kp.RejectCode],
) -> None:
    decision = kp.choose(caps, kp.quant_config(scheme, weight_shape=shape))
    assert isinstance(decision, kp.Selected), decision.render()
    assert (decision.kernel, decision.degraded) == (selected, False)
    assert _codes(decision, FP8_GEMM) == gemm_codes
    assert _codes(decision, W8A16_GEMM) == w8a16_codes


def test_without_a_toolchain_the_reason_reads_so_and_the_choice_falls_back() -> None:
    caps = _cpu(features=SCALED_MM)
    config = kp.quant_config(PTPC, weight_shape=SQUARE)
    decision = kp.choose(caps, config)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cpu_rowwise_scaled_mm"
    before = kp.choose(caps, config, catalog=BEFORE)
    assert isinstance(before, kp.Selected)
    assert (decision.kernel, decision.degraded) == (before.kernel, before.degraded)
    lines = decision.render().splitlines()
    assert TOOLCHAIN_LINE in lines
    assert f"  - cpu_fp8_w8a16_gemm: needs a C++ toolchain; {NO_TOOLCHAIN}" in lines
    # The JSON form carries the code, and the same sentence as its message.
    record = next(t for t in decision.to_dict()["trace"] if t["kernel"] == FP8_GEMM)
    assert record["status"] == "rejected"
    assert record["reasons"] == [
        {
            "code": "toolchain",
            "needed": "a C++ toolchain",
            "found": NO_TOOLCHAIN,
            "message": f"needs a C++ toolchain; {NO_TOOLCHAIN}",
        }
    ]


TOOLCHAIN_PARTS_FOUND = [
    # id, the parts the probe found, what the reason says is missing (None: it passes)
    ("all-present", CPP_TOOLCHAIN_PARTS, None),
    ("the-shorthand", (FEATURE_CPP_TOOLCHAIN,), None),
    ("compiler-missing", (FEATURE_NINJA, FEATURE_BUILD_ROOT), NO_COMPILER),
    ("ninja-missing", (FEATURE_CXX_COMPILER, FEATURE_BUILD_ROOT), NO_NINJA),
    ("root-unwritable", (FEATURE_CXX_COMPILER, FEATURE_NINJA), NO_ROOT),
    ("ninja-and-root-missing", (FEATURE_CXX_COMPILER,), f"{NO_NINJA}; {NO_ROOT}"),
    ("none-found", (), NO_TOOLCHAIN),
]


@pytest.mark.parametrize(
    ("found", "missing"),
    [row[1:] for row in TOOLCHAIN_PARTS_FOUND],
    ids=[row[0] for row in TOOLCHAIN_PARTS_FOUND],
)
def test_the_toolchain_reason_names_each_part_that_is_missing(
    found: tuple[str, ...], missing: str | None
) -> None:
    reason = kp.rules.NeedsToolchain().check(
        _cpu(features=(*SCALED_MM, *found)), kp.quant_config(PTPC, weight_shape=SQUARE)
    )
    if missing is None:
        assert reason is None
        return
    assert reason is not None
    assert (reason.code, reason.needed, reason.found) == (C.TOOLCHAIN, "a C++ toolchain", missing)
    assert reason.render() == f"needs a C++ toolchain; {missing}"


def test_the_isa_reason_names_the_missing_instructions_or_the_machine() -> None:
    config = kp.quant_config(PTPC, weight_shape=SQUARE)
    x86 = kp.choose(_cpu(NO_F16C), config).render().splitlines()
    assert (
        "  - cpu_fp8_gemm: requires CPU instructions avx2, f16c, fma; x86_64 CPU lacks f16c" in x86
    )
    arm = kp.choose(_cpu(ARM, machine="aarch64"), config).render().splitlines()
    assert (
        "  - cpu_fp8_gemm: requires CPU instructions avx2, f16c, fma; "
        "aarch64 CPU lacks avx2, f16c, fma"
    ) in arm


def test_cpu_isa_on_a_gpu_says_it_is_not_a_cpu() -> None:
    # Forced onto a GPU, a CPU kernel's own rules still run (docs/design.md#selection-rules).
    config = kp.quant_config(PTPC, weight_shape=SQUARE)
    decision = kp.choose(kp.device_profile("h100"), config, kp.Policy(force=FP8_GEMM))
    assert isinstance(decision, kp.Rejected)
    isa = [r for r in decision.reasons if r.kernel == FP8_GEMM and r.code is C.CPU_ISA]
    assert [r.found for r in isa] == ["device is not a CPU (cuda 9.0)"]


def test_the_cpu_profile_selects_the_compiled_kernels() -> None:
    cpu = kp.device_profile("cpu")
    assert FEATURE_CPP_TOOLCHAIN in cpu.features
    assert isinstance(cpu.arch, CpuArch)
    assert cpu.arch.isa >= NEEDED_ISA
    for scheme, shape, kernel in [
        (PTPC, SQUARE, FP8_GEMM),
        (PTPC, UNALIGNED, FP8_GEMM),
        ("fp8_weight_only", SQUARE, W8A16_GEMM),
        ("fp8_weight_only", UNALIGNED, W8A16_GEMM),
    ]:
        decision = kp.choose(cpu, kp.quant_config(scheme, weight_shape=shape))
        assert isinstance(decision, kp.Selected)
        assert (decision.kernel, decision.degraded) == (kernel, False)


def test_compiled_kernels_come_first_in_the_cpu_section() -> None:
    ids = CATALOG.ids_for("cpu")
    assert ids[:2] == (FP8_GEMM, W8A16_GEMM)
    assert ids.index("cpu_rowwise_scaled_mm") > 1
    for kernel, kind in [(FP8_GEMM, kp.KernelKind.W8A8), (W8A16_GEMM, kp.KernelKind.W8A16)]:
        spec = CATALOG.kernel(kernel)
        assert spec.kind is kind
        assert spec.alignment is None  # a tail path: any N and K
        assert kp.rules.NeedsToolchain() in spec.requires
        assert kp.rules.CpuIsa(NEEDED_ISA) in spec.requires


def test_device_hints_name_the_toolchain_and_the_instructions() -> None:
    config = kp.quant_config(PTPC, weight_shape=SQUARE)
    decision = kp.choose(_cpu(NO_F16C, SCALED_MM), config, catalog=ONLY_COMPILED)
    assert isinstance(decision, kp.Rejected)
    assert decision.hints == (
        "move to a device with CPU instructions avx2, f16c, fma and a C++ toolchain "
        "(a C++ compiler with ninja on PATH), where cpu_fp8_gemm runs",
    )


def test_the_rules_render_what_they_need() -> None:
    assert kp.rules.NeedsToolchain().render() == "a C++ toolchain (compiler and ninja)"
    assert kp.rules.CpuIsa(NEEDED_ISA).render() == "CPU with avx2, f16c, fma"
    assert kp.rules.DynamicActivationScales().render() == "activation scales dynamic"
    static = kp.rules.DynamicActivationScales(frozenset({GroupShape.PER_TENSOR}))
    assert static.render() == "activation scales dynamic (static: per-tensor)"
    # A stored per-token scale is still turned down, saying what it takes instead.
    reason = static.check(_cpu(), static_per_token_config())
    assert reason is not None
    assert (reason.code, reason.needed) == (C.ACTIVATION_SCALES, "dynamic, or static per-tensor")
    stored = kp.quant_config("fp8_per_tensor_static", weight_shape=SQUARE)
    assert static.check(_cpu(), stored) is None


# --- property: any CPU, any layer ------------------------------------------------------------

FLAG_POOL = sorted({*AVX512, *ARM, "amx_int8"})
FEATURE_POOL = sorted({*EVERYTHING, *CPP_TOOLCHAIN_PARTS})
extents = st.one_of(
    st.integers(min_value=1, max_value=9000),
    st.integers(min_value=1, max_value=9000 // 16).map(lambda m: m * 16),
)
cpus = st.builds(
    lambda machine, isa, features: _cpu(tuple(isa), tuple(features), machine),
    st.sampled_from(["x86_64", "aarch64"]),
    st.frozensets(st.sampled_from(FLAG_POOL)),
    st.frozensets(st.sampled_from(FEATURE_POOL)),
)
configs = st.builds(
    lambda scheme, n, k, out, bias: kp.quant_config(
        scheme, weight_shape=(n, k), out_dtype=out, bias=bias
    ),
    st.sampled_from(list(kp.Scheme)),
    extents,
    extents,
    st.sampled_from(["bfloat16", "float16", "float32"]),
    st.booleans(),
)
# Where the compiled kernels run, they take these schemes; every other is served as before.
# (fp8_block at its default block size, 128, the one the compiled kernels read.)
TAKES = {
    kp.Scheme.FP8_PER_CHANNEL: FP8_GEMM,
    kp.Scheme.FP8_PER_TENSOR: FP8_GEMM,
    kp.Scheme.FP8_PER_TENSOR_STATIC: FP8_GEMM,
    kp.Scheme.FP8_BLOCK: FP8_GEMM,
    kp.Scheme.FP8_WEIGHT_ONLY: W8A16_GEMM,
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caps=cpus, config=configs)
@example(caps=_cpu(features=SCALED_MM), config=kp.quant_config(PTPC, weight_shape=SQUARE))
@example(caps=_cpu(NO_F16C), config=kp.quant_config(PTPC, weight_shape=SQUARE))
@example(caps=_cpu(), config=kp.quant_config("fp8_per_tensor", weight_shape=SQUARE))
def test_compiled_kernels_run_exactly_where_their_device_facts_hold(
    caps: kp.DeviceCaps, config: kp.QuantConfig
) -> None:
    assert isinstance(caps.arch, CpuArch)
    # The shorthand, or every part of it.
    toolchain = FEATURE_CPP_TOOLCHAIN in caps.features or caps.features >= {*CPP_TOOLCHAIN_PARTS}
    isa = caps.arch.isa >= NEEDED_ISA
    decision = kp.choose(caps, config)
    assert isinstance(decision, kp.Selected), decision.render()
    for kernel in COMPILED:
        codes = _codes(decision, kernel)
        assert (C.TOOLCHAIN in codes) is not toolchain
        assert (C.CPU_ISA in codes) is not isa
        lines = decision.render().splitlines()
        said = any(line.startswith(f"  - {kernel}: needs a C++ toolchain; ") for line in lines)
        assert said is not toolchain
    before = kp.choose(caps, config, catalog=BEFORE)
    assert isinstance(before, kp.Selected)
    scheme = scheme_of(config)
    taken = TAKES.get(scheme) if toolchain and isa and scheme is not None else None
    # Never degraded: on a CPU a W8A8 kernel serves every activation-quantized scheme.
    assert (decision.kernel, decision.degraded) == (taken or before.kernel, False)


_HINT = re.compile(r"(?:or )?move to a device with (.+), where (\S+) runs")


def _named_device(caps: kp.DeviceCaps, needs: str) -> kp.DeviceCaps:
    """``caps`` with exactly the facts a device hint names added."""
    for part in needs.split(" and "):
        if match := re.fullmatch(r"CPU instructions (.+)", part):
            assert isinstance(caps.arch, CpuArch)
            arch = CpuArch(caps.arch.machine, caps.arch.isa | set(match[1].split(", ")))
            caps = attrs.evolve(caps, arch=arch)
        else:
            assert re.fullmatch(r"a C\+\+ toolchain \(.+\)", part), part
            caps = attrs.evolve(caps, features=caps.features | {FEATURE_CPP_TOOLCHAIN})
    return caps


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caps=cpus, config=configs)
@example(caps=_cpu(NO_F16C, SCALED_MM), config=kp.quant_config(PTPC, weight_shape=SQUARE))
def test_every_device_hint_holds_on_the_cpu_it_names(
    caps: kp.DeviceCaps, config: kp.QuantConfig
) -> None:
    decision = kp.choose(caps, config, catalog=ONLY_COMPILED)
    if not isinstance(decision, kp.Rejected):
        return
    for hint in decision.hints:
        match = _HINT.fullmatch(hint)
        if match is None:
            continue
        device = _named_device(caps, match[1])
        verdict = next(
            v for v in evaluate(device, config, catalog=ONLY_COMPILED) if v.kernel == match[2]
        )
        assert verdict.ok, (hint, [r.render() for r in verdict.reasons])


# --- the live probe of this machine ----------------------------------------------------------

HAS_TOOLCHAIN = bool(shutil.which(os.environ.get("CXX", "c++")) and shutil.which("ninja"))


@pytest.mark.skipif(not HAS_TOOLCHAIN, reason="no C++ compiler and ninja on PATH")
def test_the_probe_of_this_machine_finds_its_toolchain() -> None:
    caps = kp.probe("cpu")
    assert FEATURE_CPP_TOOLCHAIN in caps.features
    assert isinstance(caps.arch, CpuArch)
    decision = kp.choose(caps, kp.quant_config(PTPC, weight_shape=SQUARE))
    assert isinstance(decision, kp.Selected)
    assert _codes(decision, FP8_GEMM) == ([] if caps.arch.isa >= NEEDED_ISA else [C.CPU_ISA])
