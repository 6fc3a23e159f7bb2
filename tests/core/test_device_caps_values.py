"""Example tables for the device profiles, and for building and validating DeviceCaps (the
vocabulary and error format of docs/design.md#vocabulary and docs/design.md#error-format)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch, CudaArch, Dtype, RocmArch, Version
from tests.support.values import PROFILE_NAMES

# --- device profiles ---------------------------------------------------------------------

CUDA_PROFILES = {
    "t4": (7, 5),
    "a100": (8, 0),
    "a10g": (8, 6),
    "l4": (8, 9),
    "l40s": (8, 9),
    "rtx4090": (8, 9),
    "h100": (9, 0),
    "h200": (9, 0),
    "gh200": (9, 0),
    "b200": (10, 0),
    "rtx5090": (12, 0),
}
ROCM_PROFILES = {"mi250x": "gfx90a", "mi300x": "gfx942", "mi325x": "gfx942", "mi355x": "gfx950"}
CPU_PROFILES = ("cpu",)


def test_device_profiles_are_exactly_these_cuda_rocm_and_cpu_products() -> None:
    assert set(kp.device_profiles()) == {*CUDA_PROFILES, *ROCM_PROFILES, *CPU_PROFILES}


@pytest.mark.parametrize(("name", "cc"), list(CUDA_PROFILES.items()))
def test_cuda_profile(name: str, cc: tuple[int, int]) -> None:
    caps = kp.device_profile(name)
    assert caps.platform is kp.Platform.CUDA
    assert caps.arch == CudaArch(*cc)
    assert caps.fp8_format is Dtype.FLOAT8_E4M3FN
    assert "cupy" in caps.libraries
    assert caps.toolkit_version is not None
    assert caps.toolkit_version >= Version(12, 8)
    assert caps.torch_version >= Version(2, 13)


@pytest.mark.parametrize(("name", "gfx"), list(ROCM_PROFILES.items()))
def test_rocm_profile(name: str, gfx: str) -> None:
    caps = kp.device_profile(name)
    assert caps.platform is kp.Platform.ROCM
    assert caps.arch == RocmArch(gfx)
    fnuz = name in ("mi300x", "mi325x")
    assert caps.fp8_format is (Dtype.FLOAT8_E4M3FNUZ if fnuz else Dtype.FLOAT8_E4M3FN)
    assert caps.toolkit_version is not None
    assert caps.toolkit_version >= Version(7, 0)
    assert caps.torch_version >= Version(2, 13)


@pytest.mark.parametrize("name", CPU_PROFILES)
def test_cpu_profile(name: str) -> None:
    caps = kp.device_profile(name)
    assert caps.platform is kp.Platform.CPU
    assert isinstance(caps.arch, CpuArch)
    # What the compiled CPU kernels need (CpuIsa, NeedsToolchain), and nothing more.
    assert caps.arch.isa == {"avx2", "fma", "f16c"}
    assert FEATURE_CPP_TOOLCHAIN in caps.features
    assert caps.fp8_format is Dtype.FLOAT8_E4M3FN
    assert caps.toolkit_version is None
    assert caps.torch_version >= Version(2, 13)


def test_fp8_format_is_fnuz_on_mi300x_and_mi325x_only() -> None:
    fnuz = {n for n, c in kp.device_profiles().items() if c.fp8_format is Dtype.FLOAT8_E4M3FNUZ}
    assert fnuz == {"mi300x", "mi325x"}


@pytest.mark.parametrize("name", ["H100", " a100 ", " CPU", "Mi300X"])
def test_device_profile_name_is_case_insensitive(name: str) -> None:
    assert kp.device_profile(name) is kp.device_profile(name.strip().lower())


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("a10", ("a100", "a10g")),  # it begins both
        ("h10", ("h100",)),
        ("mi300", ("mi300x",)),
        ("rtx409", ("rtx4090",)),
        ("zzz", ()),
        ("", ()),
    ],
)
def test_device_profile_unknown(name: str, candidates: tuple[str, ...]) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        kp.device_profile(name)
    err = info.value
    assert err.candidates == candidates
    assert repr(name) in str(err)
    for known in PROFILE_NAMES:
        assert known in str(err)
    assert set(err.choices) == set(PROFILE_NAMES)


def test_device_profiles_is_read_only() -> None:
    profiles = kp.device_profiles()
    h100 = profiles["h100"]
    with pytest.raises(TypeError):
        profiles["h100"] = kp.device_profile("a100")  # type: ignore[index]
    with pytest.raises(TypeError):
        del profiles["h100"]  # type: ignore[attr-defined]
    assert kp.device_profile("h100") is h100
    assert kp.device_profiles()["h100"] is h100


def test_profile_evolve_changes_one_fact() -> None:
    a100 = kp.device_profile("a100")
    bare = attrs.evolve(a100, libraries=frozenset())
    assert "cupy" not in bare.libraries
    assert "cupy" in a100.libraries
    assert bare.arch == a100.arch


# --- DeviceCaps --------------------------------------------------------------------------


def test_device_caps_named_constructors() -> None:
    cuda = kp.DeviceCaps.cuda("sm_89", name="L4", torch_version="2.13.0+cu128", cuda_version="12.8")
    assert cuda.platform is kp.Platform.CUDA
    assert cuda.arch == CudaArch(8, 9)
    assert cuda.toolkit_version == Version(12, 8)
    assert cuda.torch_version == Version(2, 13)

    rocm = kp.DeviceCaps.rocm(
        "gfx942:sramecc+:xnack-", name="MI300X", torch_version="2.13", rocm_version="7.0.51831"
    )
    assert rocm.platform is kp.Platform.ROCM
    assert rocm.arch == RocmArch("gfx942")
    assert rocm.fp8_format is Dtype.FLOAT8_E4M3FNUZ

    cpu = kp.DeviceCaps.cpu(
        machine="x86_64", isa=["avx2", "FMA"], name="host", torch_version="2.13"
    )
    assert cpu.platform is kp.Platform.CPU
    assert cpu.arch == CpuArch("x86_64", frozenset({"avx2", "fma"}))
    assert cpu.toolkit_version is None


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (
            lambda: kp.DeviceCaps.cuda("sm_8", name="x", torch_version="2.13", cuda_version="12.8"),
            "CUDA compute capability",
        ),
        (
            lambda: kp.DeviceCaps.cuda(
                "gfx942", name="x", torch_version="2.13", cuda_version="12.8"
            ),
            "CUDA compute capability",
        ),
        (
            lambda: kp.DeviceCaps.cuda("8.9", name="", torch_version="2.13", cuda_version="12.8"),
            "device name",
        ),
        (
            lambda: kp.DeviceCaps.cuda(
                "8.9", name="   ", torch_version="2.13", cuda_version="12.8"
            ),
            "device name",
        ),
        (
            lambda: kp.DeviceCaps.cuda("8.9", name="x", torch_version="new", cuda_version="12.8"),
            "version",
        ),
        (
            lambda: kp.DeviceCaps.cuda("8.9", name="x", torch_version="2.13", cuda_version=""),
            "version",
        ),
        (
            lambda: kp.DeviceCaps.rocm("gfx94", name="x", torch_version="2.13", rocm_version="7.0"),
            "AMD GPU architecture",
        ),
        (
            lambda: kp.DeviceCaps.rocm("8.9", name="x", torch_version="2.13", rocm_version="7.0"),
            "AMD GPU architecture",
        ),
        (
            lambda: kp.DeviceCaps.rocm("gfx942", name="", torch_version="2.13", rocm_version="7.0"),
            "device name",
        ),
        (
            lambda: kp.DeviceCaps.rocm(
                "gfx942", name="x", torch_version="2.13", rocm_version="seven"
            ),
            "version",
        ),
        (
            lambda: kp.DeviceCaps.cpu(machine="", isa=(), name="x", torch_version="2.13"),
            "CPU machine name",
        ),
        (
            lambda: kp.DeviceCaps.cpu(machine="x86_64", isa=(), name="", torch_version="2.13"),
            "device name",
        ),
        (
            lambda: kp.DeviceCaps.cpu(machine="x86_64", isa=(), name="x", torch_version="x.y"),
            "version",
        ),
        (
            lambda: kp.DeviceCaps(
                arch="8.9",  # type: ignore[arg-type]
                name="x",
                torch_version=Version(2, 13),
            ),
            "arch",
        ),
        (
            lambda: kp.DeviceCaps(arch=CudaArch(8, 9), name="", torch_version=Version(2, 13)),
            "device name",
        ),
        (
            lambda: kp.DeviceCaps(
                arch=CudaArch(8, 9),
                name="x",
                torch_version="torch",
            ),
            "version",
        ),
        (
            lambda: kp.DeviceCaps(
                arch=RocmArch("gfx942"),
                name="x",
                torch_version=Version(2, 13),
                toolkit_version="rocm",
            ),
            "version",
        ),
    ],
)
def test_device_caps_rejects_malformed(make: Callable[[], object], what: str) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        make()
    assert f"invalid {what} " in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: kp.DeviceCaps.cuda(
            "8.9", name="x", torch_version="2.13", cuda_version="12.8", libraries="cupy"
        ),
        lambda: kp.DeviceCaps.rocm(
            "gfx942", name="x", torch_version="2.13", rocm_version="7.0", libraries="cupy"
        ),
        lambda: kp.DeviceCaps(
            arch=CudaArch(8, 9),
            name="x",
            torch_version=Version(2, 13),
            libraries="cupy",
        ),
    ],
)
def test_device_caps_bare_string_library_is_one_name(make: Callable[[], kp.DeviceCaps]) -> None:
    # A bare string is one library name, not a set of its characters: the field's
    # converter treats it so, and the named constructors must not undo that.
    assert make().libraries == frozenset({"cupy"})


@pytest.mark.parametrize(
    "make",
    [
        lambda: kp.DeviceCaps.cpu(machine="x86_64", isa="avx2", name="x", torch_version="2.13"),
        lambda: kp.DeviceCaps(
            arch=CpuArch("x86_64", "avx2"),
            name="x",
            torch_version=Version(2, 13),
        ),
    ],
)
def test_device_caps_bare_string_isa_is_one_flag(make: Callable[[], kp.DeviceCaps]) -> None:
    arch = make().arch
    assert isinstance(arch, CpuArch)
    assert arch.isa == frozenset({"avx2"})
