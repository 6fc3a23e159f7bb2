"""Example tables for building and validating the dtype, version and arch values (the vocabulary
and error format of docs/design.md#vocabulary and docs/design.md#error-format)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import CudaArch, Dtype, RocmArch, Version
from tests.support.values import DTYPE_NAMES, TorchLike

# --- Dtype -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # canonical names
        ("float8_e4m3fn", Dtype.FLOAT8_E4M3FN),
        ("float8_e4m3fnuz", Dtype.FLOAT8_E4M3FNUZ),
        ("float8_e5m2", Dtype.FLOAT8_E5M2),
        ("bfloat16", Dtype.BFLOAT16),
        ("float16", Dtype.FLOAT16),
        ("float32", Dtype.FLOAT32),
        # aliases
        ("bf16", Dtype.BFLOAT16),
        ("fp16", Dtype.FLOAT16),
        ("half", Dtype.FLOAT16),
        ("fp32", Dtype.FLOAT32),
        ("float", Dtype.FLOAT32),
        ("e4m3fn", Dtype.FLOAT8_E4M3FN),
        ("e4m3fnuz", Dtype.FLOAT8_E4M3FNUZ),
        ("e5m2", Dtype.FLOAT8_E5M2),
        # case and spaces
        ("BF16", Dtype.BFLOAT16),
        ("  Float32 ", Dtype.FLOAT32),
        # torch-style names, as text and as objects whose str is torch.<name>
        ("torch.bfloat16", Dtype.BFLOAT16),
        (TorchLike("torch.bfloat16"), Dtype.BFLOAT16),
        (TorchLike("torch.float16"), Dtype.FLOAT16),
        (TorchLike("torch.float8_e4m3fnuz"), Dtype.FLOAT8_E4M3FNUZ),
        # members
        *((d, d) for d in Dtype),
    ],
)
def test_dtype_parse_accepts(value: object, expected: Dtype) -> None:
    assert Dtype.parse(value) is expected


@pytest.mark.parametrize(
    ("value", "closest"),
    [
        ("bfloat61", "bfloat16"),
        ("float61", "float16"),
        ("intt4", "int4"),
        ("xyz", None),
        ("", None),
        (None, None),
        (TorchLike("torch.int32"), None),
    ],
)
def test_dtype_parse_rejects_unknown(value: object, closest: str | None) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        Dtype.parse(value)
    err = info.value
    assert isinstance(err, kp.KernelpickError)
    assert isinstance(err, ValueError)
    assert err.value is value
    assert err.closest == closest
    message = str(err)
    assert repr(value) in message
    for name in DTYPE_NAMES:
        assert name in message
    if closest is not None:
        assert repr(closest) in message


# --- Version -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "shown"),
    [
        ("2.13.0+cpu", Version(2, 13, 0), "2.13"),
        ("12.8", Version(12, 8), "12.8"),
        ("7.0.51831-abc", Version(7, 0, 51831), "7.0.51831"),
        ("2.8", Version(2, 8, 0), "2.8"),
        ("13", Version(13), "13.0"),
        ("v6.4.1", Version(6, 4, 1), "6.4.1"),
        (" 2.7.1 ", Version(2, 7, 1), "2.7.1"),
    ],
)
def test_version_parse(text: str, expected: Version, shown: str) -> None:
    version = Version.parse(text)
    assert version == expected
    assert str(version) == shown
    assert Version.parse(version) is version


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("2.8", "2.13.0+cpu"),  # numeric, not lexicographic
        ("2.13.0", "2.13.1"),
        ("12.8", "13.0"),
        ("9.9.9", "10"),
        ("7.0", "7.0.51831-abc"),
        ("6.4", "7.0"),
    ],
)
def test_version_order(lower: str, higher: str) -> None:
    a, b = Version.parse(lower), Version.parse(higher)
    assert a < b
    assert b > a
    assert a <= b
    assert not b <= a
    assert a != b


def test_version_equal_ignores_local_suffix() -> None:
    assert Version.parse("2.13.0+cpu") == Version.parse("2.13.0+cu128")
    assert Version.parse("2.13") == Version.parse("2.13.0")
    assert Version.parse("2.13") >= Version.parse("2.13.0+cpu")


@pytest.mark.parametrize("value", ["", "abc", "v", ".1", "+cpu", None, 12.8, 13, ("12", "8")])
def test_version_parse_rejects_malformed(value: object) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        Version.parse(value)
    assert info.value.value == value
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Version(-1),
        lambda: Version(1, -2),
        lambda: Version(True),
        lambda: Version(1, 2, 3.0),  # type: ignore[arg-type]
    ],
)
def test_version_fields_validated(make: Callable[[], object]) -> None:
    with pytest.raises(kp.InvalidValueError):
        make()


# --- CudaArch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "major", "minor"),
    [
        ("8.9", 8, 9),
        ("7.5", 7, 5),
        ("10.0", 10, 0),
        ("12.0", 12, 0),
        ("sm_89", 8, 9),
        ("sm_80", 8, 0),
        ("sm_90a", 9, 0),
        ("sm_100a", 10, 0),
        ("sm_120f", 12, 0),
        ("compute_90", 9, 0),
        ("SM_90A", 9, 0),
        (" 8.6 ", 8, 6),
    ],
)
def test_cuda_arch_parse(text: str, major: int, minor: int) -> None:
    arch = CudaArch.parse(text)
    assert arch == CudaArch(major, minor)
    assert str(arch) == f"{major}.{minor}"
    assert CudaArch.parse(arch) is arch


@pytest.mark.parametrize(
    "value", ["", "sm_", "8", "gfx942", "sm_8", "8.10", "sm_90b", "8.9.0", None, 8.9, 89]
)
def test_cuda_arch_parse_rejects(value: object) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        CudaArch.parse(value)
    assert info.value.value == value
    assert repr(value) in str(info.value)


def test_cuda_arch_order() -> None:
    assert CudaArch(8, 0) < CudaArch(8, 9) < CudaArch(9, 0) < CudaArch(10, 0)
    assert CudaArch(12, 0) > CudaArch(10, 0)
    assert sorted([CudaArch(9, 0), CudaArch(7, 5), CudaArch(8, 9)]) == [
        CudaArch(7, 5),
        CudaArch(8, 9),
        CudaArch(9, 0),
    ]


def test_a_version_and_an_arch_are_not_ordered_against_each_other() -> None:
    arch: Any = CudaArch(9, 0)
    with pytest.raises(TypeError):
        _ = Version(9, 0) < arch
    with pytest.raises(TypeError):
        _ = arch >= Version(9, 0)


@pytest.mark.parametrize(("major", "minor"), [(0, 0), (100, 0), (8, 10), (8, -1), (True, 0)])
def test_cuda_arch_fields_validated(major: int, minor: int) -> None:
    with pytest.raises(kp.InvalidValueError):
        CudaArch(major, minor)


# --- RocmArch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("gfx942", "gfx942"),
        ("gfx942:sramecc+:xnack-", "gfx942"),
        ("gfx90a", "gfx90a"),
        ("gfx90a:sramecc+:xnack-", "gfx90a"),
        ("gfx1201", "gfx1201"),
        ("gfx1100", "gfx1100"),
        ("GFX950", "gfx950"),
        (" gfx940 ", "gfx940"),
    ],
)
def test_rocm_arch_parse(text: str, name: str) -> None:
    arch = RocmArch.parse(text)
    assert arch == RocmArch(name)
    assert arch.name == name
    assert str(arch) == name
    assert RocmArch.parse(arch) is arch


@pytest.mark.parametrize(
    "value", ["gfx", "gfx94", "", "sm_90a", "gfx94z2", "942", ":gfx942", None, 942]
)
def test_rocm_arch_parse_rejects(value: object) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        RocmArch.parse(value)
    assert info.value.value == value


@pytest.mark.parametrize(
    ("name", "fp8"),
    [
        ("gfx940", Dtype.FLOAT8_E4M3FNUZ),
        ("gfx941", Dtype.FLOAT8_E4M3FNUZ),
        ("gfx942", Dtype.FLOAT8_E4M3FNUZ),
        ("gfx90a", Dtype.FLOAT8_E4M3FN),
        ("gfx908", Dtype.FLOAT8_E4M3FN),
        ("gfx950", Dtype.FLOAT8_E4M3FN),
        ("gfx1100", Dtype.FLOAT8_E4M3FN),
        ("gfx1200", Dtype.FLOAT8_E4M3FN),
        ("gfx1201", Dtype.FLOAT8_E4M3FN),
    ],
)
def test_rocm_arch_native_fp8(name: str, fp8: Dtype) -> None:
    assert RocmArch.parse(name).native_fp8 is fp8


# --- ordering of subclasses --------------------------------------------------------------


class _MyVersion(Version):
    """An engine's own version type."""


class _MyArch(CudaArch):
    """An engine's own arch type."""


COMPARISONS: list[Callable[[Any, Any], bool]] = [
    lambda a, b: a <= b,
    lambda a, b: a >= b,
    lambda a, b: a < b,
    lambda a, b: a > b,
]


@pytest.mark.parametrize("compare", COMPARISONS)
@pytest.mark.parametrize(
    ("base", "sub"), [(Version(2, 8), _MyVersion(2, 8)), (CudaArch(9, 0), _MyArch(9, 0))]
)
def test_ordering_against_a_subclass_is_refused_like_equality(
    compare: Callable[[Any, Any], bool], base: object, sub: object
) -> None:
    # attrs' == needs the exact class; <, <=, >= must agree with it, not half-answer.
    assert base != sub
    with pytest.raises(TypeError):
        compare(base, sub)
    with pytest.raises(TypeError):
        compare(sub, base)


def test_parse_turns_a_subclass_into_the_core_type() -> None:
    assert type(Version.parse(_MyVersion(2, 8))) is Version
    assert type(CudaArch.parse(_MyArch(9, 0))) is CudaArch
    # So a rule built from one compares with the device's facts.
    caps = attrs.evolve(kp.device_profile("h100"), torch_version=Version(2, 8))
    config = kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
    assert kp.rules.MinTorch(_MyVersion(2, 8)).check(caps, config) is None
    assert kp.rules.MinComputeCapability(_MyArch(9, 0)).check(caps, config) is None
