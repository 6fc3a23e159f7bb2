"""An engine brings its own kernels: the seed's behaviours hold on an engine-style catalog.

The catalog below mirrors vLLM's CUDA FP8 scaled-mm order (FlashInfer, CUTLASS, the torch
per-tensor / row-wise / channel-wise paths) with the two weight-only kernels of the
original bug, Marlin and Humming, appended. Their specs declare hardware facts, and Marlin
the activation groupings it stands in for (per-tensor and block FP8's 1x128), as vLLM
lets it: the per-token rule is the core's, keyed on the declared W8A16 kind.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import CudaArch, Dtype, GroupShape, evaluate
from kernelpick.core._kinds import WeightOnlyActivation

CUDA, W8A8, W8A16 = kp.Platform.CUDA, kp.KernelKind.W8A8, kp.KernelKind.W8A16
SM75, SM89, SM90, SM100 = (
    kp.rules.MinComputeCapability(CudaArch(*cc)) for cc in ((7, 5), (8, 9), (9, 0), (10, 0))
)
E4M3 = kp.rules.Fp8Dtypes(frozenset({Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ}))
PER_TENSOR = frozenset({GroupShape.PER_TENSOR})
ACT_ANY = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_TOKEN})
WEIGHT_ANY = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_CHANNEL})
BLOCK_WEIGHTS = WEIGHT_ANY | {GroupShape.block(128)}
# vLLM's Marlin FP8 serves per-tensor and block (1x128 activation groups) configs on GPUs
# without FP8 tensor cores, leaving activations unquantized.
MARLIN_FALLBACK = frozenset({GroupShape.PER_TENSOR, GroupShape.per_group(128)})


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
        kp.KernelSpec(
            "marlin",
            CUDA,
            W8A16,
            (SM75, E4M3, kp.rules.WeightScales(BLOCK_WEIGHTS)),
            fallback=MARLIN_FALLBACK,
        ),
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


def test_block_fp8_on_sm75_selects_marlin_degraded_as_vllm_does() -> None:
    config = kp.quant_config("fp8_block", weight_shape=SHAPE)
    decision = kp.choose(kp.device_profile("t4"), config, catalog=ENGINE)
    assert isinstance(decision, kp.Selected), decision.render()
    assert (decision.kernel, decision.degraded) == ("marlin", True)
    assert decision.alternatives == ("humming",)  # also degraded: it declares no narrowing
    strict = kp.choose(kp.device_profile("t4"), config, kp.Policy(strict=True), catalog=ENGINE)
    assert isinstance(strict, kp.Rejected)


def test_a_stricter_engine_declares_no_block_fallback_and_says_why() -> None:
    stricter = kp.Catalog(
        tuple(
            attrs.evolve(spec, fallback=frozenset({GroupShape.PER_TENSOR}))
            if spec.kind is W8A16
            else spec
            for spec in ENGINE
        )
    )
    block = kp.quant_config("fp8_block", weight_shape=SHAPE)
    decision = kp.choose(kp.device_profile("t4"), block, catalog=stricter)
    assert isinstance(decision, kp.Rejected)
    for kernel in ("marlin", "humming"):
        [reason] = [r for r in decision.reasons if r.kernel == kernel]
        assert reason.code is kp.RejectCode.WEIGHT_ONLY_ACTIVATION
        assert reason.render() == (
            "weight-only (W8A16) kernel cannot honour per-group (1, 128) activation quantization"
        )
    # Per-tensor still falls back: the narrowing is per grouping.
    per_tensor = kp.quant_config("fp8_per_tensor", weight_shape=SHAPE)
    fallback = kp.choose(kp.device_profile("t4"), per_tensor, catalog=stricter)
    assert isinstance(fallback, kp.Selected)
    assert (fallback.kernel, fallback.degraded) == ("marlin", True)


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


# --- rule fields, checked when a rule is built --------------------------------------------

PTPC = kp.quant_config("fp8_per_channel", weight_shape=SHAPE)
H100 = kp.device_profile("h100")


def test_rule_fields_given_as_names_are_parsed_so_they_can_match() -> None:
    assert kp.rules.MinComputeCapability("9.0") == kp.rules.MinComputeCapability(CudaArch(9, 0))
    assert kp.rules.MinComputeCapability("sm_90").arch == CudaArch(9, 0)
    assert kp.rules.Fp8Dtypes({"float8_e4m3fn"}).dtypes == frozenset({Dtype.FLOAT8_E4M3FN})
    assert kp.rules.OutDtypes({"bfloat16"}).dtypes == frozenset({Dtype.BFLOAT16})
    assert kp.rules.InputDtypes(["bf16", "fp16"]).dtypes == {Dtype.BFLOAT16, Dtype.FLOAT16}
    # ISA flags are kept as CpuArch keeps the probed ones: lower case, stripped.
    assert kp.rules.CpuIsa([" AVX2", "f16c"]).flags == frozenset({"avx2", "f16c"})
    # A rule built from names selects as one built from members does.
    rules = (
        kp.rules.MinComputeCapability("9.0"),
        kp.rules.Fp8Dtypes({"float8_e4m3fn"}),
        kp.rules.OutDtypes({"bfloat16"}),
    )
    catalog = kp.Catalog((kp.KernelSpec("mine", CUDA, W8A8, rules),))
    assert isinstance(kp.choose(H100, PTPC, catalog=catalog), kp.Selected)


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: kp.rules.MinComputeCapability(9.0), "CUDA compute capability"),
        (lambda: kp.rules.MinComputeCapability("9"), "CUDA compute capability"),
        (lambda: kp.rules.Alignment(0), "Alignment multiple"),
        (lambda: kp.rules.Alignment(-16), "Alignment multiple"),
        (lambda: kp.rules.Alignment("16"), "Alignment multiple"),  # type: ignore[arg-type]
        (lambda: kp.rules.Alignment(True), "Alignment multiple"),
        (lambda: kp.rules.Alignment(16.0), "Alignment multiple"),  # type: ignore[arg-type]
        (lambda: kp.rules.Fp8Dtypes({"bfloat16"}), "FP8 dtypes"),
        (lambda: kp.rules.Fp8Dtypes("float8_e4m3fn"), "FP8 dtypes"),  # a bare string
        (lambda: kp.rules.Fp8Dtypes(frozenset()), "FP8 dtypes"),
        (lambda: kp.rules.OutDtypes({"float8_e4m3fn"}), "OutDtypes dtypes"),
        (lambda: kp.rules.OutDtypes("bfloat16"), "OutDtypes dtypes"),
        (lambda: kp.rules.InputDtypes(frozenset()), "InputDtypes dtypes"),
        (lambda: kp.rules.ActivationScales({(1, -1)}), "ActivationScales groups"),
        (lambda: kp.rules.ActivationScales(GroupShape.PER_TOKEN), "ActivationScales groups"),
        (lambda: kp.rules.WeightScales(frozenset()), "WeightScales groups"),
        (lambda: kp.rules.NeedsLibrary(("cupy",)), "library"),  # type: ignore[arg-type]
        (lambda: kp.rules.NeedsLibrary(""), "library"),
        (lambda: kp.rules.NeedsTorchFeature(1, "x"), "feature"),  # type: ignore[arg-type]
        (lambda: kp.rules.NeedsTorchFeature("scaled_mm", None), "meaning"),  # type: ignore[arg-type]
        (lambda: kp.rules.CpuIsa("avx2"), "CpuIsa flags"),  # a bare string
        (lambda: kp.rules.CpuIsa(frozenset()), "CpuIsa flags"),
        (lambda: kp.rules.CpuIsa({"avx2", ""}), "CpuIsa flags"),
        (lambda: kp.rules.CpuIsa({"avx2", 3}), "CpuIsa flags"),
        (lambda: kp.rules.CpuIsa(None), "CpuIsa flags"),
    ],
)
def test_rule_fields_are_validated_when_built(make: object, what: str) -> None:
    with pytest.raises(kp.KernelpickError) as info:
        make()  # type: ignore[operator]
    assert isinstance(info.value, (kp.InvalidValueError, kp.UnknownNameError))
    assert what in str(info.value)


def test_an_unknown_dtype_name_in_a_rule_is_named() -> None:
    with pytest.raises(kp.UnknownNameError, match="bfloat61"):
        kp.rules.OutDtypes({"bfloat61"})


def test_a_spec_needs_every_alignment_so_its_alignment_is_their_lcm() -> None:
    spec = kp.KernelSpec("mine", CUDA, W8A8, (kp.rules.Alignment(16), kp.rules.Alignment(24)))
    assert spec.alignment == 48
    catalog = kp.Catalog((spec,))
    for n, k, ok in ((48, 96, True), (24, 24, False), (16, 16, False), (96, 48, True)):
        config = kp.quant_config("fp8_per_channel", weight_shape=(n, k))
        assert isinstance(kp.choose(H100, config, catalog=catalog), kp.Selected) is ok
        assert (n % spec.alignment == 0 and k % spec.alignment == 0) is ok


def test_a_spec_refuses_one_rule_where_a_tuple_is_due() -> None:
    for requires in (kp.rules.Alignment(16), "abc", 16):
        with pytest.raises(kp.InvalidValueError, match="a tuple of requirements"):
            kp.KernelSpec("mine", CUDA, W8A8, requires)  # type: ignore[arg-type]


def test_the_kind_rules_are_read_only() -> None:
    # Cached decisions were made under them; a change would split cached from fresh.
    table: Any = kp.rules.KIND_RULES
    with pytest.raises(TypeError):
        table[W8A16] = ()
    assert kp.rules.KIND_RULES[W8A16] == (WeightOnlyActivation(),)


# --- rules of one's own that misbehave ----------------------------------------------------


@attrs.frozen
class ReturnsFalse:
    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> Any:
        return False

    def render(self) -> str:
        return "returns False"


@attrs.frozen
class ReturnsText:
    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> Any:
        return "too old"

    def render(self) -> str:
        return "returns a string"


@pytest.mark.parametrize("rule", [ReturnsFalse(), ReturnsText()])
def test_a_rule_returning_other_than_a_reason_or_none_is_named(rule: object) -> None:
    catalog = kp.Catalog((kp.KernelSpec("mine", CUDA, W8A8, (rule,)),))  # type: ignore[arg-type]
    kp.clear_cache()
    with pytest.raises(kp.InvalidValueError, match=r"mine's rule .*Returns") as info:
        kp.choose(H100, PTPC, catalog=catalog)
    assert info.value.expected == "a kp.Reason or None"


@attrs.frozen
class PerTokenOnly:
    """Written for W8A8 configs, as a W8A8-only engine would: reads config.activation
    unguarded, so it raises on a weight-only config."""

    def check(self, caps: kp.DeviceCaps, config: kp.QuantConfig) -> kp.Reason | None:
        assert config.activation is not None, "a W8A8 config"
        if config.activation.scale.group == GroupShape.PER_TOKEN:
            return None
        found = config.activation.scale.group.render()
        return kp.Reason(kp.RejectCode.ACTIVATION_SCALES, "per-token", found)

    def render(self) -> str:
        return "per-token only"


def test_a_rule_raising_on_a_scheme_a_hint_asks_about_costs_that_hint_only() -> None:
    spec = kp.KernelSpec("mine", CUDA, W8A8, (PerTokenOnly(), SM100))
    catalog = kp.Catalog((spec,))
    kp.clear_cache()
    decision = kp.choose(H100, PTPC, catalog=catalog)
    assert isinstance(decision, kp.Rejected)
    assert decision.trace == evaluate(H100, PTPC, catalog=catalog)
    # fp8_weight_only, where the rule raises, is left out; the device hint stays.
    assert decision.hints == (
        "move to a device with compute capability 10.0 or higher, where mine runs",
    )
    # The config asked about is not a hint: a rule raising on it still raises.
    with pytest.raises(AssertionError, match="a W8A8 config"):
        kp.choose(H100, kp.quant_config("fp8_weight_only", weight_shape=SHAPE), catalog=catalog)


@pytest.mark.parametrize(
    ("archs", "text"),
    [
        (
            {"gfx942": None, "gfx950": "7.0", "gfx1200": "7.0"},
            "gfx942, or gfx950/gfx1200 with ROCm >= 7.0",
        ),
        (
            {"gfx942": None, "gfx950": "7.0", "gfx1250": "7.2"},
            "gfx942, gfx950 with ROCm >= 7.0, or gfx1250 with ROCm >= 7.2",
        ),
        ({"gfx90a": None, "gfx942": None}, "gfx90a or gfx942"),
        ({"gfx950": "7.0"}, "gfx950 with ROCm >= 7.0"),
    ],
)
def test_an_arch_reason_names_the_rocm_each_arch_needs(
    archs: dict[str, str | None], text: str
) -> None:
    # The device hint is made from this text: it must not offer gfx950 to a ROCm 6 stack.
    rule = kp.rules.RocmArchs(archs)
    assert rule.render() == f"arch {text}"
    rdna3 = attrs.evolve(kp.device_profile("mi250x"), arch=kp.core.RocmArch("gfx1100"))
    reason = rule.check(rdna3, PTPC)
    assert reason is not None
    assert (reason.code, reason.needed) == (kp.RejectCode.GPU_ARCH, text)
