"""Fuzzing ``kp.quant_config`` with hypothesis, malformed values included.

The values are those of docs/design.md#vocabulary; the errors, those of
docs/design.md#error-format.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Dtype, scheme_of
from tests.support.fuzzing import (
    DTYPE_NAMES,
    HIGH_PRECISION,
    SCHEME_NAMES,
    assert_names,
    fuzz,
    near_miss,
    positive_int,
)

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

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


def _valid_shape(shape: object) -> bool:
    return isinstance(shape, (tuple, list)) and len(shape) == 2 and all(map(positive_int, shape))


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


def test_the_dtype_table_these_fuzzers_judge_by_knows_every_dtype() -> None:
    # A dtype the table lacks would be judged unknown, and its own message a failure.
    assert {dtype.value for dtype in Dtype} <= set(DTYPE_NAMES.values())
