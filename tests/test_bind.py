"""The run seam: a choice becomes a kernel in one call, and the kernel takes the canonical
or the high-precision weight. A kernel of one's own needs three declarations."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.adapters import LAUNCHES, Launch, bind
from kernelpick.kernels import dequantize_weight, quantize_weight
from tests.emulation import DequantThenMatmul

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
    canonical = kernel.apply(x, kernel.prepare_weights(*quantize_weight(w, CONFIG)))
    assert torch.equal(direct, canonical)


def test_quantize_weights_refuses_a_weight_of_the_wrong_shape() -> None:
    kernel = bind("cpu_rowwise_scaled_mm", CONFIG, CPU)
    with pytest.raises(kp.KernelInputError, match="weight"):
        kernel.quantize_weights(torch.randn(64, 32))


def test_the_kernel_reads_its_alignment_from_the_catalog_row() -> None:
    for spec in kp.default_catalog():
        kernel = LAUNCHES[spec.id].kernel(spec, CONFIG, CPU, torch.device("cpu"))
        assert kernel.spec.alignment == spec.alignment
    assert kp.default_catalog().kernel("cpu_rowwise_scaled_mm").alignment == 16
    assert kp.default_catalog().kernel("cpu_dequant_reference").alignment is None


def test_a_kernel_of_ones_own_is_three_declarations() -> None:
    # 1. the catalog row: what it needs, declared as data.
    spec = kp.KernelSpec("cpu_my_w8a16", "cpu", kp.KernelKind.W8A16, ())
    catalog = kp.Catalog((spec, *kp.default_catalog()))
    # 2. the family: the math (tests.emulation.DequantThenMatmul). 3. the launch row.
    launches = {**LAUNCHES, spec.id: Launch(DequantThenMatmul)}
    config = kp.quant_config("fp8_weight_only", weight_shape=(32, 64), out_dtype="float32")
    decision = kp.choose(CPU, config, catalog=catalog)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cpu_my_w8a16"
    kernel = bind(decision, config, CPU, catalog=catalog, launches=launches)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    x = torch.randn(3, 64)
    fp8, scale = quantize_weight(w, config)
    want = x @ dequantize_weight(fp8, scale, config).t()
    assert torch.allclose(kernel.apply(x, kernel.quantize_weights(w)), want, atol=1e-5)
    # Without its launch row, binding names the ids that have one.
    with pytest.raises(kp.UnknownNameError, match="launchable kernel id"):
        bind(decision, config, CPU, catalog=catalog)
