"""Fuzzing the arch and version parsers (``CudaArch.parse``, ``RocmArch.parse``,
``Version.parse``) with hypothesis: the value, or an error naming the input.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import CudaArch, RocmArch, Version
from tests.support.fuzzing import GFX_TEXT, assert_names, fuzz

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

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
    if name is None or not GFX_TEXT.match(name):
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
