"""The values behind block FP8, int8 and MXFP8: dtypes, scale dtypes, block sizes, tokens
per call, and the rules that read them. Pure: no torch."""

from __future__ import annotations

import pytest

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec
from kernelpick.core._schemes import block_size_of

E4M3FN, INT8, E8M0 = Dtype.FLOAT8_E4M3FN, Dtype.INT8, Dtype.FLOAT8_E8M0FNU
H100 = kp.device_profile("h100")


def test_int8_is_a_quantized_format_and_e8m0_only_a_scale_format() -> None:
    assert INT8.is_quantized
    assert not INT8.is_fp8
    assert (INT8.quant_max, INT8.itemsize) == (127.0, 1)
    assert not E8M0.is_quantized
    assert E8M0.finfo_max == 2.0**127
    assert Dtype.parse("e8m0") is E8M0
    assert Dtype.parse("torch.int8") is INT8
    with pytest.raises(kp.InvalidValueError, match="FP8 dtype or int8"):
        _ = E8M0.quant_max
    with pytest.raises(kp.InvalidValueError, match="quantized dtype"):
        QuantKey(E8M0, ScaleSpec(GroupShape.PER_TENSOR, static=True))
    with pytest.raises(kp.InvalidValueError, match="scale dtype"):
        ScaleSpec(GroupShape.PER_TENSOR, static=True, dtype="bfloat16")


@pytest.mark.parametrize(
    ("size", "scale_shape"), [(128, (32, 56)), (64, (64, 112)), (100, (41, 72))]
)
def test_fp8_block_takes_a_block_size(size: int, scale_shape: tuple[int, int]) -> None:
    config = kp.quant_config("fp8_block", weight_shape=(4096, 7168), block_size=size)
    assert config.weight.scale.group == GroupShape.block(size)
    assert config.activation is not None
    assert config.activation.scale.group == GroupShape.per_group(size)
    assert config.weight_scale_shape == scale_shape
    assert block_size_of(config) == size
    assert kp.core.scheme_of(config) is kp.Scheme.FP8_BLOCK


@pytest.mark.parametrize("size", [0, -128, True, 1.5, "128"])
def test_a_bad_block_size_is_refused_by_name(size: object) -> None:
    with pytest.raises(kp.InvalidValueError, match="block_size"):
        kp.quant_config("fp8_block", weight_shape=(256, 256), block_size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["fp8_per_channel", "mxfp8", "int8_per_channel"])
def test_a_block_size_for_another_scheme_is_refused_not_ignored(scheme: str) -> None:
    with pytest.raises(kp.InvalidValueError, match="only fp8_block takes a block size"):
        kp.quant_config(scheme, weight_shape=(256, 256), block_size=128)


def test_mxfp8_scales_are_e8m0_over_32_elements_of_k() -> None:
    config = kp.quant_config("mxfp8", weight_shape=(4096, 1000))
    assert config.weight.scale.dtype is E8M0
    assert config.weight_block == (1, 32)
    assert config.weight_scale_shape == (4096, 32)  # ceil(1000 / 32)
    assert "(float8_e8m0fnu scales)" in config.render()


@pytest.mark.parametrize("tokens", [0, -1, True, 2.0, None])
def test_min_tokens_is_a_positive_integer(tokens: object) -> None:
    with pytest.raises(kp.InvalidValueError, match="min_tokens"):
        kp.quant_config("int8_per_channel", weight_shape=(64, 64), min_tokens=tokens)  # type: ignore[arg-type]


def test_min_tokens_shows_in_the_config_only_when_it_says_something() -> None:
    decode = kp.quant_config("int8_per_channel", weight_shape=(64, 64))
    prefill = kp.quant_config("int8_per_channel", weight_shape=(64, 64), min_tokens=512)
    assert "M >=" not in decode.render()
    assert "M >= 512" in prefill.render()
    assert decode != prefill


def test_min_tokens_rule_reads_the_config() -> None:
    rule = kp.rules.MinTokens(17, "torch._int_mm on CUDA")
    decode = kp.quant_config("int8_per_channel", weight_shape=(64, 64))
    assert rule.check(H100, decode) is not None
    for tokens in (17, 4096):
        ok = kp.quant_config("int8_per_channel", weight_shape=(64, 64), min_tokens=tokens)
        assert rule.check(H100, ok) is None
    few = kp.quant_config("int8_per_channel", weight_shape=(64, 64), min_tokens=4)
    reason = rule.check(H100, few)
    assert reason is not None
    assert reason.render() == (
        "requires M >= 17 rows per call (torch._int_mm on CUDA); layer is called with M >= 4"
    )
    with pytest.raises(kp.InvalidValueError, match="MinTokens minimum"):
        kp.rules.MinTokens(0)


def test_scale_dtype_rules_refuse_e8m0_unless_declared() -> None:
    mx = kp.quant_config("mxfp8", weight_shape=(64, 64))
    groups = frozenset({GroupShape(32, 1)})
    fp32_only = kp.rules.WeightScales(groups)
    reason = fp32_only.check(H100, mx)
    assert reason is not None
    assert reason.code is kp.RejectCode.SCALE_DTYPE
    assert reason.render() == "reads float32 scales; config has float8_e8m0fnu (weight) scales"
    assert kp.rules.WeightScales(groups, {E8M0}).check(H100, mx) is None
    act = kp.rules.ActivationScales(frozenset({GroupShape(1, 32)}))
    assert act.check(H100, mx) is not None
    both = kp.rules.ScaleDtypes({"float32", "e8m0"})
    assert both.check(H100, mx) is None
    reason = kp.rules.ScaleDtypes({Dtype.FLOAT32}).check(H100, mx)
    assert reason is not None
    assert "(weight)" in reason.found
    with pytest.raises(kp.InvalidValueError):
        kp.rules.ScaleDtypes({"bfloat16"})


def test_quant_dtypes_names_what_the_config_has() -> None:
    int8 = kp.quant_config("int8_per_channel", weight_shape=(64, 64))
    fp8 = kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
    rule = kp.rules.QuantDtypes({"int8"})
    assert rule.check(H100, int8) is None
    reason = rule.check(H100, fp8)
    assert reason is not None
    assert reason.render() == "supports quantized int8; config has float8_e4m3fn"
    fp8_rule = kp.rules.Fp8Dtypes({E4M3FN})
    refused = fp8_rule.check(H100, int8)
    assert refused is not None
    assert refused.found == "int8"
    with pytest.raises(kp.InvalidValueError):
        kp.rules.Fp8Dtypes({"int8"})  # the FP8-only rule stays FP8-only


@pytest.mark.parametrize(
    ("device", "code"),
    [
        ("h100", None),
        ("b200", None),
        ("a100", "gpu_arch"),
        ("rtx5090", "gpu_arch"),
        ("cpu", "gpu_arch"),
    ],
)
def test_cuda_archs_reads_the_major_and_the_cuda_it_needs(device: str, code: str | None) -> None:
    rule = kp.rules.CudaArchs({9: "12.9", 10: "12.9"})
    config = kp.quant_config("fp8_block", weight_shape=(256, 256))
    reason = rule.check(kp.device_profile(device), config)
    assert (None if reason is None else reason.code.value) == code
    old = kp.DeviceCaps.cuda(
        "9.0", name="H100 on CUDA 12.4", torch_version="2.13", cuda_version="12.4"
    )
    reason = rule.check(old, config)
    assert reason is not None
    assert reason.render() == "requires CUDA 12.9 or newer on SM 9.x; device has CUDA 12.4"
    assert rule.render() == "arch SM 9.x with CUDA >= 12.9 or SM 10.x with CUDA >= 12.9"
    for bad in ({}, {"9": None}, {0: None}, [9]):
        with pytest.raises(kp.InvalidValueError, match="CudaArchs"):
            kp.rules.CudaArchs(bad)  # type: ignore[arg-type]
