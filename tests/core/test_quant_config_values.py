"""Example tables for building and validating group shapes and quant configs (the vocabulary and
error format of docs/design.md#vocabulary and docs/design.md#error-format)."""

from __future__ import annotations

import pytest

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec, scheme_of
from tests.support.values import TorchLike

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
    # compressed-tensors' W4A16 preset: symmetric int4 in groups of 128 along K.
    (
        kp.Scheme.INT4_WEIGHT_ONLY,
        QuantKey(Dtype.INT4, ScaleSpec(GroupShape(128, 1), static=True)),
        None,
    ),
    # Per channel by default: what torch's _weight_int8pack_mm reads.
    (kp.Scheme.INT8_WEIGHT_ONLY, QuantKey(Dtype.INT8, ScaleSpec(PER_CHANNEL, static=True)), None),
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
        (TorchLike("torch.float16"), "bf16", Dtype.FLOAT16, Dtype.BFLOAT16),
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
    ],
)
def test_scheme_of_custom_is_none(config: kp.QuantConfig) -> None:
    assert scheme_of(config) is None


@pytest.mark.parametrize("weight_dtype", [E4M3FN, Dtype.INT8, Dtype.INT4])
def test_a_dynamic_weight_scale_is_refused_not_read_as_the_stored_one(weight_dtype: Dtype) -> None:
    # A stored weight's scales are stored with it: every kernel would read them as static.
    with pytest.raises(kp.InvalidValueError, match="static weight scales"):
        kp.QuantConfig(
            weight=QuantKey(weight_dtype, ScaleSpec(PER_CHANNEL, static=False)),
            activation=None,
            weight_shape=(16, 16),
            input_dtype="bfloat16",
            out_dtype="bfloat16",
        )
