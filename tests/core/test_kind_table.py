"""The kind table: which activation configs a W8A8 or W8A16 kernel may serve, and how.

Examples first (the table's rows, the profiles the issue names, a spec's declared
fallbacks), then the property the project exists for, over generated catalogs: no W8A16
kernel ever serves a per-token activation config, whatever it declares.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec
from kernelpick.rules import KIND_TABLE, ActivationGrouping, Service

W8A8, W8A16 = kp.KernelKind.W8A8, kp.KernelKind.W8A16
E4M3FN = Dtype.FLOAT8_E4M3FN
SHAPE = (4096, 4096)
BLOCK = "fp8_block"


def _config(act: GroupShape | None, k: int = 4096, *, static: bool = False) -> kp.QuantConfig:
    weight = QuantKey(E4M3FN, ScaleSpec(GroupShape.PER_CHANNEL, static=True))
    key = None if act is None else QuantKey(E4M3FN, ScaleSpec(act, static=static))
    return kp.QuantConfig(weight, key, (256, k), "bfloat16", "bfloat16")


@pytest.mark.parametrize(
    ("group", "k", "grouping"),
    [
        (None, 4096, ActivationGrouping.NONE),
        (GroupShape.PER_TENSOR, 4096, ActivationGrouping.PER_TENSOR),
        (GroupShape.PER_TOKEN, 4096, ActivationGrouping.PER_TOKEN),
        (GroupShape(1, 128), 4096, ActivationGrouping.TOKEN_GROUP),
        (GroupShape(1, 32), 4096, ActivationGrouping.TOKEN_GROUP),
        # A group as wide as the row is one scale per token, whatever it is called.
        (GroupShape(1, 4096), 4096, ActivationGrouping.PER_TOKEN),
        (GroupShape(1, 128), 100, ActivationGrouping.PER_TOKEN),
        (GroupShape(-1, 4096), 4096, ActivationGrouping.PER_TENSOR),
        (GroupShape(128, 128), 4096, ActivationGrouping.OTHER),
        (GroupShape(-1, 128), 4096, ActivationGrouping.OTHER),
    ],
)
def test_an_activation_grouping_is_read_from_the_group_and_k(
    group: GroupShape | None, k: int, grouping: ActivationGrouping
) -> None:
    assert _config(group, k).activation_grouping is grouping


def test_the_table_has_one_row_for_every_kind_and_grouping_and_is_read_only() -> None:
    assert set(KIND_TABLE) == {(kind, g) for kind in kp.KernelKind for g in ActivationGrouping}
    table: Any = KIND_TABLE
    with pytest.raises(TypeError):
        table[(W8A16, ActivationGrouping.PER_TOKEN)] = Service.FALLBACK
    # The rows the issue states: per-token never, per-tensor and token groups degraded.
    assert KIND_TABLE[(W8A16, ActivationGrouping.PER_TOKEN)] is Service.NEVER
    assert KIND_TABLE[(W8A16, ActivationGrouping.PER_TENSOR)] is Service.FALLBACK
    assert KIND_TABLE[(W8A16, ActivationGrouping.TOKEN_GROUP)] is Service.FALLBACK
    assert KIND_TABLE[(W8A8, ActivationGrouping.NONE)] is Service.NEVER


@pytest.mark.parametrize("device", ["a100", "t4"])
def test_block_fp8_before_fp8_tensor_cores_falls_back_to_a_w8a16_kernel_degraded(
    device: str,
) -> None:
    caps = kp.device_profile(device)
    config = kp.quant_config(BLOCK, weight_shape=SHAPE)
    decision = kp.choose(caps, config)
    assert isinstance(decision, kp.Selected), decision.render()
    assert decision.degraded
    assert kp.default_catalog().kernel(decision.kernel).kind is W8A16
    assert "degraded: weight-only (W8A16) kernel" in decision.render()
    strict = kp.choose(caps, config, kp.Policy(strict=True))
    assert isinstance(strict, kp.Rejected)
    for verdict in strict.trace:
        if verdict.kind is W8A16:
            assert kp.RejectCode.STRICT_DEGRADED in {r.code for r in verdict.reasons}


def test_block_fp8_on_an_h100_selects_the_block_w8a8_kernel() -> None:
    decision = kp.choose(kp.device_profile("h100"), kp.quant_config(BLOCK, weight_shape=SHAPE))
    assert isinstance(decision, kp.Selected), decision.render()
    assert (decision.kernel, decision.degraded) == ("cuda_block_scaled_mm", False)


def test_ptpc_on_an_a100_is_still_rejected_with_every_weight_only_reason() -> None:
    decision = kp.choose(
        kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=SHAPE)
    )
    assert isinstance(decision, kp.Rejected)
    weight_only = [v for v in decision.trace if v.kind is W8A16]
    assert weight_only
    for verdict in weight_only:
        reasons = [r for r in verdict.reasons if r.code is kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
        assert len(reasons) == 1
        assert "cannot honour per-token activation quantization" in reasons[0].render()


def test_int8_on_cuda_needs_more_than_16_tokens_a_call() -> None:
    caps = kp.device_profile("a100")
    decode = kp.quant_config("int8_per_channel", weight_shape=SHAPE)
    decision = kp.choose(caps, decode)
    [reason] = next(v for v in decision.trace if v.kernel == "cuda_int8_int_mm").reasons
    assert reason.code is kp.RejectCode.TOKEN_COUNT
    assert reason.render() == (
        "requires M >= 17 rows per call (torch._int_mm on CUDA); layer is called with "
        "M >= 1 (decode)"
    )
    # Decode is served by padding the call to 17 rows instead.
    assert isinstance(decision, kp.Selected)
    assert (decision.kernel, decision.degraded) == ("cuda_int8_int_mm_padded", False)
    prefill = kp.quant_config("int8_per_channel", weight_shape=SHAPE, min_tokens=17)
    chosen = kp.choose(caps, prefill)
    assert isinstance(chosen, kp.Selected)
    assert chosen.kernel == "cuda_int8_int_mm"


def test_a_spec_narrows_its_fallbacks_and_per_token_is_never_one() -> None:
    block = kp.quant_config(BLOCK, weight_shape=SHAPE)
    per_tensor = kp.quant_config("fp8_per_tensor", weight_shape=SHAPE)
    any_weight = kp.rules.WeightScales(
        frozenset({GroupShape.PER_TENSOR, GroupShape.PER_CHANNEL, GroupShape.block(128)})
    )

    def spec(fallback: object) -> kp.KernelSpec:
        return kp.KernelSpec("wo", "cuda", W8A16, (any_weight,), fallback=fallback)  # type: ignore[arg-type]

    t4 = kp.device_profile("t4")
    for fallback, serves_block, serves_tensor in [
        (None, True, True),
        (frozenset({GroupShape.PER_TENSOR}), False, True),
        ({GroupShape(1, 128)}, True, False),
        (frozenset(), False, False),
    ]:
        catalog = kp.Catalog((spec(fallback),))
        assert isinstance(kp.choose(t4, block, catalog=catalog), kp.Selected) is serves_block
        assert isinstance(kp.choose(t4, per_tensor, catalog=catalog), kp.Selected) is serves_tensor
    narrow = kp.choose(t4, block, catalog=kp.Catalog((spec(frozenset()),)))
    assert isinstance(narrow, kp.Rejected)
    assert narrow.render().splitlines()[1] == (
        "  - wo: weight-only (W8A16) kernel cannot honour per-group (1, 128) activation "
        "quantization"
    )
    for refused in ({GroupShape.PER_TOKEN}, {GroupShape(128, 128)}, {"per-tensor"}, "x"):
        with pytest.raises(kp.InvalidValueError, match="fallback"):
            spec(refused)
    with pytest.raises(kp.InvalidValueError, match="W8A8 kernel quantizes activations"):
        kp.KernelSpec("w8a8", "cuda", W8A8, (), fallback=frozenset({GroupShape.PER_TENSOR}))


# --- the property, over catalogs nobody wrote by hand -------------------------------------

_token_groups = st.integers(1, 512).map(GroupShape.per_group)
_any_group = st.one_of(
    st.just(GroupShape.PER_TOKEN),
    st.just(GroupShape.PER_TENSOR),
    _token_groups,
    st.builds(GroupShape, st.sampled_from([-1, 1, 2, 128]), st.sampled_from([-1, 1, 64, 128])),
    st.builds(GroupShape, st.just(-1), st.integers(1, 8192)),
)
_fallbacks = st.one_of(
    st.none(),
    st.frozensets(st.one_of(st.just(GroupShape.PER_TENSOR), _token_groups), max_size=4),
)


@st.composite
def _catalogs(draw: st.DrawFn) -> kp.Catalog:
    specs = []
    for index in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from([W8A8, W8A16]))
        fallback = draw(_fallbacks) if kind is W8A16 else None
        specs.append(kp.KernelSpec(f"k{index}", "cuda", kind, (), fallback=fallback))
    return kp.Catalog(specs)


_activations = st.one_of(
    st.none(),
    st.builds(
        lambda group, static, dtype: QuantKey(dtype, ScaleSpec(group, static=static)),
        _any_group,
        st.booleans(),
        st.sampled_from([E4M3FN, Dtype.INT8]),
    ),
)
_configs = st.builds(
    lambda act, k: kp.QuantConfig(
        QuantKey(E4M3FN, ScaleSpec(GroupShape.block(128), static=True)),
        act,
        (256, k),
        "bfloat16",
        "bfloat16",
    ),
    _activations,
    st.integers(1, 8192),
)


def _one_scale_per_token(config: kp.QuantConfig) -> bool:
    """The test's own reading of "per-token", independent of ActivationGrouping: one scale
    per row, whether the group says -1 or spans K."""
    act = config.activation
    if act is None:
        return False
    group = act.scale.group
    return group.rows == 1 and (group.cols == -1 or group.cols >= config.k)


def _one_scale_per_tensor(config: kp.QuantConfig) -> bool:
    act = config.activation
    if act is None:
        return False
    group = act.scale.group
    return group.rows == -1 and (group.cols == -1 or group.cols >= config.k)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catalog=_catalogs(), config=_configs, strict=st.booleans())
def test_w8a16_never_serves_per_token_activations_in_any_declared_catalog(
    catalog: kp.Catalog, config: kp.QuantConfig, strict: bool
) -> None:
    caps = kp.device_profile("t4")
    decision = kp.choose(caps, config, kp.Policy(strict=strict), catalog)
    act = config.activation
    for verdict in decision.trace:
        if verdict.kind is not W8A16 or not verdict.ok:
            continue
        # A weight-only kernel passed: the config is weight-only, or it stands in, degraded,
        # for one scale per tensor or for groups of a row narrower than K.
        assert not _one_scale_per_token(config)
        if act is not None:
            group = act.scale.group
            token_group = group.rows == 1 and 0 < group.cols < config.k
            assert _one_scale_per_tensor(config) or token_group
        assert verdict.degraded is (act is not None)
        assert not (strict and verdict.degraded)
        spec = catalog.kernel(verdict.kernel)
        if spec.fallback is not None and act is not None:
            assert act.scale.group in spec.fallback
    if isinstance(decision, kp.Selected) and _one_scale_per_token(config):
        assert catalog.kernel(decision.kernel).kind is W8A8


def test_a_spec_with_fallbacks_is_evolved_and_compared_like_any_value() -> None:
    one = kp.KernelSpec("wo", "cpu", W8A16, (), fallback={GroupShape.PER_TENSOR})
    assert one.fallback == frozenset({GroupShape.PER_TENSOR})
    assert one == kp.KernelSpec("wo", "cpu", W8A16, (), fallback=[GroupShape.PER_TENSOR])
    wider = attrs.evolve(one, fallback=None)
    assert wider != one
    assert wider.rules[0] == kp.rules.KIND_RULES[W8A16][0]


def test_a_group_as_wide_as_the_row_is_named_per_token_in_the_reason() -> None:
    config = _config(GroupShape(1, 4096), 4096)
    decision = kp.choose(kp.device_profile("t4"), config)
    assert isinstance(decision, kp.Rejected)
    weight_only = [r for r in decision.reasons if r.code is kp.RejectCode.WEIGHT_ONLY_ACTIVATION]
    assert weight_only
    for reason in weight_only:
        assert reason.render() == (
            "weight-only (W8A16) kernel cannot honour per-group (1, 4096) (per-token) "
            "activation quantization"
        )
