"""An engine brings its own kernels: the seed's behaviours hold on an engine-style catalog.

The catalog below mirrors vLLM's CUDA FP8 scaled-mm order (FlashInfer, CUTLASS, the torch
per-tensor / row-wise / channel-wise paths) with the two weight-only kernels of the
original bug, Marlin and Humming, appended. Their specs declare hardware facts only: the
per-token rule is the core's, keyed on the declared W8A16 kind.
"""

from __future__ import annotations

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import CudaArch, Dtype, GroupShape

CUDA, W8A8, W8A16 = kp.Platform.CUDA, kp.KernelKind.W8A8, kp.KernelKind.W8A16
SM75, SM89, SM90, SM100 = (
    kp.rules.MinComputeCapability(CudaArch(*cc)) for cc in ((7, 5), (8, 9), (9, 0), (10, 0))
)
E4M3 = kp.rules.Fp8Dtypes(frozenset({Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ}))
PER_TENSOR = frozenset({GroupShape.PER_TENSOR})
ACT_ANY = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_TOKEN})
WEIGHT_ANY = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_CHANNEL})


@attrs.frozen
class NeedsFlashInfer:
    """An engine-defined requirement: the protocol is two methods, nothing to subclass."""

    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> kp.Reason | None:
        if "flashinfer" in caps.libraries:
            return None
        return kp.Reason(kp.RejectCode.UNSUPPORTED, "flashinfer installed", "not installed")

    def render(self) -> str:
        return "flashinfer"


ENGINE = kp.Catalog(
    (
        kp.KernelSpec(
            "flashinfer_fp8",
            CUDA,
            W8A8,
            (
                SM100,
                NeedsFlashInfer(),
                E4M3,
                kp.rules.ActivationScales(PER_TENSOR),
                kp.rules.WeightScales(PER_TENSOR),
            ),
        ),
        kp.KernelSpec(
            "cutlass_fp8",
            CUDA,
            W8A8,
            (
                SM89,
                E4M3,
                kp.rules.ActivationScales(ACT_ANY),
                kp.rules.WeightScales(WEIGHT_ANY),
                kp.rules.Alignment(16),
            ),
        ),
        kp.KernelSpec(
            "torch_per_tensor",
            CUDA,
            W8A8,
            (SM89, E4M3, kp.rules.ActivationScales(PER_TENSOR), kp.rules.WeightScales(PER_TENSOR)),
        ),
        kp.KernelSpec(
            "torch_row_wise",
            CUDA,
            W8A8,
            (
                SM90,
                E4M3,
                kp.rules.ActivationScales(ACT_ANY),
                kp.rules.WeightScales(WEIGHT_ANY),
                kp.rules.NotBothPerTensor(),
            ),
        ),
        kp.KernelSpec(
            "torch_channel_wise",
            CUDA,
            W8A8,
            (
                SM89,
                E4M3,
                kp.rules.ActivationScales(ACT_ANY),
                kp.rules.WeightScales(WEIGHT_ANY),
                kp.rules.NotBothPerTensor(),
            ),
        ),
        kp.KernelSpec("marlin", CUDA, W8A16, (SM75, E4M3, kp.rules.WeightScales(WEIGHT_ANY))),
        kp.KernelSpec("humming", CUDA, W8A16, (SM75, E4M3)),
    )
)
A100 = kp.device_profile("a100")
SHAPE = (4096, 4096)


def test_ptpc_on_sm80_is_rejected_with_both_weight_only_reasons() -> None:
    decision = kp.choose(
        A100, kp.quant_config("fp8_per_channel", weight_shape=SHAPE), catalog=ENGINE
    )
    assert isinstance(decision, kp.Rejected)
    assert [v.kernel for v in decision.trace] == list(ENGINE.ids)
    text = decision.render()
    for kernel in ("marlin", "humming"):
        reasons = [r for r in decision.reasons if r.kernel == kernel]
        assert [r.code for r in reasons] == [kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
        assert f"{kernel}: weight-only (W8A16) kernel cannot honour per-token" in text
    assert "flashinfer_fp8: requires flashinfer installed; found not installed" in text


def test_per_tensor_on_sm80_falls_back_to_marlin_degraded() -> None:
    decision = kp.choose(
        A100, kp.quant_config("fp8_per_tensor", weight_shape=SHAPE), catalog=ENGINE
    )
    assert isinstance(decision, kp.Selected)
    assert (decision.kernel, decision.degraded) == ("marlin", True)
    assert decision.alternatives == ("humming",)


def test_ptpc_on_h100_selects_the_engines_cutlass_kernel() -> None:
    decision = kp.choose(
        kp.device_profile("h100"),
        kp.quant_config("fp8_per_channel", weight_shape=SHAPE),
        catalog=ENGINE,
    )
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cutlass_fp8"


def test_the_builtin_catalog_is_not_consulted_for_an_engine_catalog() -> None:
    with pytest.raises(kp.UnknownNameError, match="marlin"):
        kp.choose(
            A100,
            kp.quant_config("fp8_per_tensor", weight_shape=SHAPE),
            kp.Policy(force="cuda_w8a16_torch"),
            catalog=ENGINE,
        )
    assert ENGINE.ids_for("cuda") == ENGINE.ids
    assert ENGINE.ids_for("rocm") == ()


def test_a_platform_with_no_kernels_is_rejected_and_says_so() -> None:
    cpu = kp.device_profile("cpu")
    decision = kp.choose(cpu, kp.quant_config("fp8_per_tensor", weight_shape=SHAPE), catalog=ENGINE)
    assert isinstance(decision, kp.Rejected)
    assert decision.trace == ()
    assert "no kernel for this device's platform" in decision.render()


def test_a_catalog_refuses_duplicate_ids_and_non_requirements() -> None:
    spec = kp.KernelSpec("marlin", CUDA, W8A16)
    with pytest.raises(kp.InvalidValueError, match="marlin"):
        kp.Catalog((spec, spec))
    with pytest.raises(kp.InvalidValueError, match="requirement"):
        kp.KernelSpec("bad", CUDA, W8A16, ("sm89",))  # type: ignore[arg-type]
    with pytest.raises(kp.InvalidValueError, match="kernel id"):
        kp.KernelSpec("has space", CUDA, W8A16)


@attrs.define
class MutableRule:
    """A mutable attrs class: eq without frozen leaves it unhashable."""

    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> kp.Reason | None:
        return None

    def render(self) -> str:
        return "anything"


def test_a_spec_refuses_an_unhashable_requirement_by_name() -> None:
    # A catalog is part of the key a decision is cached under, so it must hash.
    rule = MutableRule()
    with pytest.raises(kp.InvalidValueError, match="hashable") as info:
        kp.KernelSpec("mine", CUDA, W8A16, (E4M3, rule))
    assert (info.value.what, info.value.value) == ("requirement", rule)
    with pytest.raises(kp.InvalidValueError, match="summary"):
        kp.KernelSpec("mine", CUDA, W8A16, summary=["unhashable"])  # type: ignore[arg-type]


def test_a_custom_catalog_is_a_cache_key_like_any_other() -> None:
    kp.clear_cache()
    config = kp.quant_config("fp8_per_tensor", weight_shape=SHAPE)
    first = kp.choose(A100, config, catalog=ENGINE)
    again = kp.Catalog(ENGINE.kernels)  # an equal catalog, built anew
    assert kp.choose(A100, config, catalog=again) is first
    assert kp.cache_info().currsize == 1
    assert kp.choose(A100, config) != first  # the default catalog is another question


def test_extending_the_default_catalog_keeps_the_kind_rule() -> None:
    extra = kp.KernelSpec("my_w8a16", CUDA, W8A16, (E4M3,))
    catalog = kp.Catalog((*kp.default_catalog().kernels, extra))
    decision = kp.choose(
        A100, kp.quant_config("fp8_per_channel", weight_shape=SHAPE), catalog=catalog
    )
    assert isinstance(decision, kp.Rejected)
    mine = [r.code for r in decision.reasons if r.kernel == "my_w8a16"]
    assert mine == [kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
