"""Fuzzing the public API with hypothesis, malformed values included.

The values are those of docs/design.md#vocabulary; the errors, those of
docs/design.md#error-format.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.adapters.cpu import _device as cpu_device
from kernelpick.adapters.cuda import _device as cuda_device
from kernelpick.adapters.rocm import _device as rocm_device
from kernelpick.cli import main
from kernelpick.core import (
    ENV_DISABLED,
    ENV_FORCE,
    ENV_STRICT,
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    CpuArch,
    CudaArch,
    Dtype,
    RocmArch,
    Version,
    scheme_of,
)
from kernelpick.integration import Fp8PtpcLinearMethod, layer_state, weight_loader_of

# Hypothesis fuzzers of every public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "devices"
IDS: tuple[str, ...] = kp.default_catalog().ids
ID_SET = frozenset(IDS)
PROFILE_NAMES: tuple[str, ...] = tuple(kp.device_profiles())
SCHEME_NAMES: tuple[str, ...] = tuple(s.value for s in kp.Scheme)

# The dtypes by torch name, and the short names people type for them
# (docs/design.md#vocabulary).
DTYPE_NAMES: dict[str, str] = {
    **{name: name for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2")},
    **{name: name for name in ("int8", "float8_e8m0fnu")},
    **{name: name for name in ("bfloat16", "float16", "float32")},
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "e4m3fn": "float8_e4m3fn",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2": "float8_e5m2",
    "e8m0": "float8_e8m0fnu",
    "e8m0fnu": "float8_e8m0fnu",
    "i8": "int8",
}
HIGH_PRECISION = frozenset({"bfloat16", "float16", "float32"})


def fuzz(max_examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def assert_names(error: BaseException | str, *candidates: str) -> None:
    """``error``'s message contains at least one of ``candidates`` (renderings of a bad value)."""
    message = str(error)
    wanted = [c for c in candidates if c]
    assert any(c in message for c in wanted), f"{message!r} names none of {wanted!r}"


# -- shared strategies ---------------------------------------------------------------------


@st.composite
def near_miss(draw: st.DrawFn, words: Sequence[str]) -> str:
    """``words`` member with one typing slip: a letter dropped, added, changed or swapped,
    a case change, a dash for an underscore, or padding."""
    word = draw(st.sampled_from(words))
    i = draw(st.integers(0, len(word) - 1))
    letter = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_-é"))
    op = draw(st.sampled_from(["drop", "add", "change", "swap", "upper", "dash", "pad"]))
    if op == "drop":
        return word[:i] + word[i + 1 :]
    if op == "add":
        return word[:i] + letter + word[i:]
    if op == "change":
        return word[:i] + letter + word[i + 1 :]
    if op == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if op == "upper":
        return word.upper()
    if op == "dash":
        return word.replace("_", "-")
    return f"  {word}\t"


# -- 1. kp.quant_config----------------------------------------------------------------------

SCHEME_ARG: st.SearchStrategy[object] = st.one_of(
    st.sampled_from(SCHEME_NAMES),
    st.sampled_from(list(kp.Scheme)),
    near_miss(SCHEME_NAMES),
    st.sampled_from(["FP8_PER_CHANNEL", " fp8_per_tensor\n", "fp8_per_token", "ptpc", "", "fp8"]),
    st.text(max_size=20),
    st.none(),
    st.integers(),
    st.lists(st.sampled_from(SCHEME_NAMES), max_size=2),
)
DIM: st.SearchStrategy[object] = st.one_of(
    st.integers(1, 16384),
    st.integers(1, 2**62),
    st.integers(-(2**62), 0),
    st.sampled_from([2**62, -1, 0, 1]),
    st.booleans(),
    st.floats(),
    st.sampled_from([4.0, 1.0, 4096.0]),
    st.text(max_size=5),
    st.none(),
)
SHAPE: st.SearchStrategy[object] = st.one_of(
    st.tuples(st.integers(1, 2**62), st.integers(1, 2**62)),
    st.tuples(DIM, DIM),
    st.lists(DIM, max_size=4),
    st.lists(DIM, max_size=4).map(tuple),
    st.none(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.sampled_from(["4096,4096", "4096x4096", (4096,), (4096, 4096, 1)]),
    st.text(max_size=8),
    st.dictionaries(st.integers(1, 4), st.integers(1, 4), max_size=2),
)
DTYPE_ARG: st.SearchStrategy[object] = st.one_of(
    st.sampled_from(sorted(DTYPE_NAMES)),
    st.sampled_from(list(Dtype)),
    st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]),
    st.sampled_from([torch.int8, torch.float64, torch.complex64, torch.bool]),
    st.sampled_from(["bf16", "bfloat", "float8_e4m3fn", "int8", "", " BFloat16 ", "torch.half"]),
    st.sampled_from(["float64", "fp8", "bfloat16x", "torch.", "e4m3", "FP32"]),
    near_miss(sorted(DTYPE_NAMES)),
    st.text(max_size=12),
    st.none(),
    st.integers(-2, 2),
)
BIAS_ARG: st.SearchStrategy[object] = st.one_of(
    st.booleans(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, float("nan"), "True", "false", "", None]),
    st.text(max_size=4),
)


def _dtype_name(value: object) -> str | None:
    """The canonical dtype name of ``value``, or None for an unknown one."""
    if isinstance(value, Dtype):
        return value.value
    text = str(value).strip().lower().removeprefix("torch.")
    return DTYPE_NAMES.get(text)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _valid_shape(shape: object) -> bool:
    return isinstance(shape, (tuple, list)) and len(shape) == 2 and all(map(_positive_int, shape))


def _scheme_problems(
    name: object, shape: object, out_dtype: object, input_dtype: object, bias: object
) -> list[str]:
    """Each bad argument, as the renderings any of which its error message must contain."""
    problems: list[list[str]] = []
    if not isinstance(name, kp.Scheme) and str(name).strip().lower() not in SCHEME_NAMES:
        problems.append([repr(name)])
    for dtype in (out_dtype,) if input_dtype is None else (out_dtype, input_dtype):
        found = _dtype_name(dtype)
        if found is None or found not in HIGH_PRECISION:
            problems.append([repr(dtype)] + ([] if found is None else [repr(found)]))
    if not _valid_shape(shape):
        problems.append([repr(shape)])
    if not isinstance(bias, bool):
        problems.append([repr(bias)])
    return [rendering for problem in problems for rendering in problem]


def _check_scheme(
    name: object, shape: object, out_dtype: object, input_dtype: object, bias: object
) -> None:
    problems = _scheme_problems(name, shape, out_dtype, input_dtype, bias)
    call: Any = kp.quant_config  # the point is to pass what the annotations forbid
    if problems:
        with pytest.raises(kp.KernelpickError) as caught:
            call(name, weight_shape=shape, out_dtype=out_dtype, input_dtype=input_dtype, bias=bias)
        assert_names(caught.value, *problems)
        return
    config = call(name, weight_shape=shape, out_dtype=out_dtype, input_dtype=input_dtype, bias=bias)
    assert isinstance(config, kp.QuantConfig)
    assert isinstance(shape, (tuple, list))
    assert config.weight_shape == tuple(shape)
    assert config.bias is bias
    assert scheme_of(config) is kp.Scheme.parse(name)
    assert config.out_dtype.value == _dtype_name(out_dtype)
    assert config.input_dtype.value == _dtype_name(
        out_dtype if input_dtype is None else input_dtype
    )


@fuzz(800)
@given(SCHEME_ARG, SHAPE, DTYPE_ARG, st.one_of(st.none(), DTYPE_ARG), BIAS_ARG)
@example("fp8_per_channel", (2**62, 2**62), "bfloat16", None, False)
@example("fp8_per_channel", (True, 4), "bf16", None, False)
@example("fp8_per_channel", (4096, 4096), "bf16", "float8_e4m3fn", 1)
def test_scheme_returns_the_config_or_names_the_bad_value(
    name: object, shape: object, out_dtype: object, input_dtype: object, bias: object
) -> None:
    kp.clear_cache()
    _check_scheme(name, shape, out_dtype, input_dtype, bias)


def _look_alike_shape(shape: object) -> object:
    """The int tuple equal (``==``) to ``shape``, which a cache keyed on equality conflates."""
    if not isinstance(shape, tuple) or len(shape) != 2:
        return shape
    if not all(isinstance(d, (int, float)) and math.isfinite(d) for d in shape):
        return shape
    ints = tuple(int(d) for d in shape)
    return ints if ints == shape else shape


def _look_alike_bias(bias: object) -> object:
    if isinstance(bias, (int, float)) and not isinstance(bias, bool) and bias in (0, 1):
        return bool(bias)
    return bias


@fuzz(400)
@given(
    st.sampled_from(SCHEME_NAMES),
    st.one_of(st.tuples(DIM, DIM), SHAPE),
    st.sampled_from(["bfloat16", "float16", "float32"]),
    BIAS_ARG,
)
@example("fp8_per_channel", (True, True), "bfloat16", False)
@example("fp8_per_channel", (4096.0, 4096), "bfloat16", False)
@example("fp8_per_channel", (4096, 4096), "bfloat16", 1)
def test_scheme_outcome_does_not_depend_on_the_cache(
    name: str, shape: object, out_dtype: str, bias: object
) -> None:
    """The same call gives the same outcome whether or not an equal-looking valid call came
    first: ``(True, True) == (1, 1)`` and ``1 == True`` must not turn a malformed value into a
    cached valid config."""
    kp.clear_cache()
    with contextlib.suppress(kp.KernelpickError):
        kp.quant_config(
            name,
            weight_shape=_look_alike_shape(shape),  # type: ignore[arg-type]
            out_dtype=out_dtype,
            bias=_look_alike_bias(bias),  # type: ignore[arg-type]
        )
    _check_scheme(name, shape, out_dtype, None, bias)


# -- 2. kp.choose ------------------------------------------------------------------------

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
    assert error.closest is None or error.closest in ID_SET
    if near[str(error.value)]:
        assert error.closest is not None
    if error.closest is not None:
        assert_names(error, repr(error.closest))


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
    assert caught.value.closest in ID_SET


# -- 3. kp.Policy.from_env -------------------------------------------------------------------

ENV_ITEM: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(IDS),
    st.sampled_from(IDS).map(lambda i: f"  {i}\t"),
    near_miss(IDS),
    st.sampled_from(["", " ", ",", " , ", "\t", "\u00a0", "é", "∂", "\u3000cpu_w8a16_reference"]),
    st.text(max_size=12),
)
ENV_LIST: st.SearchStrategy[str] = st.one_of(
    st.lists(ENV_ITEM, max_size=5).map(",".join),
    st.lists(st.sampled_from(IDS), max_size=3).map(lambda ids: " , ".join(ids * 2)),
    st.text(max_size=24),
)
STRICT_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["1", "0", "true", "false", "yes", "no", "TRUE", "No", " yes ", "YeS"]),
    st.sampled_from(["", " ", "2", "y", "n", "on", "off", "t", "01", "true,false", "\uff11"]),
    st.text(max_size=6),
)
ENV: st.SearchStrategy[dict[str, str]] = st.fixed_dictionaries(
    {},
    optional={
        ENV_DISABLED: ENV_LIST,
        ENV_FORCE: st.one_of(ENV_LIST, st.sampled_from(IDS)),
        ENV_STRICT: STRICT_TEXT,
        "KERNELPICK_OTHER": st.text(max_size=5),
    },
)


def _items(text: str) -> frozenset[str]:
    return frozenset(item.strip() for item in text.split(",") if item.strip())


def _expected_policy(env: Mapping[str, str]) -> tuple[kp.Policy | None, list[str]]:
    """The policy the variables table of docs/design.md#selection-rules gives for ``env``,
    or the renderings of its bad values."""
    disabled = _items(env.get(ENV_DISABLED, ""))
    forced = _items(env.get(ENV_FORCE, ""))
    problems = [repr(env[ENV_FORCE])] if len(forced) > 1 else []
    strict_text = env.get(ENV_STRICT, "").strip().lower()
    if strict_text not in {"", "1", "0", "true", "false", "yes", "no"}:
        problems.append(repr(env[ENV_STRICT]))
    problems += [repr(item) for item in sorted((disabled | forced) - ID_SET)]
    if problems:
        return None, problems
    force = next(iter(forced)) if forced else None
    return kp.Policy(disabled, force, strict_text in {"1", "true", "yes"}), []


@fuzz(800)
@given(ENV)
@example({ENV_DISABLED: " cpu_w8a16_reference,, cpu_w8a16_reference ,", ENV_STRICT: "YES"})
@example({ENV_FORCE: "cpu_dequant_reference,cpu_dequant_reference"})
@example({ENV_FORCE: "cpu_dequant_reference,cpu_w8a16_reference"})
@example({ENV_STRICT: "maybe"})
def test_policy_from_env_reads_the_three_variables_or_names_the_bad_value(
    env: dict[str, str],
) -> None:
    expected, problems = _expected_policy(env)
    if expected is None:
        with pytest.raises(kp.KernelpickError) as caught:
            kp.Policy.from_env(env)
        assert_names(caught.value, *problems)
        return
    policy = kp.Policy.from_env(env)
    assert (policy.disabled, policy.force, policy.strict) == (
        expected.disabled,
        expected.force,
        expected.strict,
    )


# -- 4. arch and version parsers ----------------------------------------------------------------

ODD_TEXT: st.SearchStrategy[object] = st.sampled_from(
    [
        "gfx",
        "gfx94",
        "gfx942",
        "GFX90A",
        "gfx1201",
        "gfx12011",
        "gfx9g2",
        "gfx942:sramecc+:xnack-",
        ":gfx942",
        "sm_90a",
        "sm_",
        "sm_9",
        "sm_89",
        "sm_120f",
        "sm_1200",
        "compute_75",
        "SM_90A",
        "8.9",
        "8.10",
        "0.5",
        "100.0",
        "12.8",
        "2.13.0+cpu",
        "7.0.51831-abc",
        "2.x",
        "12.8garbage",
        "v2.8",
        "2.8.0a0",
        "2.9.0.dev20250101",
        "1..2",
        ".5",
        "-1.0",
        "",
        " ",
        "\n8.9\n",
        "٣.٤",
        "\uff11\uff12.\uff18",
        "9" * 5000,
        "1." + "9" * 5000,
    ]
)
ARCH_INPUT: st.SearchStrategy[object] = st.one_of(
    ODD_TEXT,
    st.text(max_size=20),
    st.text(alphabet="0123456789.+-_abcdefgmsx:vr ", max_size=14),
    st.builds(
        lambda prefix, digits, suffix: f"{prefix}{digits}{suffix}",
        st.sampled_from(["sm_", "compute_", "gfx", "GFX", "", "v"]),
        st.text(alphabet="0123456789abcdef", min_size=0, max_size=5),
        st.sampled_from(["", "a", "f", ":sramecc+:xnack-", "+cpu", ".0", "x"]),
    ),
    st.none(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.lists(st.sampled_from(["8.9", "gfx942"]), max_size=2),
)

# ASCII digits only: kernelpick refuses "٣.٤" though \d and int() would take it.
_CUDA_TEXT = re.compile(r"^(?:([0-9]{1,2})\.([0-9])|(?:sm_|compute_)([0-9]{1,2})([0-9])[af]?)$")
_GFX_TEXT = re.compile(r"^gfx[0-9]{1,2}[0-9a-f]{2}$")
_PLAIN_VERSION = re.compile(
    r"^\s*v?([0-9]{1,9})(?:\.([0-9]{1,9}))?(?:\.([0-9]{1,9}))?(?:\+[a-z0-9.]+)?\s*$"
)
# Version.parse's docstring: these are not versions.
NOT_VERSIONS = frozenset({"", " ", "2.x", "12.x", "x.y", "12.8garbage", "1..2", ".5", "-1.0"})


def _rejects(parse: Callable[[object], object], value: object, *names: str) -> None:
    with pytest.raises(kp.InvalidValueError) as caught:
        parse(value)
    assert_names(caught.value, repr(value), *names)


@fuzz(800)
@given(ARCH_INPUT)
def test_cuda_arch_parse_gives_the_arch_or_names_the_input(value: object) -> None:
    text = value.strip().lower() if isinstance(value, str) else None
    match = _CUDA_TEXT.match(text) if text is not None else None
    if match is None:
        _rejects(CudaArch.parse, value)
        return
    digits = [group for group in match.groups() if group is not None]
    major, minor = int(digits[0]), int(digits[1])
    if not 1 <= major <= 99:
        _rejects(CudaArch.parse, value)
        return
    assert CudaArch.parse(value) == CudaArch(major, minor)
    assert CudaArch.parse(str(CudaArch(major, minor))) == CudaArch(major, minor)


@fuzz(800)
@given(ARCH_INPUT)
def test_rocm_arch_parse_gives_the_arch_or_names_the_input(value: object) -> None:
    name = value.split(":", 1)[0].strip().lower() if isinstance(value, str) else None
    if name is None or not _GFX_TEXT.match(name):
        _rejects(RocmArch.parse, value)
        return
    arch = RocmArch.parse(value)
    assert arch == RocmArch(name)
    expected_fp8 = "float8_e4m3fnuz" if name in {"gfx940", "gfx941", "gfx942"} else "float8_e4m3fn"
    assert arch.native_fp8.value == expected_fp8


@fuzz(800)
@given(ARCH_INPUT)
@example("9" * 5000)
@example("2." + "9" * 5000)
def test_version_parse_gives_the_version_or_names_the_input(value: object) -> None:
    if not isinstance(value, str) or not re.match(r"^\s*v?[0-9]", value) or value in NOT_VERSIONS:
        _rejects(Version.parse, value, repr(value)[:40])
        return
    plain = _PLAIN_VERSION.match(value.lower())
    if plain is None:
        # Not a plain version: either reading is allowed, but a refusal names the input.
        try:
            Version.parse(value)
        except kp.InvalidValueError as error:
            refused: kp.InvalidValueError | None = error
        else:
            refused = None
        if refused is not None:
            assert_names(refused, repr(value), repr(value)[:40])
            return
    version = Version.parse(value)
    assert isinstance(version, Version)
    leading = re.match(r"^\s*v?([0-9]+)", value)
    assert leading is not None
    assert version.major == int(leading.group(1))
    if plain is not None:
        parts = [int(part) for part in plain.groups() if part is not None]
        assert version == Version(*parts)
    assert Version.parse(str(version)) == version


# -- 5. translate(props) -------------------------------------------------------------------------

FIXTURE_PROPS: dict[str, dict[str, object]] = {
    path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))
}
TRANSLATE: dict[str, Callable[[Mapping[str, object]], kp.DeviceCaps]] = {
    "cpu": cpu_device.translate,
    "cuda": cuda_device.translate,
    "rocm": rocm_device.translate,
}
READ_KEYS = {
    "cpu": (
        "machine",
        "name",
        "isa",
        "torch_version",
        "scaled_mm",
        "scaled_mm_rowwise",
        "cpp_toolchain",
    ),
    "cuda": ("name", "major", "minor", "torch_version", "cuda_version", "libraries"),
    "rocm": ("name", "gcnArchName", "torch_version", "hip_version"),
}
_DROP = object()

MUTATED_VALUE: st.SearchStrategy[object] = st.one_of(
    st.just(_DROP),
    st.none(),
    st.booleans(),
    st.integers(-(2**64), -1),
    st.integers(0, 200),
    st.sampled_from([2**62, 2**64, 10**30]),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["", " ", "12.x", "x.y", "12.8garbage", "2.13.0+cpu", "12.8", "7.0.51831"]),
    st.sampled_from(["gfx", "gfx94", "gfx942", "gfx90a:xnack+", "sm_90", "GFX950:sramecc+"]),
    st.sampled_from(["x86_64", "aarch64"]),
    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.none()), max_size=3),
    st.lists(st.sampled_from(["cupy", " AVX2 ", "fma", ""]), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _version_ok(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        Version.parse(value)
    except kp.InvalidValueError:
        return False
    return True


def _bad_props(platform: str, props: Mapping[str, object]) -> list[tuple[str, object]]:
    """The (key, value) pairs of ``props`` that translate must refuse: a missing key or a
    value of the wrong type (docs/design.md#error-format)."""

    def get(key: str) -> object:
        return props.get(key)

    def text(key: str) -> bool:
        return isinstance(get(key), str) and bool(str(get(key)).strip())

    def count(key: str) -> bool:
        value = get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def names(key: str) -> bool:
        value = get(key)
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    checks: dict[str, bool] = {
        "name": text("name"),
        "torch_version": _version_ok(get("torch_version")),
    }
    if platform == "cpu":
        checks |= {
            "machine": text("machine"),
            "isa": names("isa"),
            "scaled_mm": isinstance(get("scaled_mm"), bool),
            "scaled_mm_rowwise": isinstance(get("scaled_mm_rowwise"), bool),
            "cpp_toolchain": isinstance(get("cpp_toolchain"), bool),
        }
    elif platform == "cuda":
        major, minor = get("major"), get("minor")
        checks |= {
            "major": count("major") and isinstance(major, int) and 1 <= major <= 99,
            "minor": count("minor") and isinstance(minor, int) and minor <= 9,
            "cuda_version": _version_ok(get("cuda_version")),
            "libraries": names("libraries"),
        }
    else:
        gcn = get("gcnArchName")
        arch = gcn.split(":", 1)[0].strip().lower() if isinstance(gcn, str) else ""
        checks |= {
            "gcnArchName": bool(_GFX_TEXT.match(arch)),
            "hip_version": _version_ok(get("hip_version")),
        }
    return [(key, get(key)) for key, ok in checks.items() if not ok]


def _expected_caps(platform: str, props: Mapping[str, object]) -> kp.DeviceCaps:
    def get(key: str) -> Any:
        return props[key]

    if platform == "cpu":
        features = [
            feature
            for feature, key in (
                (FEATURE_SCALED_MM, "scaled_mm"),
                (FEATURE_SCALED_MM_ROWWISE, "scaled_mm_rowwise"),
                (FEATURE_CPP_TOOLCHAIN, "cpp_toolchain"),
            )
            if get(key)
        ]
        return kp.DeviceCaps(
            arch=CpuArch(get("machine"), frozenset(f.strip().lower() for f in get("isa"))),
            name=get("name"),
            torch_version=Version.parse(get("torch_version")),
            features=frozenset(features),
        )
    if platform == "cuda":
        return kp.DeviceCaps(
            arch=CudaArch(get("major"), get("minor")),
            name=get("name"),
            torch_version=Version.parse(get("torch_version")),
            toolkit_version=Version.parse(get("cuda_version")),
            libraries=frozenset(s.strip() for s in get("libraries")),
        )
    return kp.DeviceCaps(
        arch=RocmArch(get("gcnArchName").split(":", 1)[0].strip().lower()),
        name=get("name"),
        torch_version=Version.parse(get("torch_version")),
        toolkit_version=Version.parse(get("hip_version")),
    )


@st.composite
def mutated_props(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    fixture = draw(st.sampled_from(sorted(FIXTURE_PROPS)))
    props = dict(FIXTURE_PROPS[fixture])
    platform = str(props["platform"])
    keys = st.one_of(
        st.sampled_from(READ_KEYS[platform]),
        st.sampled_from(sorted(props)),
        st.text(max_size=6),
    )
    for key, value in draw(st.lists(st.tuples(keys, MUTATED_VALUE), max_size=3)):
        if value is _DROP:
            props.pop(key, None)
        else:
            props[key] = value
    return platform, props


@fuzz(1000)
@given(mutated_props())
def test_translate_gives_caps_or_names_the_bad_property(
    case: tuple[str, dict[str, object]],
) -> None:
    platform, props = case
    translate = TRANSLATE[platform]
    bad = _bad_props(platform, props)
    if not bad:
        caps = translate(props)
        assert caps == _expected_caps(platform, props)
        assert str(caps.platform) == platform
        return
    with pytest.raises(kp.InvalidValueError) as caught:
        translate(props)
    renderings = [f"'{key}'" for key, _ in bad]
    renderings += [repr(value) for _, value in bad]
    # major and minor reach the arch parser as text: "100.0" names a major of 100.
    renderings += [str(value) for key, value in bad if key in ("major", "minor")]
    assert_names(caught.value, *renderings)


@fuzz(50)
@given(
    st.sampled_from(sorted(TRANSLATE)),
    st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=8),
        st.binary(max_size=4),
        st.lists(st.sampled_from(READ_KEYS["cuda"]), max_size=3),
        st.tuples(st.just("name"), st.just("x")),
    ),
)
def test_translate_names_properties_that_are_not_a_mapping(platform: str, props: object) -> None:
    translate: Any = TRANSLATE[platform]
    with pytest.raises(kp.KernelpickError) as caught:
        translate(props)
    assert_names(caught.value, repr(props))


# -- 6. the command line -----------------------------------------------------------------------

SHAPE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["4096,4096", "16x32", " 64 , 128 ", "4096x", "-1,5", "1e3,4", "0,16"]),
    st.sampled_from(["4096", "1,2,3", "x", ",", "", "4096X4096", "16,,16", "0x10,16", "+5,5"]),
    st.builds(
        lambda n, sep, k: f"{n}{sep}{k}",
        st.integers(-5, 5000),
        st.sampled_from([",", "x", " , ", ";", "*"]),
        st.integers(-5, 5000),
    ),
    st.text(alphabet="0123456789,x -.e", max_size=10),
)
DISABLE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.lists(st.one_of(st.sampled_from(IDS), near_miss(IDS), st.just("")), max_size=4).map(
        ",".join
    ),
    st.text(max_size=10),
)
DEVICE_TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(PROFILE_NAMES),
    st.sampled_from(["auto", "AUTO", " h100 ", "H100", "cuda", "cpu:0", ""]),
    near_miss(PROFILE_NAMES),
    st.text(max_size=8),
)
OPTION_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--device": DEVICE_TEXT,
    "--scheme": st.one_of(st.sampled_from(SCHEME_NAMES), near_miss(SCHEME_NAMES), st.text()),
    "--shape": SHAPE_TEXT,
    "--out-dtype": st.one_of(st.sampled_from(sorted(DTYPE_NAMES)), st.text(max_size=8)),
    "--disable": DISABLE_TEXT,
    "--force": st.one_of(st.sampled_from(IDS), near_miss(IDS), st.just(""), st.text(max_size=8)),
    "--format": st.sampled_from(["text", "markdown", "json", "csv", ""]),
}
FLAGS = ("--bias", "--strict", "--json", "--bogus", "-x", "--", "--dev", "--s")


def _not_help(token: str) -> bool:
    # Help is its own test: argparse accepts any prefix of --help, and -h with others.
    return not (token.startswith("-h") or (token.startswith("--h") and "--help".startswith(token)))


@st.composite
def argv_lists(draw: st.DrawFn) -> list[str]:
    argv: list[str] = []
    command = draw(st.sampled_from(["explain", "explain", "matrix", "devices", "kernels", "", "x"]))
    if command:
        argv.append(command)
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["option", "option", "flag", "random"]))
        if kind == "option":
            option = draw(st.sampled_from(sorted(OPTION_VALUES)))
            argv.append(option)
            if draw(st.integers(0, 9)):
                argv.append(draw(OPTION_VALUES[option]))
        elif kind == "flag":
            argv.append(draw(st.sampled_from(FLAGS)))
        else:
            argv.append(draw(st.text(max_size=10)))
    return [token for token in argv if token != "bench" and _not_help(token)]


CLI_ENV: st.SearchStrategy[dict[str, str]] = st.one_of(st.just({}), ENV)


def _run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, env=env, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _check_status(status: int, out: str, err: str) -> None:
    assert status in (0, 1, 2)
    if status == 1:
        assert err.startswith("kernelpick: error: "), err
    else:
        assert err == ""
        assert out


@fuzz(600)
@given(argv_lists(), CLI_ENV)
@example(["explain", "--device", "auto", "--shape", "16,32"], {})
@example(["explain", "--shape", "4096x"], {})
@example(["explain", "--shape", "-1,5"], {})
@example(["explain", "--shape", "1e3,4"], {})
@example(["explain", "--disable", "cpu_w8a16_reference,,junk"], {})
def test_cli_exits_0_1_or_2_and_never_raises(argv: list[str], env: dict[str, str]) -> None:
    _check_status(*_run_cli(argv, env))


@fuzz(400)
@given(
    st.one_of(
        SHAPE_TEXT,
        st.text(max_size=12),
        st.builds(
            lambda n, k: f"{n},{k}",
            st.text(alphabet="0123456789²³¹٣٤\uff11", min_size=1, max_size=4),
            st.text(alphabet="0123456789²³¹٣٤\uff11", min_size=1, max_size=4),
        ),
    ).filter(lambda text: not text.startswith("-"))
)
@example("²,4")
@example("4,³")
@example("9" * 5000 + ",4")
def test_cli_shape_is_read_or_named(text: str) -> None:
    status, out, err = _run_cli(["explain", "--device", "h100", "--shape", text], {})
    _check_status(status, out, err)
    if status == 1:
        assert_names(err, repr(text)[:60])


@pytest.mark.parametrize("argv", [["--help"], ["explain", "-h"], ["kernels", "--he"]])
def test_cli_help_returns_a_status_and_writes_to_out(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, env={}, out=out, err=err)
    assert status == 0
    assert "usage: kernelpick" in out.getvalue()


# -- 7. weight loaders -------------------------------------------------------------------------

LOAD_KINDS = (
    "float32",
    "bfloat16",
    "float16",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "noncontiguous",
    "strided",
    "expanded",
    "requires_grad",
    "extra_row",
    "extra_col",
    "transposed",
    "flat",
    "scalar",
    "batched",
    "int64",
    "int8",
    "bool",
    "complex64",
    "meta",
    "list",
)
CONTENTS = ("finite", "finite", "zeros", "nan", "inf", "-inf", "huge")
SHARD_ID: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(-3, 6),
    st.booleans(),
    st.sampled_from(["0", "", 0.0, 1.5, 2**64, -(2**64)]),
    st.sampled_from(["q", "k", "v", "o", "Q"]),  # vLLM's QKV names: valid for 3 shards
)
LOAD: st.SearchStrategy[tuple[str, object, str, int]] = st.tuples(
    st.sampled_from(LOAD_KINDS), SHARD_ID, st.sampled_from(CONTENTS), st.integers(0, 2**16)
)


def _values(rows: int, cols: int, content: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 4
    if content == "zeros":
        values.zero_()
    elif content in ("nan", "inf", "-inf"):
        row = seed % rows
        values[row, (seed // rows) % cols] = float(content)
    elif content == "huge":
        values *= 1e300
    return values


def _loaded(kind: str, rows: int, cols: int, content: str, seed: int) -> object:
    """The tensor (or not-a-tensor) a checkpoint hands to the loader, built for shard rows."""
    values = _values(rows, cols, content, seed)
    if kind in ("float32", "bfloat16", "float16", "float64", "float8_e4m3fn", "float8_e5m2"):
        return values.to(getattr(torch, kind))
    if kind == "noncontiguous":
        return values.float().t().contiguous().t()
    if kind == "strided":
        wide = torch.zeros(rows, 2 * cols)
        wide[:, ::2] = values.float()
        return wide[:, ::2]
    if kind == "expanded":
        return values[:1].float().expand(rows, cols)
    if kind == "requires_grad":
        return values.float().requires_grad_()
    if kind == "extra_row":
        return _values(rows + 1, cols, content, seed).float()
    if kind == "extra_col":
        return _values(rows, cols + 1, content, seed).float()
    if kind == "transposed":
        return values.float().t()
    if kind == "flat":
        return values.float().flatten()
    if kind == "scalar":
        return values.float()[0, 0]
    if kind == "batched":
        return values.float().unsqueeze(0)
    if kind in ("int64", "int8"):
        finite = torch.nan_to_num(values, nan=0.0, posinf=100.0, neginf=-100.0)
        return finite.clamp(-100, 100).to(getattr(torch, kind))
    if kind == "bool":
        return values > 0
    if kind == "complex64":
        return values.to(torch.complex64)
    if kind == "meta":
        return torch.empty(rows, cols, device="meta")
    return values.tolist()


def _load_problems(
    shard_id: object, tensor: object, sizes: Sequence[int], width: int
) -> tuple[list[str], int, int]:
    """Renderings of the bad values of one load (empty when it must load), and the rows."""
    if len(sizes) == 3 and shard_id in ("q", "k", "v"):
        shard_id = "qkv".index(str(shard_id))
    if shard_id is None:
        start, rows = 0, sum(sizes)
    elif (
        isinstance(shard_id, int) and not isinstance(shard_id, bool) and 0 <= shard_id < len(sizes)
    ):
        start, rows = sum(sizes[:shard_id]), sizes[shard_id]
    else:
        return [f"shard_id {shard_id!r}"], 0, 0
    if not isinstance(tensor, torch.Tensor):
        return [type(tensor).__name__], start, rows
    problems: list[str] = []
    if not tensor.is_floating_point() or tensor.dtype.itemsize == 1:  # FP8 is pre-quantized
        problems.append(str(tensor.dtype).removeprefix("torch."))
    if tuple(tensor.shape) != (rows, width):
        problems.append(str(list(tensor.shape)))
    if tensor.device.type == "meta":
        problems.append("meta")
    return problems, start, rows


@fuzz(400)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.integers(1, 8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    st.sampled_from(["", "model.layers.0.self_attn.qkv_proj", "mlp.gate_up", "ümlaut.x", " "]),
    st.lists(LOAD, max_size=5),
    st.sampled_from(["none", "whole", "shards"]),
    st.sampled_from(["finite", "finite", "nan", "inf", "huge"]),
)
@example([3, 2], 8, torch.bfloat16, "q", [("meta", 0, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("int64", 0, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("complex64", None, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("noncontiguous", 1, "finite", 3)], "whole", "finite")
@example([3, 2], 8, torch.float16, "q", [], "whole", "huge")
@example([3, 2], 8, torch.float32, "q.proj", [], "shards", "nan")
def test_weight_loader_loads_or_names_the_bad_value(
    sizes: list[int],
    width: int,
    params_dtype: torch.dtype,
    prefix: str,
    loads: list[tuple[str, object, str, int]],
    finish: str,
    finish_content: str,
) -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("cpu"), policy=kp.Policy())
    layer = torch.nn.Module()
    n = sum(sizes)
    method.create_weights(layer, width, sizes, width, n, params_dtype, prefix=prefix)
    param = layer.get_parameter("weight")
    assert tuple(param.shape) == (n, width)
    assert param.dtype == params_dtype
    load = weight_loader_of(param)
    state = layer_state(layer)

    if finish == "whole":
        loads = [*loads, ("float32", None, finish_content, 1)]
    elif finish == "shards":
        loads = [*loads, *[("float32", i, finish_content, 7 + i) for i in range(len(sizes))]]

    for kind, shard_id, content, seed in loads:
        index = (
            "qkv".index(shard_id) if len(sizes) == 3 and shard_id in ("q", "k", "v") else shard_id
        )
        rows_for = sizes[index] if isinstance(index, int) and 0 <= index < len(sizes) else n
        tensor = _loaded(kind, rows_for, width, content, seed)
        problems, start, rows = _load_problems(shard_id, tensor, sizes, width)
        before, loaded_before = param.detach().clone(), set(state.loaded.get("weight", set()))
        if problems:
            with pytest.raises(kp.KernelpickError) as caught:
                load(param, tensor, shard_id)  # type: ignore[arg-type]
            assert_names(caught.value, *problems)
            # A refused load changes nothing.
            assert torch.equal(param.detach().view(torch.uint8), before.view(torch.uint8))
            assert state.loaded.get("weight", set()) == loaded_before
            continue
        assert isinstance(tensor, torch.Tensor)
        load(param, tensor, shard_id)  # type: ignore[arg-type]
        torch.testing.assert_close(
            param.detach()[start : start + rows],
            tensor.to(params_dtype),
            rtol=0,
            atol=0,
            equal_nan=True,
        )

    loaded = state.loaded.get("weight", set())
    every_row = -1 in loaded or loaded >= set(range(len(sizes)))
    if not every_row:
        with pytest.raises(kp.KernelpickError) as missing:
            method.process_weights_after_loading(layer)
        assert_names(missing.value, prefix or "layer")
        return
    finite = bool(torch.isfinite(param.detach()).all())
    if not finite:
        with pytest.raises(kp.KernelpickError) as not_finite:
            method.process_weights_after_loading(layer)
        assert_names(not_finite.value, f"{prefix or 'layer'}.weight")
        return
    method.process_weights_after_loading(layer)
    assert layer.get_parameter("weight").dtype == torch.float8_e4m3fn
    x = torch.ones(2, width, dtype=params_dtype)
    y = method.apply(layer, x)
    assert tuple(y.shape) == (2, n)
    assert bool(torch.isfinite(y).all())


@fuzz(300)
@given(
    st.one_of(st.integers(-2, 8), st.sampled_from([True, 4.0, "8", None, -(2**64)])),
    st.one_of(
        st.lists(st.integers(-1, 4), max_size=3),
        st.lists(st.sampled_from([True, 2.0, "3", None, 0]), min_size=1, max_size=2),
        st.sampled_from([(), 4, "4", None, (2, 2), {1: 2}]),
    ),
    st.sampled_from(
        [
            torch.float32,
            torch.bfloat16,
            torch.float16,
            torch.float64,
            torch.int8,
            torch.float8_e4m3fn,
        ]
    ),
)
def test_create_weights_allocates_or_names_the_bad_value(
    width: object, sizes: object, params_dtype: torch.dtype
) -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("cpu"), policy=kp.Policy())
    layer = torch.nn.Module()
    problems: list[str] = []
    sizes_ok = (
        isinstance(sizes, (list, tuple)) and len(sizes) > 0 and all(map(_positive_int, sizes))
    )
    if not sizes_ok:
        problems.append(repr(sizes))
    elif not _positive_int(width):
        problems.append(repr(width))
    name = str(params_dtype).removeprefix("torch.")
    if params_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        problems.append(name)
    create: Any = method.create_weights
    if problems:
        with pytest.raises(kp.KernelpickError) as caught:
            create(layer, width, sizes, width, 0, params_dtype, prefix="p")
        assert_names(caught.value, *problems)
        assert "weight" not in dict(layer.named_parameters())
        return
    assert isinstance(sizes, (list, tuple))
    create(layer, width, sizes, width, 0, params_dtype, prefix="p")
    assert tuple(layer.get_parameter("weight").shape) == (sum(sizes), width)


def test_the_dtype_table_these_fuzzers_judge_by_knows_every_dtype() -> None:
    # A dtype the table lacks would be judged unknown, and its own message a failure.
    assert {dtype.value for dtype in Dtype} <= set(DTYPE_NAMES.values())
