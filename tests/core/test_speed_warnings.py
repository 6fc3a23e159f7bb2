"""Speed warnings (kernelpick.core._speed): an example table of devices that lack a tool
or an instruction set, and properties named after the laws."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import (
    FEATURE_CPP_TOOLCHAIN,
    MISSING_TOOL_CODES,
    CpuArch,
    SpeedCode,
    SpeedWarning,
)
from tests.core.test_properties import PROPERTY_SETTINGS, Question, questions

CPU = kp.device_profile("cpu")
NO_TOOLCHAIN = attrs.evolve(CPU, features=CPU.features - {FEATURE_CPP_TOOLCHAIN})
NO_AVX2 = attrs.evolve(CPU, arch=CpuArch("x86_64", frozenset({"fma", "f16c"})))
# A Zen 4: VNNI, so torch._int_mm is exact and serves int8 where the compiled kernel cannot.
ZEN4 = attrs.evolve(
    CPU,
    arch=CpuArch("x86_64", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                            "avx512_bf16", "avx512_vnni"}),
)  # fmt: skip
ZEN4_NO_TOOLCHAIN = attrs.evolve(ZEN4, features=ZEN4.features - {FEATURE_CPP_TOOLCHAIN})
T4 = kp.device_profile("t4")
T4_NO_CUPY = attrs.evolve(T4, libraries=T4.libraries - {"cupy"})

Expected = list[tuple[SpeedCode, str]]  # (code, the kernel passed over, or the selected one)

TABLE: list[tuple[str, kp.DeviceCaps, str, str, Expected]] = [
    # The newcomer's AVX2 machine without ninja: torch's _scaled_mm emulation, 15.6x fp32.
    ("no toolchain, fp8_per_tensor", NO_TOOLCHAIN, "fp8_per_tensor", "cpu_tensorwise_scaled_mm",
     [(SpeedCode.MISSING_TOOL, "cpu_fp8_gemm"), (SpeedCode.EMULATED, "cpu_tensorwise_scaled_mm")]),
    ("no toolchain, int8_per_channel", NO_TOOLCHAIN, "int8_per_channel",
     "cpu_dequant_reference",
     [(SpeedCode.MISSING_TOOL, "cpu_int8_gemm"), (SpeedCode.EMULATED, "cpu_dequant_reference")]),
    # With VNNI, _int_mm is native, but the compiled kernel ahead of it was turned down.
    ("VNNI, no toolchain, int8_per_channel", ZEN4_NO_TOOLCHAIN, "int8_per_channel",
     "cpu_int8_int_mm", [(SpeedCode.MISSING_TOOL, "cpu_int8_gemm")]),
    # No AVX2: no tool would help, so only the emulation is named.
    ("no AVX2, fp8_per_tensor", NO_AVX2, "fp8_per_tensor", "cpu_tensorwise_scaled_mm",
     [(SpeedCode.EMULATED, "cpu_tensorwise_scaled_mm")]),
    ("no AVX2, int8_per_channel", NO_AVX2, "int8_per_channel", "cpu_dequant_reference",
     [(SpeedCode.EMULATED, "cpu_dequant_reference")]),
    ("full toolchain", CPU, "fp8_per_tensor", "cpu_fp8_gemm", []),
    ("full toolchain, int8", CPU, "int8_per_channel", "cpu_int8_gemm", []),
    # A degraded W8A16 kernel would not win over a W8A8 one, whatever it needs: not named.
    ("no toolchain, fp8_per_channel", NO_TOOLCHAIN, "fp8_per_channel", "cpu_rowwise_scaled_mm",
     [(SpeedCode.MISSING_TOOL, "cpu_fp8_gemm"), (SpeedCode.EMULATED, "cpu_rowwise_scaled_mm")]),
    # A GPU: cupy absent, the torch dequantize path (DECODE, not an emulation) runs.
    ("t4 without cupy", T4_NO_CUPY, "fp8_weight_only", "cuda_w8a16_torch",
     [(SpeedCode.MISSING_TOOL, "cuda_w8a16_cupy")]),
    ("t4 with cupy", T4, "fp8_weight_only", "cuda_w8a16_cupy", []),
]  # fmt: skip


def _named(warning: SpeedWarning) -> tuple[SpeedCode, str]:
    return (warning.code, warning.passed_over or warning.selected)


@pytest.mark.parametrize(
    ("caps", "scheme", "kernel", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_speed_warning_table(
    caps: kp.DeviceCaps, scheme: str, kernel: str, expected: Expected
) -> None:
    decision = kp.choose(caps, kp.quant_config(scheme, weight_shape=(4096, 4096)))
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == kernel
    assert [_named(w) for w in decision.warnings] == expected
    rendered = decision.render()
    for warning in decision.warnings:
        assert f"Warning: {warning.render()}" in rendered
    record = decision.to_dict()
    assert [w["code"] for w in record["warnings"]] == [code.value for code, _ in expected]


def test_a_missing_tool_warning_names_what_is_missing() -> None:
    decision = kp.choose(NO_TOOLCHAIN, kp.quant_config("fp8_per_tensor", weight_shape=(64, 64)))
    assert isinstance(decision, kp.Selected)
    text = decision.warnings[0].render()
    assert "cpu_fp8_gemm" in text
    assert "toolchain" in text
    assert "cpu_tensorwise_scaled_mm" in text


def test_a_rejection_carries_no_warnings() -> None:
    decision = kp.choose(T4, kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096)))
    assert isinstance(decision, kp.Rejected)
    assert decision.to_dict()["warnings"] == []


def test_an_engine_row_declares_how_it_computes() -> None:
    spec = kp.KernelSpec("mine", "cpu", "W8A16", (), "a reference", compute="emulated")
    assert spec.compute is kp.Compute.EMULATED
    assert kp.KernelSpec("fast", "cpu", "W8A16").compute is kp.Compute.NATIVE
    with pytest.raises(kp.InvalidValueError, match="compute"):
        kp.KernelSpec("bad", "cpu", "W8A16", compute="quick")
    catalog = kp.Catalog((spec,))
    decision = kp.choose(CPU, kp.quant_config("fp8_weight_only", weight_shape=(64, 64)),
                         catalog=catalog)  # fmt: skip
    assert isinstance(decision, kp.Selected)
    assert [w.code for w in decision.warnings] == [SpeedCode.EMULATED]


def test_every_builtin_reference_row_is_an_emulation() -> None:
    for spec in kp.default_catalog():
        if "reference" in spec.id:
            assert spec.compute is kp.Compute.EMULATED, spec.id


caps_variants = st.sampled_from([CPU, NO_TOOLCHAIN, NO_AVX2, ZEN4, ZEN4_NO_TOOLCHAIN, T4,
                                 T4_NO_CUPY])  # fmt: skip


def _check_laws(decision: kp.Decision, catalog: kp.Catalog) -> None:
    if not isinstance(decision, kp.Selected):
        return
    spec = catalog.kernel(decision.kernel)
    emulated = [w for w in decision.warnings if w.code is SpeedCode.EMULATED]
    assert bool(emulated) == (spec.compute is kp.Compute.EMULATED)
    # Law 3: the kernel the same decision picks with every missing tool installed, if
    # another, is named, alone, with exactly its missing-tool reasons.
    installed = [attrs.evolve(v, reasons=tuple(r for r in v.reasons
                                               if r.code not in MISSING_TOOL_CODES))
                 for v in decision.trace]  # fmt: skip
    ok = [v for v in installed if not v.reasons]
    winner = next((v for v in ok if not v.degraded), ok[0] if ok else None)
    named = [w for w in decision.warnings if w.code is SpeedCode.MISSING_TOOL]
    if winner is None or winner.kernel == decision.kernel:
        assert not named
    else:
        assert [w.passed_over for w in named] == [winner.kernel]
        before = next(v for v in decision.trace if v.kernel == winner.kernel)
        assert named[0].reasons == tuple(r for r in before.reasons if r.code in MISSING_TOOL_CODES)
        assert named[0].reasons
    # Warnings never change the choice: without them it is the plain decision.
    assert attrs.evolve(decision, warnings=()) == kp.Selected(
        decision.kernel, decision.trace, decision.degraded
    )


@PROPERTY_SETTINGS
@given(question=questions)
def test_speed_warnings_follow_the_rows_and_the_trace(question: Question) -> None:
    _check_laws(question.choose(), question.catalog)


@PROPERTY_SETTINGS
@given(caps=caps_variants, scheme=st.sampled_from(list(kp.Scheme)))
def test_missing_tool_warnings_name_the_kernel_the_tools_would_get(
    caps: kp.DeviceCaps, scheme: kp.Scheme
) -> None:
    config = kp.quant_config(scheme, weight_shape=(4096, 4096))
    decision = kp.choose(caps, config)
    _check_laws(decision, kp.default_catalog())
    named = [w.passed_over for w in getattr(decision, "warnings", ())
             if w.code is SpeedCode.MISSING_TOOL]  # fmt: skip
    if named:  # installing the tools indeed gets that kernel
        full = attrs.evolve(caps, features=caps.features | {FEATURE_CPP_TOOLCHAIN},
                            libraries=caps.libraries | {"cupy"})  # fmt: skip
        with_tools = kp.choose(full, config)
        assert isinstance(with_tools, kp.Selected)
        assert with_tools.kernel == named[0]


def test_a_second_kernel_missing_the_same_tool_is_not_named() -> None:
    """Both compiled kernels lack the toolchain; with it, the W8A8 one wins, so only it is
    named (installing the toolchain does not get the weight-only one)."""
    policy = kp.Policy(disabled={"cpu_dequant_reference", "cpu_tensorwise_scaled_mm"})
    decision = kp.choose(NO_TOOLCHAIN, kp.quant_config("fp8_per_tensor", weight_shape=(64, 64)),
                         policy)  # fmt: skip
    assert isinstance(decision, kp.Selected)
    assert [w.passed_over for w in decision.warnings if w.code is SpeedCode.MISSING_TOOL] == [
        "cpu_fp8_gemm"
    ]


def test_a_better_kernel_after_a_degraded_choice_is_named() -> None:
    """A degraded choice is a fallback: a non-degraded kernel listed after it, turned down
    only for the toolchain, would win with it."""
    w8a16 = kp.KernelSpec("my_w8a16", "cpu", "W8A16")
    compiled = kp.KernelSpec("my_w8a8", "cpu", "W8A8", (kp.rules.NeedsToolchain(),))
    catalog = kp.Catalog((w8a16, compiled))
    config = kp.quant_config("fp8_per_tensor", weight_shape=(64, 64))
    decision = kp.choose(NO_TOOLCHAIN, config, catalog=catalog)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "my_w8a16"
    assert decision.degraded
    assert [w.passed_over for w in decision.warnings] == ["my_w8a8"]
