"""Example tables for building and validating kernelpick's core values (the vocabulary and
error format of docs/design.md#vocabulary and docs/design.md#error-format)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import kernelpick as kp
from kernelpick.core import (
    FEATURE_CPP_TOOLCHAIN,
    CpuArch,
    CudaArch,
    Dtype,
    GroupShape,
    QuantKey,
    RocmArch,
    ScaleSpec,
    Version,
    scheme_of,
)
from kernelpick.core._reasons import TEMPLATES

DTYPE_NAMES = [d.value for d in Dtype]
PROFILE_NAMES = list(kp.device_profiles())


class _TorchLike:
    """Stands in for a torch dtype: only its ``str`` is ``torch.<name>``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


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
        (_TorchLike("torch.bfloat16"), Dtype.BFLOAT16),
        (_TorchLike("torch.float16"), Dtype.FLOAT16),
        (_TorchLike("torch.float8_e4m3fnuz"), Dtype.FLOAT8_E4M3FNUZ),
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
        ("int4", "int8"),
        ("xyz", None),
        ("", None),
        (None, None),
        (_TorchLike("torch.int32"), None),
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


# --- GroupShape --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "cols"), [(0, 1), (1, 0), (-2, 1), (1, -2), (True, 1), (1, False), (1.0, 1)]
)
def test_group_shape_rejects(rows: int, cols: int) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        GroupShape(rows, cols)
    assert "group shape" in str(info.value)


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (GroupShape.PER_TENSOR, "per-tensor"),
        (GroupShape(-1, -1), "per-tensor"),
        (GroupShape.PER_TOKEN, "per-token"),
        (GroupShape(1, -1), "per-token"),
        (GroupShape.PER_CHANNEL, "per-channel"),
        (GroupShape(-1, 1), "per-channel"),
        (GroupShape.per_group(128), "per-group (1, 128)"),
        (GroupShape.block(128), "block (128, 128)"),
        (GroupShape(2, 4), "group (2, 4)"),
    ],
)
def test_group_shape_render(shape: GroupShape, text: str) -> None:
    assert shape.render() == text
    # One text path: str() is the attrs repr, which names the fields.
    assert str(shape) == repr(shape)


# --- scheme ------------------------------------------------------------------------------

PER_TENSOR, PER_TOKEN, PER_CHANNEL = (
    GroupShape.PER_TENSOR,
    GroupShape.PER_TOKEN,
    GroupShape.PER_CHANNEL,
)
E4M3FN = Dtype.FLOAT8_E4M3FN

SCHEME_KEYS: list[tuple[kp.Scheme, QuantKey, QuantKey | None]] = [
    (
        kp.Scheme.FP8_PER_CHANNEL,
        QuantKey(E4M3FN, ScaleSpec(PER_CHANNEL, static=True)),
        QuantKey(E4M3FN, ScaleSpec(PER_TOKEN, static=False)),
    ),
    (
        kp.Scheme.FP8_PER_TENSOR,
        QuantKey(E4M3FN, ScaleSpec(PER_TENSOR, static=True)),
        QuantKey(E4M3FN, ScaleSpec(PER_TENSOR, static=False)),
    ),
    (
        kp.Scheme.FP8_PER_TENSOR_STATIC,
        QuantKey(E4M3FN, ScaleSpec(PER_TENSOR, static=True)),
        QuantKey(E4M3FN, ScaleSpec(PER_TENSOR, static=True)),
    ),
    (
        kp.Scheme.FP8_WEIGHT_ONLY,
        QuantKey(E4M3FN, ScaleSpec(PER_CHANNEL, static=True)),
        None,
    ),
    (
        kp.Scheme.FP8_BLOCK,
        QuantKey(E4M3FN, ScaleSpec(GroupShape(128, 128), static=True)),
        QuantKey(E4M3FN, ScaleSpec(GroupShape(1, 128), static=False)),
    ),
    (
        kp.Scheme.INT8_PER_CHANNEL,
        QuantKey(Dtype.INT8, ScaleSpec(PER_CHANNEL, static=True)),
        QuantKey(Dtype.INT8, ScaleSpec(PER_TOKEN, static=False)),
    ),
    (
        kp.Scheme.MXFP8,
        QuantKey(E4M3FN, ScaleSpec(GroupShape(32, 1), static=True, dtype=Dtype.FLOAT8_E8M0FNU)),
        QuantKey(E4M3FN, ScaleSpec(GroupShape(1, 32), static=False, dtype="float8_e8m0fnu")),
    ),
]


def test_scheme_table_covers_every_scheme() -> None:
    assert [row[0] for row in SCHEME_KEYS] == list(kp.Scheme)


@pytest.mark.parametrize(("name", "weight", "activation"), SCHEME_KEYS)
def test_scheme_keys_and_defaults(
    name: kp.Scheme, weight: QuantKey, activation: QuantKey | None
) -> None:
    for spelled in (name, name.value, name.value.upper()):
        config = kp.quant_config(spelled, weight_shape=(4096, 1024))
        assert config.weight == weight
        assert config.activation == activation
        assert config.weight_only is (activation is None)
        assert config.weight_shape == (4096, 1024)
        assert (config.n, config.k) == (4096, 1024)
        assert config.out_dtype is Dtype.BFLOAT16
        assert config.input_dtype is Dtype.BFLOAT16
        assert config.bias is False


@pytest.mark.parametrize(
    ("out_dtype", "input_dtype", "want_out", "want_in"),
    [
        ("float16", None, Dtype.FLOAT16, Dtype.FLOAT16),
        ("fp32", None, Dtype.FLOAT32, Dtype.FLOAT32),
        (Dtype.BFLOAT16, "fp16", Dtype.BFLOAT16, Dtype.FLOAT16),
        (_TorchLike("torch.float16"), "bf16", Dtype.FLOAT16, Dtype.BFLOAT16),
    ],
)
def test_scheme_dtypes(
    out_dtype: object, input_dtype: object, want_out: Dtype, want_in: Dtype
) -> None:
    config = kp.quant_config(
        "fp8_per_channel",
        weight_shape=(16, 32),
        out_dtype=out_dtype,  # type: ignore[arg-type]
        input_dtype=input_dtype,  # type: ignore[arg-type]
        bias=True,
    )
    assert config.out_dtype is want_out
    assert config.input_dtype is want_in
    assert config.bias is True


def test_scheme_accepts_list_shape() -> None:
    assert kp.quant_config("fp8_per_tensor", weight_shape=[3, 5]).weight_shape == (3, 5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "closest"),
    [("fp8_per_chanel", "fp8_per_channel"), ("fp8_pertensor", "fp8_per_tensor"), ("ptpc", None)],
)
def test_scheme_unknown_name(name: str, closest: str | None) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        kp.quant_config(name, weight_shape=(16, 16))
    err = info.value
    assert err.value == name
    assert err.closest == closest
    assert repr(name) in str(err)
    for known in kp.Scheme:
        assert known.value in str(err)


@pytest.mark.parametrize(
    "shape",
    [
        (0, 16),
        (16, 0),
        (-16, 16),
        (16, -1),
        (16.0, 16),
        (16, "16"),
        (True, 16),
        (16, False),
        (16,),
        (16, 16, 16),
        (),
        16,
        "16x16",
        None,
    ],
)
def test_scheme_rejects_bad_shape(shape: object) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        kp.quant_config("fp8_per_channel", weight_shape=shape)  # type: ignore[arg-type]
    assert info.value.value == shape
    assert "weight_shape" in str(info.value)
    assert repr(shape) in str(info.value)


@pytest.mark.parametrize(
    ("out_dtype", "input_dtype"),
    [
        ("float8_e4m3fn", None),
        ("e5m2", None),
        ("int8", None),
        ("bfloat16", "float8_e4m3fn"),
        ("bfloat16", "int8"),
        (Dtype.FLOAT8_E4M3FNUZ, None),
    ],
)
def test_scheme_rejects_unsupported_dtype(out_dtype: object, input_dtype: object) -> None:
    with pytest.raises(kp.KernelpickError) as info:
        kp.quant_config(
            "fp8_per_channel",
            weight_shape=(16, 16),
            out_dtype=out_dtype,  # type: ignore[arg-type]
            input_dtype=input_dtype,  # type: ignore[arg-type]
        )
    bad = input_dtype if input_dtype is not None else out_dtype
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("bias", [1, 0, "yes", None, "True"])
def test_scheme_rejects_non_bool_bias(bias: object) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        kp.quant_config("fp8_per_channel", weight_shape=(16, 16), bias=bias)  # type: ignore[arg-type]
    assert info.value.value == bias
    assert "bias" in str(info.value)


@pytest.mark.parametrize("name", list(kp.Scheme))
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bias", [False, True])
def test_scheme_of_inverts_scheme(name: kp.Scheme, out_dtype: str, bias: bool) -> None:
    config = kp.quant_config(name, weight_shape=(48, 80), out_dtype=out_dtype, bias=bias)
    assert scheme_of(config) is name


@pytest.mark.parametrize(
    "config",
    [
        # block-scaled weight with per-token activations: not fp8_block, whose groups match
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(GroupShape.block(128), static=True)),
            activation=QuantKey(E4M3FN, ScaleSpec(PER_TOKEN, False)),
            weight_shape=(256, 256),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
        # block weights of 128 with 1x64 activation groups: the sizes disagree
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(GroupShape.block(128), static=True)),
            activation=QuantKey(E4M3FN, ScaleSpec(GroupShape.per_group(64), False)),
            weight_shape=(256, 256),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
        # MXFP8's groups with fp32 scales: not mxfp8
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(GroupShape(32, 1), static=True)),
            activation=QuantKey(E4M3FN, ScaleSpec(GroupShape(1, 32), False)),
            weight_shape=(256, 256),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
        # per-channel weight with per-tensor dynamic activation: no named scheme has it
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(PER_CHANNEL, static=True)),
            activation=QuantKey(E4M3FN, ScaleSpec(PER_TENSOR, static=False)),
            weight_shape=(16, 16),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
        # PTPC scales but with e5m2 activations
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(PER_CHANNEL, static=True)),
            activation=QuantKey("float8_e5m2", ScaleSpec(PER_TOKEN, static=False)),
            weight_shape=(16, 16),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
        # weight-only with a dynamic weight scale
        kp.QuantConfig(
            weight=QuantKey(E4M3FN, ScaleSpec(PER_CHANNEL, static=False)),
            activation=None,
            weight_shape=(16, 16),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        ),
    ],
)
def test_scheme_of_custom_is_none(config: kp.QuantConfig) -> None:
    assert scheme_of(config) is None


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
    ("name", "closest"),
    [
        ("a10", ("a10g", "a100")),
        ("h10", ("h100",)),
        ("mi300", ("mi300x",)),
        ("rtx409", ("rtx4090",)),
        ("zzz", (None,)),
        ("", (None,)),
    ],
)
def test_device_profile_unknown(name: str, closest: tuple[str | None, ...]) -> None:
    with pytest.raises(kp.UnknownNameError) as info:
        kp.device_profile(name)
    err = info.value
    assert err.closest in closest
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


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "err",
    [
        kp.UnknownNameError("dtype", "bfloat61", DTYPE_NAMES),
        kp.UnknownNameError("device profile", "h10", PROFILE_NAMES),
        kp.UnknownNameError("kernel id", None, ()),
        kp.InvalidValueError("weight_shape", (0, 16), "(N, K): two positive integers"),
        kp.InvalidValueError("strict", "maybe", "True or False"),
    ],
)
def test_error_pickle_round_trip(err: kp.KernelpickError) -> None:
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert str(copy) == str(err)
    assert copy.args == err.args
    assert isinstance(copy, kp.KernelpickError)
    assert isinstance(copy, ValueError)
    if isinstance(err, kp.UnknownNameError):
        assert isinstance(copy, kp.UnknownNameError)
        assert (copy.kind, copy.value, copy.choices, copy.closest) == (
            err.kind,
            err.value,
            err.choices,
            err.closest,
        )
    else:
        assert isinstance(err, kp.InvalidValueError)
        assert isinstance(copy, kp.InvalidValueError)
        assert (copy.what, copy.value, copy.expected) == (err.what, err.value, err.expected)


def test_raised_errors_pickle_round_trip() -> None:
    with pytest.raises(kp.UnknownNameError) as unknown:
        kp.device_profile("h10")
    with pytest.raises(kp.InvalidValueError) as invalid:
        kp.quant_config("fp8_per_channel", weight_shape=(0, 16))
    for err in (unknown.value, invalid.value):
        copy = pickle.loads(pickle.dumps(err))
        assert str(copy) == str(err)
        assert copy.value == err.value
    assert pickle.loads(pickle.dumps(unknown.value)).closest == "h100"


# --- reasons -----------------------------------------------------------------------------


def test_every_reject_code_has_a_template() -> None:
    assert set(TEMPLATES) == set(kp.RejectCode)


@pytest.mark.parametrize("code", list(kp.RejectCode))
def test_reason_renders_its_template(code: kp.RejectCode) -> None:
    reason = kp.Reason(code, "NEEDED-{x}", "FOUND-{y}", kernel="some_kernel")
    message = reason.render()
    assert message
    # The only braces left are the ones inside the substituted values.
    stripped = message.replace("NEEDED-{x}", "").replace("FOUND-{y}", "")
    assert "{" not in stripped
    assert "}" not in stripped
    assert reason.to_dict() == {
        "code": code.value,
        "needed": "NEEDED-{x}",
        "found": "FOUND-{y}",
        "message": message,
    }
    # What a rule returns differs only in the kernel the selector fills in.
    assert kp.Reason(code, "NEEDED-{x}", "FOUND-{y}").render() == message


@pytest.mark.parametrize(
    ("make", "what"),
    [
        # The order before 0.2, Reason(kernel, code, needed, found): refused, not misread.
        (lambda: kp.Reason("cuda_x", kp.RejectCode.OUT_DTYPE, "bf16", "fp16"), "reason code"),  # type: ignore[arg-type]
        (lambda: kp.Reason("compute_capability", "9.0", "8.0"), "reason code"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, CudaArch(9, 0), "8.0"), "reason needed"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, "9.0", None), "reason found"),  # type: ignore[arg-type]
        (lambda: kp.Reason(kp.RejectCode.UNSUPPORTED, "9.0", "8.0", 5), "reason kernel"),  # type: ignore[arg-type]
    ],
)
def test_reason_fields_are_validated(make: Callable[[], object], what: str) -> None:
    with pytest.raises(kp.InvalidValueError) as info:
        make()
    assert info.value.what == what


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


# --- KernelKind --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("W8A8", kp.KernelKind.W8A8),
        ("w8a16", kp.KernelKind.W8A16),
        (" W8A16 ", kp.KernelKind.W8A16),
        (kp.KernelKind.W8A8, kp.KernelKind.W8A8),
    ],
)
def test_kernel_spec_parses_its_kind(value: object, kind: kp.KernelKind) -> None:
    assert kp.KernelSpec("x", "cuda", value).kind is kind


def test_kernel_spec_refuses_an_unknown_kind_by_name() -> None:
    with pytest.raises(kp.UnknownNameError, match="kernel kind") as info:
        kp.KernelSpec("x", "cuda", "W8A4")
    assert info.value.closest in ("W8A8", "W8A16")


def test_device_caps_turn_an_arch_subclass_into_the_core_type() -> None:
    # Rules compare archs of one exact type, so a subclass would make choose raise.
    class MyArch(CudaArch):
        pass

    caps = attrs.evolve(kp.device_profile("h100"), arch=MyArch(9, 0))
    assert type(caps.arch) is CudaArch
    decision = kp.choose(caps, kp.quant_config("fp8_per_channel", weight_shape=(64, 64)))
    assert isinstance(decision, kp.Selected)
