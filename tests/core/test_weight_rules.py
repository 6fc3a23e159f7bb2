"""The integer weight-layout rules: group size, zero points, act-order and tensor-parallel
straddling each turn a kernel down with their own code; the opt-in defaults and the law
hold for every kernel, an engine's included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantConfig, QuantKey, ScaleSpec, evaluate, scheme_of
from kernelpick.rules import ActOrder, GroupSizes, WholeGroupsPerPart, ZeroPoints

CPU = kp.device_profile("cpu")
CODE = kp.RejectCode


def _int4(
    group: int = 128,
    *,
    symmetric: bool = True,
    act_order: bool = False,
    k: int = 4096,
    k_parts: int = 1,
) -> QuantConfig:
    return kp.quant_config(
        "int4_weight_only", weight_shape=(4096, k), group_size=group, symmetric=symmetric,
        act_order=act_order, k_parts=k_parts,
    )  # fmt: skip


# (rule, config, the code it gives, or None where the rule holds)
TABLE = [
    (GroupSizes(frozenset({32, 64, 128})), _int4(128), None),
    (GroupSizes(frozenset({32, 64, 128})), _int4(96), CODE.GROUP_SIZE),
    (GroupSizes(frozenset({32}), per_channel=False), _int4(-1), CODE.GROUP_SIZE),
    (GroupSizes(frozenset({32})), _int4(-1), None),
    (GroupSizes(frozenset({32}), whole_k=True), _int4(32, k=4000), None),
    (GroupSizes(frozenset({32}), whole_k=True), _int4(32, k=4001), CODE.GROUP_SIZE),
    (GroupSizes(None), _int4(96), None),
    (GroupSizes(frozenset(), per_channel=True), _int4(128), CODE.GROUP_SIZE),
    (
        GroupSizes(frozenset({128})),
        kp.quant_config("fp8_block", weight_shape=(256, 256)),
        CODE.GROUP_SIZE,
    ),
    (ZeroPoints(), _int4(symmetric=False), CODE.ZERO_POINTS),
    (ZeroPoints(), _int4(), None),
    (ZeroPoints(frozenset({"int4"})), _int4(symmetric=False), None),
    (ZeroPoints(frozenset({"int8"})), _int4(symmetric=False), CODE.ZERO_POINTS),
    (ActOrder(False), _int4(act_order=True), CODE.ACT_ORDER),
    (ActOrder(True), _int4(act_order=True), None),
    (ActOrder(False), _int4(), None),
    (WholeGroupsPerPart(), _int4(128, k=2048, k_parts=2), None),
    (WholeGroupsPerPart(), _int4(128, k=2000, k_parts=2), CODE.GROUP_STRADDLE),
    (WholeGroupsPerPart(), _int4(128, k=2000), None),  # unsplit: a short last group only
    (WholeGroupsPerPart(), _int4(-1, k=2000, k_parts=2), None),  # per channel: one per part
    # A group deeper than one part but not the whole K: rank 1 starts inside group 0.
    (WholeGroupsPerPart(), _int4(384, k=256, k_parts=2), CODE.GROUP_STRADDLE),
    (WholeGroupsPerPart(), _int4(512, k=256, k_parts=2), None),  # one group down all of K
    (WholeGroupsPerPart(), _int4(128, k=2048, k_parts=2, act_order=True), CODE.GROUP_STRADDLE),
]


@pytest.mark.parametrize(("rule", "config", "code"), TABLE)
def test_each_rule_gives_its_own_code(
    rule: kp.rules.Requirement, config: QuantConfig, code: kp.RejectCode | None
) -> None:
    reason = rule.check(CPU, config)
    assert (None if reason is None else reason.code) is code
    if reason is not None:
        assert reason.render()
        assert rule.render()


def test_a_kernel_that_declares_nothing_reads_symmetric_weights_in_order() -> None:
    spec = kp.KernelSpec("cpu_mine", "cpu", kp.KernelKind.W8A16, ())
    catalog = kp.Catalog((spec,))
    for config, code in [
        (_int4(symmetric=False), CODE.ZERO_POINTS),
        (_int4(act_order=True), CODE.ACT_ORDER),
        (_int4(k=2000, k_parts=2), CODE.GROUP_STRADDLE),
    ]:
        decision = kp.choose(CPU, config, catalog=catalog)
        assert isinstance(decision, kp.Rejected)
        assert [r.code for r in decision.reasons] == [code]
    assert isinstance(kp.choose(CPU, _int4(), catalog=catalog), kp.Selected)
    declared = kp.KernelSpec(
        "cpu_mine", "cpu", kp.KernelKind.W8A16, (ZeroPoints(frozenset({"int4"})), ActOrder(True))
    )
    assert isinstance(
        kp.choose(CPU, _int4(symmetric=False, act_order=True), catalog=kp.Catalog((declared,))),
        kp.Selected,
    )


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: QuantKey("int4", ScaleSpec(GroupShape(128, 1), static=True), zero_point="int8"),
            "zero_point",
        ),
        (
            lambda: QuantKey(
                "float8_e4m3fn", ScaleSpec(GroupShape.PER_CHANNEL, static=True), zero_point="int8"
            ),
            "zero_point",
        ),
        (
            lambda: kp.quant_config(
                "int4_weight_only", weight_shape=(64, 64), group_size=-1, act_order=True
            ),
            "act_order",
        ),
        (
            lambda: kp.quant_config("fp8_per_channel", weight_shape=(64, 64), group_size=32),
            "group_size",
        ),
        (
            lambda: kp.quant_config("int8_per_channel", weight_shape=(64, 64), symmetric=False),
            "symmetric",
        ),
        (
            lambda: kp.quant_config("int4_weight_only", weight_shape=(64, 64), group_size=0),
            "group_size",
        ),
        (
            lambda: QuantConfig(
                QuantKey("int4", ScaleSpec(GroupShape(32, 1), static=True)),
                QuantKey("int4", ScaleSpec(GroupShape.PER_TOKEN, static=False)),
                (64, 64),
                "bf16",
                "bf16",
            ),
            "activation dtype",
        ),
    ],
)
def test_a_config_that_could_be_read_two_ways_is_refused_when_built(
    build: object, field: str
) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        build()  # type: ignore[operator]
    assert info.value.what == field


def test_the_integer_schemes_read_back_as_themselves() -> None:
    for config, scheme in [
        (_int4(64, symmetric=False), kp.Scheme.INT4_WEIGHT_ONLY),
        (
            kp.quant_config("int8_weight_only", weight_shape=(64, 64), group_size=32),
            kp.Scheme.INT8_WEIGHT_ONLY,
        ),
    ]:
        assert scheme_of(config) is scheme


_SCHEMES = st.sampled_from(
    [s for s in kp.Scheme if s.value not in ("int4_weight_only", "int8_weight_only")]
)
_PROFILES = st.sampled_from(["cpu", "t4", "a100", "h100", "mi300x"])


@given(scheme=_SCHEMES, profile=_PROFILES)
def test_integer_weight_only_kernels_never_serve_an_activation_quantized_or_fp8_config(
    scheme: kp.Scheme, profile: str
) -> None:
    config = kp.quant_config(scheme, weight_shape=(4096, 4096))
    for verdict in evaluate(kp.device_profile(profile), config):
        if "int4" in verdict.kernel or "wna16" in verdict.kernel or "int8pack" in verdict.kernel:
            assert not verdict.ok, verdict


@given(
    group=st.sampled_from([32, 64, 128, 256, -1]),
    symmetric=st.booleans(),
    profile=_PROFILES,
    k=st.integers(1, 80).map(lambda blocks: blocks * 32),
)
def test_every_integer_config_gets_a_kernel_that_reads_its_layout(
    group: int, symmetric: bool, profile: str, k: int
) -> None:
    config = kp.quant_config(
        "int4_weight_only", weight_shape=(4096, k), group_size=group, symmetric=symmetric
    )
    decision = kp.choose(kp.device_profile(profile), config)
    assert isinstance(decision, kp.Selected), decision.render()
    spec = kp.default_catalog().kernel(decision.kernel)
    zero_rules = [r for r in spec.rules if isinstance(r, ZeroPoints)]
    assert symmetric or any(Dtype.INT4 in r.dtypes for r in zero_rules)


@given(parts=st.integers(2, 8), groups=st.integers(1, 64), extra=st.integers(1, 127))
def test_whole_groups_per_part_refuses_every_cut_group(parts: int, groups: int, extra: int) -> None:
    k = groups * 128 + extra
    decision = kp.choose(CPU, _int4(128, k=k, k_parts=parts))
    assert isinstance(decision, kp.Rejected)
    assert all(CODE.GROUP_STRADDLE in {r.code for r in v.reasons} for v in decision.trace)
