"""Fuzzing ``kp.choose`` with hypothesis: valid arguments get a decision that keeps the
policy, malformed ones and unknown kernel ids are named (docs/design.md#error-format).

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Dtype
from tests.support.fuzzing import (
    HIGH_PRECISION,
    ID_SET,
    IDS,
    PROFILE_NAMES,
    assert_names,
    fuzz,
    near_miss,
)

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

VALID_CONFIG: st.SearchStrategy[kp.QuantConfig] = st.builds(
    lambda name, n, k, out, inp, bias: kp.quant_config(
        name, weight_shape=(n, k), out_dtype=out, input_dtype=inp, bias=bias
    ),
    st.sampled_from(list(kp.Scheme)),
    st.one_of(st.integers(1, 2**20), st.integers(1, 512).map(lambda n: 16 * n)),
    st.one_of(st.integers(1, 2**20), st.integers(1, 512).map(lambda k: 16 * k)),
    st.sampled_from(sorted(HIGH_PRECISION)),
    st.sampled_from(sorted(HIGH_PRECISION)),
    st.booleans(),
)
VALID_POLICY: st.SearchStrategy[kp.Policy] = st.builds(
    kp.Policy,
    st.frozensets(st.sampled_from(IDS), max_size=4),
    st.one_of(st.none(), st.sampled_from(IDS)),
    st.booleans(),
)
CATALOG_ARG: st.SearchStrategy[kp.Catalog | None] = st.sampled_from(
    [None, kp.default_catalog(), kp.Catalog(tuple(reversed(kp.default_catalog().kernels)))]
)


def _check_decision(
    decision: kp.Decision, caps: kp.DeviceCaps, policy: kp.Policy, catalog: kp.Catalog | None
) -> None:
    platform_ids = (catalog or kp.default_catalog()).ids_for(caps.platform)
    kernels = [verdict.kernel for verdict in decision.trace]
    assert kernels[: len(platform_ids)] == list(platform_ids)
    match decision:
        case kp.Selected(kernel=kernel, degraded=degraded):
            (verdict,) = (v for v in decision.trace if v.kernel == kernel)
            assert verdict.reasons == ()
            assert kernel not in policy.disabled
            assert policy.force in (None, kernel)
            assert not (policy.strict and degraded)
        case kp.Rejected():
            assert all(verdict.reasons for verdict in decision.trace)
        case _:
            raise AssertionError(f"not a decision: {decision!r}")


@fuzz(300)
@given(st.sampled_from(PROFILE_NAMES), VALID_CONFIG, VALID_POLICY, CATALOG_ARG)
def test_choose_decides_for_valid_arguments(
    profile: str, config: kp.QuantConfig, policy: kp.Policy, catalog: kp.Catalog | None
) -> None:
    caps = kp.device_profile(profile)
    _check_decision(kp.choose(caps, config, policy, catalog), caps, policy, catalog)


MALFORMED_ARG: st.SearchStrategy[object] = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["h100", "fp8_per_channel", "cpu_dequant_reference", ""]),
    st.integers(),
    st.lists(st.integers(), max_size=3),
    st.sampled_from([kp.device_profile("h100"), kp.Policy(), Dtype.BFLOAT16, 1.5]),
    st.just(kp.quant_config("fp8_per_channel", weight_shape=(16, 16))),
)
POSITIONS = ("caps", "config", "policy", "catalog")


@fuzz(500)
@given(
    st.sampled_from(PROFILE_NAMES),
    VALID_CONFIG,
    VALID_POLICY,
    st.dictionaries(
        st.sampled_from(POSITIONS),
        st.one_of(MALFORMED_ARG, st.none()),
        min_size=1,
        max_size=4,
    ),
)
def test_choose_names_a_malformed_argument(
    profile: str, config: kp.QuantConfig, policy: kp.Policy, bad: dict[str, object]
) -> None:
    args: dict[str, object] = {
        "caps": kp.device_profile(profile),
        "config": config,
        "policy": policy,
        "catalog": None,
    }
    args.update(bad)
    # None is the default policy and catalog, a valid value there.
    wrong = {
        position: value
        for position, value in bad.items()
        if not isinstance(
            value, {"caps": kp.DeviceCaps, "config": kp.QuantConfig}.get(position, ())
        )
        and not (position in ("policy", "catalog") and value is None)
        and not (position == "policy" and isinstance(value, kp.Policy))
    }
    choose: Any = kp.choose
    if not wrong:
        caps = args["caps"]
        assert isinstance(caps, kp.DeviceCaps)
        used = args["policy"] if isinstance(args["policy"], kp.Policy) else kp.Policy()
        _check_decision(choose(**args), caps, used, None)
        return
    with pytest.raises(kp.InvalidValueError) as caught:
        choose(**args)
    assert caught.value.what in wrong
    assert caught.value.value is wrong[caught.value.what]
    assert_names(caught.value, caught.value.what)
    assert_names(caught.value, repr(wrong[caught.value.what]))


UNKNOWN_ID: st.SearchStrategy[tuple[str, bool]] = st.one_of(
    near_miss(IDS).map(lambda text: (text, True)),
    st.text(min_size=1, max_size=20).map(lambda text: (text, False)),
    st.sampled_from(["cuda_rowwise", "CPU_DEQUANT_REFERENCE"]).map(lambda text: (text, True)),
    st.sampled_from(["marlin", "humming", "cutlass"]).map(lambda text: (text, False)),
).filter(lambda item: bool(item[0].strip()) and item[0].strip() not in ID_SET)


@fuzz(500)
@given(
    st.sampled_from(PROFILE_NAMES),
    VALID_CONFIG,
    st.frozensets(st.sampled_from(IDS), max_size=3),
    st.lists(UNKNOWN_ID, min_size=0, max_size=3),
    st.one_of(st.none(), st.sampled_from(IDS), UNKNOWN_ID),
    st.booleans(),
)
def test_choose_names_an_unknown_kernel_id(
    profile: str,
    config: kp.QuantConfig,
    known: frozenset[str],
    unknown: list[tuple[str, bool]],
    force: str | tuple[str, bool] | None,
    strict: bool,
) -> None:
    named = [*unknown, *([force] if isinstance(force, tuple) else [])]
    near: dict[str, bool] = {}
    for text, is_near in named:
        near[text.strip()] = near.get(text.strip(), False) or is_near
    forced = force[0] if isinstance(force, tuple) else force
    policy = kp.Policy(known | {text for text, _ in unknown}, forced, strict)
    caps = kp.device_profile(profile)
    if not near:
        _check_decision(kp.choose(caps, config, policy), caps, policy, None)
        return
    with pytest.raises(kp.UnknownNameError) as caught:
        kp.choose(caps, config, policy)
    error = caught.value
    assert error.kind == "kernel id"
    assert error.value in near
    assert_names(error, repr(error.value))
    assert set(error.candidates) <= ID_SET
    if near[str(error.value)]:
        assert error.candidates
    for candidate in error.candidates:
        assert_names(error, repr(candidate))


@fuzz(200)
@given(
    st.sampled_from(PROFILE_NAMES),
    VALID_CONFIG,
    st.lists(near_miss(IDS), min_size=1, max_size=1),
)
def test_a_one_slip_kernel_id_gets_a_closest_match(
    profile: str, config: kp.QuantConfig, slipped: list[str]
) -> None:
    (text,) = slipped
    if text.strip() in ID_SET:
        return
    with pytest.raises(kp.UnknownNameError) as caught:
        kp.choose(kp.device_profile(profile), config, kp.Policy(force=text))
    assert caught.value.value == text.strip()
    assert caught.value.candidates
    assert set(caught.value.candidates) <= ID_SET
