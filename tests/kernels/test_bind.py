"""The run seam: a choice becomes a kernel in one call, and the kernel takes the canonical
or the high-precision weight. A kernel of one's own needs three declarations."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import (
    LAUNCHES,
    IntWeightOnly,
    Launch,
    ReferenceW8A8,
    ReferenceW8A16,
    RowMajorKernel,
    bind,
    dequantize_weight,
    quantize_canonical,
)
from tests.support.emulation import DequantThenMatmul

CPU = kp.device_profile("cpu")
CONFIG = kp.quant_config("fp8_per_channel", weight_shape=(32, 64), out_dtype="float32")


def test_a_selected_decision_binds_to_its_kernel() -> None:
    decision = kp.choose(CPU, CONFIG)
    assert isinstance(decision, kp.Selected)
    kernel = bind(decision, CONFIG, CPU)
    assert kernel.kernel_id == decision.kernel
    assert kernel.device == torch.device("cpu")


def test_a_rejection_is_refused_with_its_reasons() -> None:
    decision = kp.choose(
        kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=(32, 64))
    )
    assert isinstance(decision, kp.Rejected)
    with pytest.raises(kp.InvalidValueError, match=r"compute capability 8\.9"):
        bind(decision, CONFIG, CPU)


def test_quantize_weights_is_quantize_then_prepare() -> None:
    kernel = bind("cpu_rowwise_scaled_mm", CONFIG, CPU)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(5, 64)
    direct = kernel.apply(x, kernel.quantize_weights(w))
    canonical = kernel.apply(x, kernel.prepare_weights(*quantize_canonical(w, CONFIG)))
    assert torch.equal(direct, canonical)


def test_quantize_weights_refuses_a_weight_of_the_wrong_shape() -> None:
    kernel = bind("cpu_rowwise_scaled_mm", CONFIG, CPU)
    with pytest.raises(kp.KernelInputError, match="weight"):
        kernel.quantize_weights(torch.randn(64, 32))


def test_the_kernel_reads_its_alignment_from_the_catalog_row() -> None:
    weight_only = kp.quant_config("fp8_weight_only", weight_shape=(32, 64), out_dtype="float32")
    int8 = kp.quant_config("int8_per_channel", weight_shape=(32, 64), out_dtype="float32")
    int4 = kp.quant_config("int4_weight_only", weight_shape=(32, 64), group_size=32)
    int8_wo = kp.quant_config("int8_weight_only", weight_shape=(32, 64))
    for spec in kp.default_catalog():
        family = LAUNCHES[spec.id].family
        config = CONFIG if spec.kind is kp.KernelKind.W8A8 else weight_only
        if issubclass(family, IntWeightOnly):  # each integer family reads its own widths
            config = int4 if Dtype.INT4 in family.FORMATS else int8_wo
        elif "int8" in spec.id:  # an int8 family refuses FP8 weights when it is built
            config = int8
        caps = CPU
        if spec.id == "cpu_int4_gemm":  # built only on a host with AVX512-BF16
            caps = kp.probe("cpu")
            config = kp.quant_config("int4_weight_only", weight_shape=(32, 64), group_size=32)
            if not isinstance(kp.choose(caps, config, kp.Policy(force=spec.id)), kp.Selected):
                continue
        kernel = LAUNCHES[spec.id].kernel(spec, config, caps, torch.device("cpu"))
        assert kernel.spec.alignment == spec.alignment
    assert kp.default_catalog().kernel("cpu_rowwise_scaled_mm").alignment == 16
    assert kp.default_catalog().kernel("cpu_dequant_reference").alignment is None


def test_no_route_builds_a_weight_only_kernel_for_a_per_token_config() -> None:
    # bind checks the rules; Launch.kernel and the family's constructor skip bind, and the
    # kind rule still holds there (vLLM issue 61316).
    spec = kp.default_catalog().kernel("cpu_w8a16_reference")
    with pytest.raises(kp.InvalidValueError, match="cannot honour per-token"):
        LAUNCHES[spec.id].kernel(spec, CONFIG, CPU, torch.device("cpu"))
    with pytest.raises(kp.InvalidValueError, match="cannot honour per-token"):
        ReferenceW8A16(spec, CONFIG, torch.device("cpu"), Dtype.FLOAT8_E4M3FN)
    narrow = attrs.evolve(spec, fallback=frozenset())
    per_tensor = kp.quant_config("fp8_per_tensor", weight_shape=(32, 64), out_dtype="float32")
    with pytest.raises(kp.InvalidValueError, match="cannot honour per-tensor"):
        ReferenceW8A16(narrow, per_tensor, torch.device("cpu"), Dtype.FLOAT8_E4M3FN)
    assert ReferenceW8A16(spec, per_tensor, torch.device("cpu"), Dtype.FLOAT8_E4M3FN)


def test_a_kernel_of_ones_own_is_three_declarations() -> None:
    # 1. the catalog row: what it needs, declared as data.
    spec = kp.KernelSpec("cpu_my_w8a16", "cpu", kp.KernelKind.W8A16, ())
    catalog = kp.Catalog((spec, *kp.default_catalog()))
    # 2. the family: the math (tests.support.emulation.DequantThenMatmul). 3. the launch row.
    launches = {**LAUNCHES, spec.id: Launch(DequantThenMatmul)}
    config = kp.quant_config("fp8_weight_only", weight_shape=(32, 64), out_dtype="float32")
    decision = kp.choose(CPU, config, catalog=catalog)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cpu_my_w8a16"
    kernel = bind(decision, config, CPU, catalog=catalog, launches=launches)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    x = torch.randn(3, 64)
    fp8, scale = quantize_canonical(w, config)
    want = x @ dequantize_weight(fp8, scale, config).t()
    assert torch.allclose(kernel.apply(x, kernel.quantize_weights(w)), want, atol=1e-5)
    # Without its launch row, binding names the ids that have one.
    with pytest.raises(kp.UnknownNameError, match="launchable kernel id"):
        bind(decision, config, CPU, catalog=catalog)


# --- bind re-checks the choice against the config it is given ------------------------------

WEIGHT_ONLY = kp.quant_config("fp8_weight_only", weight_shape=(32, 64))
PER_TENSOR = kp.quant_config("fp8_per_tensor", weight_shape=(32, 64))


def test_a_choice_for_one_config_cannot_be_bound_to_a_config_its_kernel_cannot_run() -> None:
    # The vLLM 61316 combination, back through bind: a weight-only layer's choice bound to a
    # per-token (PTPC) layer would run W8A16 where W8A8 per-token was asked for.
    decision = kp.choose(CPU, WEIGHT_ONLY)
    assert isinstance(decision, kp.Selected)
    # The compiled W8A16 kernel leads the CPU rows: the profile has avx2+fma+f16c and a
    # C++ toolchain.
    assert decision.kernel == "cpu_fp8_w8a16_gemm"
    with pytest.raises(kp.InvalidValueError) as info:
        bind(decision, CONFIG, CPU)
    assert info.value.what == "config"
    assert (
        "  - cpu_fp8_w8a16_gemm: weight-only (W8A16) kernel cannot honour per-token "
        "activation quantization"
    ) in str(info.value)


@pytest.mark.parametrize(
    ("kernel", "config", "reasons"),
    [
        ("cpu_rowwise_scaled_mm", PER_TENSOR, ["requires per-token activation or per-channel"]),
        ("cpu_dequant_reference", WEIGHT_ONLY, ["quantizes activations (W8A8)"]),
        (
            "cpu_tensorwise_scaled_mm",
            CONFIG,
            ["supports per-tensor activation scales", "supports per-tensor weight scales"],
        ),
    ],
)
def test_binding_a_kernel_id_lists_every_reason_its_rules_give(
    kernel: str, config: kp.QuantConfig, reasons: list[str]
) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        bind(kernel, config, CPU)
    lines = [line for line in str(info.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == len(reasons)
    for line, reason in zip(lines, reasons, strict=True):
        assert line.startswith(f"  - {kernel}: {reason}")


def test_a_degraded_but_valid_pair_still_binds() -> None:
    # A weight-only kernel for a per-tensor activation config: the W8A16 fallback.
    kernel = bind("cpu_w8a16_reference", PER_TENSOR, CPU)
    assert kernel.kernel_id == "cpu_w8a16_reference"
    # Policy does not apply at bind: a kernel the default policy would not pick binds.
    assert bind("cpu_dequant_reference", CONFIG, CPU).kernel_id == "cpu_dequant_reference"


def test_bind_reads_the_rules_of_the_catalog_it_is_given() -> None:
    base = kp.default_catalog().kernel("cpu_dequant_reference")
    spec = attrs.evolve(base, requires=(*base.requires, kp.rules.Alignment(128)))
    catalog = kp.Catalog((spec,))
    with pytest.raises(kp.InvalidValueError, match="multiples of 128"):
        bind("cpu_dequant_reference", CONFIG, CPU, catalog=catalog)


# --- the launch row and the family --------------------------------------------------------


def test_bind_refuses_a_family_of_another_kind_than_the_catalog_row() -> None:
    # A weight-only family under a W8A8 row would skip the activation quantization.
    launches = {**LAUNCHES, "cpu_rowwise_scaled_mm": Launch(ReferenceW8A16)}
    with pytest.raises(kp.InvalidValueError, match="a W8A8 family") as info:
        bind("cpu_rowwise_scaled_mm", CONFIG, CPU, launches=launches)
    assert "ReferenceW8A16" in str(info.value)


def test_every_family_declares_the_kind_of_its_rows() -> None:
    for kernel_id, row in LAUNCHES.items():
        assert row.family.KIND is kp.default_catalog().kernel(kernel_id).kind


@attrs.frozen
class NoKind(RowMajorKernel):
    """A family that forgot its KIND."""


@pytest.mark.parametrize("family", [int, object, "ReferenceW8A8", None, NoKind])
def test_a_launch_row_takes_only_a_kernel_family_declaring_its_kind(family: object) -> None:
    with pytest.raises(kp.InvalidValueError, match="Launch family"):
        Launch(family)  # type: ignore[arg-type]


def test_a_launch_row_parses_its_dtypes_and_checks_its_flag() -> None:
    row = Launch(ReferenceW8A8, fused_bias=["bfloat16"])
    assert row.fused_bias == frozenset({Dtype.BFLOAT16})
    assert Launch(ReferenceW8A8, fused_bias=["fp16"]).fused_bias == frozenset({Dtype.FLOAT16})
    with pytest.raises(kp.UnknownNameError):
        Launch(ReferenceW8A8, fused_bias=["bf61"])
    # A bare name is not a set (the rule classes refuse it too), and only outputs count.
    with pytest.raises(kp.InvalidValueError, match="a set of output dtypes"):
        Launch(ReferenceW8A8, fused_bias="bfloat16")
    with pytest.raises(kp.InvalidValueError, match="a set of output dtypes"):
        Launch(ReferenceW8A8, fused_bias=["float8_e4m3fn"])
    with pytest.raises(kp.InvalidValueError, match="fused_quant"):
        Launch(ReferenceW8A8, fused_quant="no")  # type: ignore[arg-type]


# --- bind's arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"config": "fp8_per_channel"}, "config"),
        ({"caps": "cpu"}, "caps"),
        ({"catalog": kp.default_catalog().kernels}, "catalog"),
        ({"launches": [1]}, "launches"),
        (
            {"launches": {"cpu_rowwise_scaled_mm": ReferenceW8A8}},
            "launches['cpu_rowwise_scaled_mm']",
        ),
        ({"device": 3.5}, "device"),
        ({"device": True}, "device"),
        ({"device": b"cpu"}, "device"),
        ({"device": "gpu"}, "device"),
        ({"device": "cuda:x"}, "device"),
        ({"device": -1}, "device"),
    ],
)
def test_bind_refuses_arguments_of_the_wrong_type_by_name(
    kwargs: dict[str, object], what: str
) -> None:
    arguments: dict[str, Any] = {"choice": "cpu_rowwise_scaled_mm", "config": CONFIG, "caps": CPU}
    arguments.update(kwargs)
    with pytest.raises(kp.InvalidValueError) as info:
        bind(**arguments)
    assert info.value.what == what


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_binding_a_gpu_kernel_without_a_gpu_says_there_is_none() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(32, 64))
    with pytest.raises(kp.InvalidValueError, match="torch sees none"):
        bind("cuda_rowwise_scaled_mm", config, kp.device_profile("h100"))
    with pytest.raises(kp.InvalidValueError, match="torch sees none"):
        bind("cuda_rowwise_scaled_mm", config, kp.device_profile("h100"), "cuda")


def test_run_is_apply_on_the_bundle_prepare_weights_derives() -> None:
    kernel = bind("cpu_rowwise_scaled_mm", CONFIG, CPU)
    weight, scale = quantize_canonical(torch.randn(32, 64), CONFIG)
    x, bias = torch.randn(3, 64), torch.randn(32)
    want = kernel.apply(x, kernel.prepare_weights(weight, scale), bias)
    assert torch.equal(kernel.run(x, weight, scale, None, bias), want)
    # It checks the canonical tensors as prepare_weights does.
    with pytest.raises(kp.KernelInputError, match="weight"):
        kernel.run(x, weight.float(), scale)


def test_a_cpu_device_with_an_index_binds_to_the_cpu() -> None:
    # CPU tensors report "cpu", never "cpu:0": an indexed CPU device would refuse them all.
    kernel = bind("cpu_rowwise_scaled_mm", CONFIG, CPU, device="cpu:0")
    assert kernel.device == torch.device("cpu")
    kernel.apply(torch.randn(2, 64), kernel.quantize_weights(torch.randn(32, 64)))
