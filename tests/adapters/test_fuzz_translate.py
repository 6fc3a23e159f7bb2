"""Fuzzing the device adapters' ``translate(props)`` with hypothesis: recorded device
properties (tests/fixtures/devices) with keys dropped or given values of the wrong type
become DeviceCaps, or an error naming the bad property (docs/design.md#error-format).

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.adapters.cpu import _device as cpu_device
from kernelpick.adapters.cuda import _device as cuda_device
from kernelpick.adapters.rocm import _device as rocm_device
from kernelpick.core import (
    CPP_TOOLCHAIN_PARTS,
    FEATURE_CPP_TOOLCHAIN,
    FEATURE_SCALED_MM,
    FEATURE_SCALED_MM_ROWWISE,
    CpuArch,
    CudaArch,
    RocmArch,
    Version,
)
from tests.support.fuzzing import GFX_TEXT, assert_names, fuzz

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devices"
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
        *CPP_TOOLCHAIN_PARTS,
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
            **{part: isinstance(get(part), bool) for part in CPP_TOOLCHAIN_PARTS},
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
            "gcnArchName": bool(GFX_TEXT.match(arch)),
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
            )
            if get(key)
        ]
        parts = {part for part in CPP_TOOLCHAIN_PARTS if get(part)}
        # Every part found is the one shorthand; fewer, the parts themselves.
        features += [FEATURE_CPP_TOOLCHAIN] if len(parts) == len(CPP_TOOLCHAIN_PARTS) else parts
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
