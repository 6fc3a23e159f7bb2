"""The seed's acceptance behaviours (docs/design.md#the-problem, issue 2), as an example
table on profiles."""

from __future__ import annotations

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import (
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    Dtype,
    Version,
)

PTPC = "fp8_per_channel"
SHAPE = (4096, 4096)
# The FP8 weight-only rows, which serve per-tensor FP8 degraded; the integer ones serve no
# activation-quantized config at all (fallback=frozenset()).
W8A16_CUDA = ("cuda_w8a16_cupy", "cuda_w8a16_torch")


def _choose(device: str, scheme: str, **kwargs: object) -> kp.Decision:
    config = kp.quant_config(scheme, weight_shape=SHAPE, **kwargs)  # type: ignore[arg-type]
    return kp.choose(kp.device_profile(device), config)


def _selected(decision: kp.Decision) -> kp.Selected:
    assert isinstance(decision, kp.Selected), decision.render()
    return decision


@pytest.mark.parametrize("device", ["t4", "a100", "a10g"])
def test_ptpc_before_sm89_is_rejected_with_every_kernels_reason(device: str) -> None:
    decision = _choose(device, PTPC)
    assert isinstance(decision, kp.Rejected)
    assert {r.kernel for r in decision.reasons} == set(kp.default_catalog().ids_for("cuda"))
    for kernel in W8A16_CUDA:
        codes = {r.code for r in decision.reasons if r.kernel == kernel}
        assert kp.RejectCode.WEIGHT_ONLY_ACTIVATION in codes
    text = decision.render()
    assert "Reasons:" in text
    for kernel in W8A16_CUDA:
        assert (
            f"{kernel}: weight-only (W8A16) kernel cannot honour per-token activation quantization"
            in text
        )
    assert "requires compute capability 8.9 or higher" in text


def test_per_tensor_on_a100_falls_back_to_weight_only_degraded() -> None:
    decision = _selected(_choose("a100", "fp8_per_tensor"))
    assert decision.kernel in W8A16_CUDA
    assert decision.degraded


def test_strict_refuses_the_degraded_fallback() -> None:
    config = kp.quant_config("fp8_per_tensor", weight_shape=SHAPE)
    decision = kp.choose(kp.device_profile("a100"), config, kp.Policy(strict=True))
    assert isinstance(decision, kp.Rejected)
    strict = [r for r in decision.reasons if r.code is kp.RejectCode.STRICT_DEGRADED]
    # Every weight-only row is told so, the integer ones too (whose own rules refuse it).
    cuda = kp.default_catalog().for_platform("cuda")
    assert {r.kernel for r in strict} == {s.id for s in cuda if s.kind is kp.KernelKind.W8A16}
    assert set(W8A16_CUDA) < {r.kernel for r in strict}


def test_weight_only_on_a100_selects_cupy_not_degraded() -> None:
    decision = _selected(_choose("a100", "fp8_weight_only"))
    assert (decision.kernel, decision.degraded) == ("cuda_w8a16_cupy", False)


def test_weight_only_without_cupy_falls_to_torch_and_says_why() -> None:
    caps = attrs.evolve(kp.device_profile("a100"), libraries=frozenset())
    decision = _selected(kp.choose(caps, kp.quant_config("fp8_weight_only", weight_shape=SHAPE)))
    assert decision.kernel == "cuda_w8a16_torch"
    cupy = next(v for v in decision.trace if v.kernel == "cuda_w8a16_cupy")
    assert [r.code for r in cupy.reasons] == [kp.RejectCode.LIBRARY_UNAVAILABLE]


@pytest.mark.parametrize(
    "device", ["l4", "l40s", "rtx4090", "h100", "h200", "gh200", "b200", "rtx5090"]
)
def test_ptpc_on_sm89_and_later_selects_rowwise(device: str) -> None:
    decision = _selected(_choose(device, PTPC))
    assert (decision.kernel, decision.degraded) == ("cuda_rowwise_scaled_mm", False)


def test_per_tensor_on_h100_selects_tensorwise() -> None:
    assert _selected(_choose("h100", "fp8_per_tensor")).kernel == "cuda_tensorwise_scaled_mm"


@pytest.mark.parametrize("device", ["mi300x", "mi325x"])
def test_mi300_selects_rowwise_in_fnuz(device: str) -> None:
    assert kp.device_profile(device).fp8_format is Dtype.FLOAT8_E4M3FNUZ
    assert _selected(_choose(device, PTPC)).kernel == "rocm_rowwise_scaled_mm"


def test_mi300x_fp16_model_selects_unfused_because_rowwise_is_bf16_only() -> None:
    decision = _selected(_choose("mi300x", PTPC, out_dtype="float16"))
    assert decision.kernel == "rocm_channelwise_unfused"
    rowwise = decision.trace[0]
    assert rowwise.kernel == "rocm_rowwise_scaled_mm"
    assert [r.code for r in rowwise.reasons] == [kp.RejectCode.OUT_DTYPE]


def test_mi355x_uses_ocp_fp8_and_rowwise() -> None:
    assert kp.device_profile("mi355x").fp8_format is Dtype.FLOAT8_E4M3FN
    assert _selected(_choose("mi355x", PTPC)).kernel == "rocm_rowwise_scaled_mm"


def test_mi355x_on_rocm_6_is_turned_down_for_the_toolkit() -> None:
    caps = attrs.evolve(kp.device_profile("mi355x"), toolkit_version=Version(6, 4))
    decision = kp.choose(caps, kp.quant_config(PTPC, weight_shape=SHAPE))
    assert isinstance(decision, kp.Rejected)
    rowwise = [r for r in decision.reasons if r.kernel == "rocm_rowwise_scaled_mm"]
    assert [r.code for r in rowwise] == [kp.RejectCode.TOOLKIT_VERSION]
    assert "ROCm 7.0 or newer on gfx950" in rowwise[0].render()
    assert "ROCm 6.4" in rowwise[0].render()


def test_mi250x_ptpc_rejected_and_per_tensor_falls_back_degraded() -> None:
    rejected = _choose("mi250x", PTPC)
    assert isinstance(rejected, kp.Rejected)
    weight_only = [r for r in rejected.reasons if r.kernel == "rocm_w8a16_torch"]
    assert [r.code for r in weight_only] == [kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
    fallback = _selected(_choose("mi250x", "fp8_per_tensor"))
    assert (fallback.kernel, fallback.degraded) == ("rocm_w8a16_torch", True)


# The CPU profile without a C++ toolchain: the compiled kernels are turned down.
NO_TOOLCHAIN = frozenset({FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE})


def _verdict(decision: kp.Decision, kernel: str) -> kp.Verdict:
    return next(v for v in decision.trace if v.kernel == kernel)


def test_cpu_selects_the_compiled_fp8_gemm() -> None:
    decision = _selected(_choose("cpu", PTPC))
    assert (decision.kernel, decision.degraded) == ("cpu_fp8_gemm", False)
    assert decision.alternatives == ("cpu_rowwise_scaled_mm", "cpu_dequant_reference")


def test_cpu_without_a_toolchain_selects_rowwise() -> None:
    caps = attrs.evolve(kp.device_profile("cpu"), features=NO_TOOLCHAIN)
    decision = _selected(kp.choose(caps, kp.quant_config(PTPC, weight_shape=SHAPE)))
    assert decision.kernel == "cpu_rowwise_scaled_mm"
    assert [r.code for r in _verdict(decision, "cpu_fp8_gemm").reasons] == [kp.RejectCode.TOOLCHAIN]


def test_cpu_without_rowwise_scaled_mm_falls_to_the_reference() -> None:
    caps = attrs.evolve(kp.device_profile("cpu"), features=frozenset({FEATURE_SCALED_MM}))
    decision = _selected(kp.choose(caps, kp.quant_config(PTPC, weight_shape=SHAPE)))
    assert decision.kernel == "cpu_dequant_reference"
    rowwise = _verdict(decision, "cpu_rowwise_scaled_mm")
    assert [r.code for r in rowwise.reasons] == [kp.RejectCode.TORCH_FEATURE]


def test_unaligned_shape_is_served_by_the_compiled_kernel_never_by_scaled_mm() -> None:
    config = kp.quant_config(PTPC, weight_shape=(4000, 4100))
    decision = _selected(kp.choose(kp.device_profile("cpu"), config))
    assert decision.kernel == "cpu_fp8_gemm"
    rowwise = _verdict(decision, "cpu_rowwise_scaled_mm")
    assert [r.code for r in rowwise.reasons] == [kp.RejectCode.SHAPE_ALIGNMENT]
    assert rowwise.reasons[0].found == "N=4000, K=4100"
    caps = attrs.evolve(kp.device_profile("cpu"), features=NO_TOOLCHAIN)
    assert _selected(kp.choose(caps, config)).kernel == "cpu_dequant_reference"


def test_per_tensor_on_cpu_selects_the_compiled_w8a8_gemm_before_the_scaled_mm_emulation() -> None:
    for scheme in ("fp8_per_tensor", "fp8_per_tensor_static"):
        decision = _selected(_choose("cpu", scheme))
        assert (decision.kernel, decision.degraded) == ("cpu_fp8_gemm", False)
        assert _verdict(decision, "cpu_fp8_w8a16_gemm").ok
        assert _verdict(decision, "cpu_tensorwise_scaled_mm").ok


def test_weight_only_on_cpu_selects_the_compiled_w8a16_gemm() -> None:
    decision = _selected(_choose("cpu", "fp8_weight_only"))
    assert (decision.kernel, decision.degraded) == ("cpu_fp8_w8a16_gemm", False)
    assert "cpu_w8a16_reference" in decision.alternatives
    assert FEATURE_CPP_TOOLCHAIN in kp.device_profile("cpu").features


def test_unaligned_shape_on_h100_is_rejected_with_the_alignment_reason() -> None:
    decision = kp.choose(
        kp.device_profile("h100"), kp.quant_config(PTPC, weight_shape=(4096, 4100))
    )
    assert isinstance(decision, kp.Rejected)
    assert kp.RejectCode.SHAPE_ALIGNMENT in {r.code for r in decision.reasons}


def test_old_torch_is_turned_down_with_the_version() -> None:
    caps = attrs.evolve(kp.device_profile("h100"), torch_version=Version(2, 4))
    decision = kp.choose(caps, kp.quant_config(PTPC, weight_shape=SHAPE))
    assert isinstance(decision, kp.Rejected)
    rowwise = [r for r in decision.reasons if r.kernel == "cuda_rowwise_scaled_mm"]
    assert [r.render() for r in rowwise] == ["requires torch 2.8 or newer; device has torch 2.4"]


def test_every_failing_rule_is_reported_not_only_the_first() -> None:
    decision = kp.choose(kp.device_profile("a100"), kp.quant_config(PTPC, weight_shape=(100, 100)))
    assert isinstance(decision, kp.Rejected)
    tensorwise = {r.code for r in decision.reasons if r.kernel == "cuda_tensorwise_scaled_mm"}
    assert tensorwise == {
        kp.RejectCode.COMPUTE_CAPABILITY,
        kp.RejectCode.ACTIVATION_SCALES,
        kp.RejectCode.WEIGHT_SCALES,
        kp.RejectCode.SHAPE_ALIGNMENT,
    }


def test_kernels_after_the_chosen_one_are_still_evaluated() -> None:
    decision = _selected(_choose("h100", PTPC))
    assert [v.kernel for v in decision.trace] == list(kp.default_catalog().ids_for("cuda"))
    assert decision.alternatives == ("cuda_channelwise_unfused",)


def test_w8a8_kernels_turn_down_a_weight_only_config() -> None:
    decision = _selected(_choose("h100", "fp8_weight_only"))
    for verdict in decision.trace:
        codes = {r.code for r in verdict.reasons}
        assert (kp.RejectCode.ACTIVATION_REQUIRED in codes) == (verdict.kind is kp.KernelKind.W8A8)


def test_decisions_are_cached_and_the_cache_can_be_cleared() -> None:
    kp.clear_cache()
    config = kp.quant_config(PTPC, weight_shape=(1024, 2048))
    first = kp.choose(kp.device_profile("h100"), config)
    assert kp.choose(kp.device_profile("h100"), config) is first
    assert kp.cache_info().hits >= 1
    kp.clear_cache()
    assert kp.cache_info().currsize == 0
    assert kp.choose(kp.device_profile("h100"), config) == first


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("a100", "not a config"), kp.InvalidValueError),
        (("a100", ["unhashable"]), kp.InvalidValueError),
    ],
)
def test_choose_names_an_argument_of_the_wrong_type(
    args: tuple[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error, match="config"):
        kp.choose(kp.device_profile(args[0]), args[1])  # type: ignore[arg-type]
