"""Block FP8 on the compiled CPU kernels (cpu_fp8_gemm, cpu_fp8_w8a16_gemm) at every ISA
level this machine can run, against the independent fp32 emulation (tests/support/emulation.py).

Block FP8 is 1 x 128 dynamic activation groups and 128 x 128 weight blocks; the W8A8
kernel also takes any mix of those with per-token activations and per-tensor or
per-channel weights, so every mix is drawn. K and N run past and short of multiples of 128
(a last group or block that is shorter), and M crosses each of the kernel's paths: one
token, a few (up to 64), and panels beyond.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec
from kernelpick.kernels import CpuFp8Gemm, CpuFp8GemmW8A16
from tests.support.cpu_levels import (
    EVERY_LEVEL,
    HOST_ISA,
    LEVELS,
    NEEDS_A_LEVEL,
    caps_at,
    on_one_and_two_threads,
)
from tests.support.emulation import assert_within_bound, emulated

DTYPES = ["float32", "bfloat16", "float16"]
FP8 = Dtype.FLOAT8_E4M3FN
ACTIVATIONS = {
    "per-token": GroupShape.PER_TOKEN,
    "per-tensor": GroupShape.PER_TENSOR,
    "1x128": GroupShape.per_group(128),
}
WEIGHTS = {
    "per-tensor": GroupShape.PER_TENSOR,
    "per-channel": GroupShape.PER_CHANNEL,
    "128x128": GroupShape.block(128),
}
# Extents on both sides of the 128 boundaries, and anything else.
extents = st.one_of(st.integers(1, 600), st.sampled_from([127, 128, 129, 255, 256, 257, 384, 513]))

pytestmark = NEEDS_A_LEVEL


def _config(
    act: str | None, weight: str, n: int, k: int, dtype: str = "bfloat16",
    out: str = "bfloat16", bias: bool = False,
) -> kp.QuantConfig:  # fmt: skip
    """A config with these scales; ``act`` None is weight-only."""
    if act == "1x128" and weight == "128x128":
        # The named scheme, as a checkpoint's config names it.
        return kp.quant_config(
            "fp8_block", weight_shape=(n, k), input_dtype=dtype, out_dtype=out, bias=bias
        )
    activation = None if act is None else QuantKey(FP8, ScaleSpec(ACTIVATIONS[act], static=False))
    return kp.QuantConfig(
        weight=QuantKey(FP8, ScaleSpec(WEIGHTS[weight], static=True)),
        activation=activation,
        weight_shape=(n, k),
        input_dtype=dtype,
        out_dtype=out,
        bias=bias,
    )


def _bind(kernel: str, level: str, config: kp.QuantConfig) -> CpuFp8Gemm:
    bound = kp.bind(kernel, config, caps_at(level))
    assert isinstance(bound, CpuFp8Gemm)
    assert bound.level == level
    return bound


def _draw_problem(
    data: st.DataObject,
) -> tuple[int, int, int, str, str, bool, torch.Generator]:
    """M, N, K, the input and output dtypes, whether there is a bias, and a seeded generator
    for the values: what both numerics properties draw after their scale groupings."""
    m = data.draw(st.integers(1, 300), label="M")
    n = data.draw(extents, label="N")
    k = data.draw(extents, label="K")
    dtype = data.draw(st.sampled_from(DTYPES), label="input dtype")
    out = data.draw(st.sampled_from(DTYPES), label="out dtype")
    bias = data.draw(st.booleans(), label="bias")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    return m, n, k, dtype, out, bias, torch.Generator().manual_seed(seed)


# The AVX-512 levels without BF16 take 13-14 s each for 40 examples (the others 1-6 s):
# make test runs them, make check leaves them out.
W8A8_LEVELS = [
    pytest.param(*p.values, marks=(*p.marks, pytest.mark.slow), id=p.id)
    if p.id in ("avx512", "avx512_vnni")
    else p
    for p in EVERY_LEVEL
]


@pytest.mark.parametrize("level", W8A8_LEVELS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_w8a8_matches_the_fp32_emulation(level: str, data: st.DataObject) -> None:
    act = data.draw(st.sampled_from(sorted(ACTIVATIONS)), label="activation scales")
    weight = data.draw(st.sampled_from(sorted(WEIGHTS)), label="weight scales")
    m, n, k, dtype, out, bias, generator = _draw_problem(data)
    config = _config(act, weight, n, k, dtype, out, bias)
    # Columns and rows of very different sizes, so the groups' and blocks' scales differ
    # and one applied to the wrong group shows (outputs stay within fp16's range).
    spread = torch.logspace(-2, 2, k)[torch.randperm(k, generator=generator)]
    x = (torch.randn(m, k, generator=generator) * spread).to(getattr(torch, dtype))
    w = torch.randn(n, k, generator=generator) * torch.logspace(-3, -1, n).unsqueeze(1)
    b = torch.randn(n, generator=generator).to(getattr(torch, out)) if bias else None
    impl = _bind("cpu_fp8_gemm", level, config)
    got = impl.apply(x, impl.quantize_weights(w), b)
    assert got.shape == (m, n)
    assert got.dtype == getattr(torch, out)
    assert_within_bound(got, emulated(x, w, config, FP8, bias=b))


@pytest.mark.parametrize("level", EVERY_LEVEL)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_w8a16_matches_the_fp32_emulation(level: str, data: st.DataObject) -> None:
    # Weight-only block configs, and the fp8_block scheme served degraded (activations kept).
    act = data.draw(st.sampled_from([None, "1x128"]), label="activation scales")
    m, n, k, dtype, out, bias, generator = _draw_problem(data)
    if k <= 128:
        # A 1 x 128 group spanning the whole row is per-token, which no W8A16 kernel serves.
        act = None
    config = _config(act, "128x128", n, k, dtype, out, bias)
    x = torch.randn(m, k, generator=generator).to(getattr(torch, dtype))
    w = torch.randn(n, k, generator=generator) * torch.logspace(-3, -1, k)
    b = torch.randn(n, generator=generator).to(getattr(torch, out)) if bias else None
    impl = _bind("cpu_fp8_w8a16_gemm", level, config)
    got = impl.apply(x, impl.quantize_weights(w), b)
    assert_within_bound(got, emulated(x, w, config, FP8, bias=b, weight_only=True))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 3, 64, 65, 300])
def test_each_group_is_quantized_as_torchs_e4m3_cast(level: str, m: int) -> None:
    # An identity weight with unit block scales makes the output the dequantized
    # activations, so every rounding of the fused group quantizer (ties, subnormals, the
    # clamp, a short last group) shows. One token is exact; the other paths scale a sum by
    # the ratio of two groups' scales at each group boundary (an fp32 rounding each), far
    # below an e4m3 step (2^-4 relative).
    k = 300
    config = _config("1x128", "128x128", k, k, "float32", "float32")
    impl = _bind("cpu_fp8_gemm", level, config)
    blocks = -(-k // 128)
    bundle = impl.prepare_weights(torch.eye(k).to(torch.float8_e4m3fn), torch.ones(blocks, blocks))
    generator = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=generator) * torch.logspace(-12, 4, k)
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-40])
    got = impl.apply(x, bundle)
    padded = torch.nn.functional.pad(x, (0, blocks * 128 - k)).view(m, blocks, 128)
    scale = (padded.abs().amax(dim=2) / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    scale = scale.repeat_interleave(128, dim=1)[:, :k]
    want = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    if m == 1:
        assert torch.equal(got, want)
    else:
        assert torch.allclose(got, want, rtol=2.0**-18, atol=0.0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kernel", ["cpu_fp8_gemm", "cpu_fp8_w8a16_gemm"])
@pytest.mark.parametrize("m", [1, 7, 200])
@pytest.mark.parametrize(("out", "bias"), [("bfloat16", False), ("float32", True)])
def test_one_and_two_threads_agree_exactly(
    kernel: str, level: str, m: int, out: str, bias: bool
) -> None:
    # N = 301: a short last weight block and a partial block of 4 rows; K = 333: a short
    # last group.
    n, k = 301, 333
    act = "1x128" if kernel == "cpu_fp8_gemm" else None
    config = _config(act, "128x128", n, k, out, out, bias)
    impl = _bind(kernel, level, config)
    bundle = impl.quantize_weights(torch.randn(n, k))
    x = torch.randn(m, k).to(getattr(torch, out))
    b = torch.randn(n).to(getattr(torch, out)) if bias else None
    one, two = on_one_and_two_threads(lambda: impl.apply(x, bundle, b))
    assert torch.equal(one, two)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 3, 70])
def test_a_nan_in_one_group_makes_that_rows_outputs_nan(level: str, m: int) -> None:
    k = 300
    config = _config("1x128", "128x128", 24, k, "float32", "float32")
    impl = _bind("cpu_fp8_gemm", level, config)
    bundle = impl.quantize_weights(torch.randn(24, k))
    for column in (0, 130, k - 1):  # the first, a middle and the short last group
        x = torch.randn(m, k)
        x[m - 1, column] = float("nan")
        got = impl.apply(x, bundle)
        assert bool(torch.isnan(got[m - 1]).all())
        assert bool(torch.isfinite(got[: m - 1]).all())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 2, 64, 65])
@pytest.mark.parametrize(
    ("first", "second", "weight_scale"),
    [
        (1e33, 0.0, 1.0),  # a huge group beside an all-zero one: scales 1e34 apart
        (1.0, 1e30, 1.0),  # a row whose groups' scales differ by 1e30
        (1.0, 1.0, 1e-36),  # combined scales below 2^-100, next to fp32's subnormals
    ],
)
def test_scales_far_apart_or_tiny_in_one_row_stay_exact(
    level: str, m: int, first: float, second: float, weight_scale: float
) -> None:
    # Applied group by group, the running sum would overflow or lose bits here; such rows
    # go to the fp32 panels, which scale each operand on its own (groups_in_range).
    n, k = 128, 256
    config = _config("1x128", "128x128", n, k, "float32", "float32")
    impl = _bind("cpu_fp8_gemm", level, config)
    generator = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=generator)
    bundle = impl.quantize_weights(w)
    scale = bundle.scale.clone()
    scale[:, 0] *= weight_scale
    bundle = impl.prepare_weights(bundle.weight, scale)
    x = torch.randn(m, k, generator=generator)
    x[:, :128] *= first
    x[:, 128:] *= second
    got = impl.apply(x, bundle)
    assert bool(torch.isfinite(got).all())
    weight = bundle.weight.float() * scale.repeat_interleave(128, 1)[:, :k]
    assert_within_bound(got, emulated(x, weight, config, FP8))


def test_compiles_with_fullgraph_as_one_custom_op() -> None:
    config = _config("1x128", "128x128", 48, 200, bias=True)
    impl = _bind("cpu_fp8_gemm", LEVELS[0], config)
    bundle = impl.quantize_weights(torch.randn(48, 200))
    bias = torch.randn(48).to(torch.bfloat16)
    x = torch.randn(2, 5, 200).to(torch.bfloat16)
    compiled = torch.compile(lambda t: impl.apply(t, bundle, bias), fullgraph=True)
    assert torch.equal(compiled(x), impl.apply(x, bundle, bias))


def _family(kind: type[CpuFp8Gemm], config: kp.QuantConfig) -> CpuFp8Gemm:
    # Built directly, past the catalog's rules: the family must refuse on its own.
    spec = kp.default_catalog().kernel(
        "cpu_fp8_gemm" if kind is CpuFp8Gemm else "cpu_fp8_w8a16_gemm"
    )
    return kind(spec, config, torch.device("cpu"), FP8, isa=HOST_ISA)


@pytest.mark.parametrize("kind", [CpuFp8Gemm, CpuFp8GemmW8A16])
def test_another_block_size_is_refused_by_the_family(kind: type[CpuFp8Gemm]) -> None:
    config = kp.quant_config("fp8_block", weight_shape=(256, 256), block_size=64)
    with pytest.raises(kp.InvalidValueError, match=r"\(128, 128\)"):
        _family(kind, config)


@pytest.mark.parametrize(
    "activation",
    [
        ScaleSpec(GroupShape.per_group(128), static=True),  # a stored scale per group
        ScaleSpec(GroupShape.per_group(64), static=False),  # groups unlike the op's
        ScaleSpec(GroupShape.PER_TOKEN, static=True),  # a stored scale per token
        ScaleSpec(GroupShape.per_group(128), static=False, dtype=Dtype.FLOAT8_E8M0FNU),
    ],
)
def test_an_activation_grouping_the_op_does_not_quantize_is_refused(
    activation: ScaleSpec,
) -> None:
    config = kp.QuantConfig(
        weight=QuantKey(FP8, ScaleSpec(GroupShape.block(128), static=True)),
        activation=QuantKey(FP8, activation),
        weight_shape=(256, 256),
        input_dtype=Dtype.BFLOAT16,
        out_dtype=Dtype.BFLOAT16,
    )
    with pytest.raises(kp.InvalidValueError, match="per-group"):
        _family(CpuFp8Gemm, config)


def test_mxfp8_and_int8_are_refused_by_the_family() -> None:
    mx = kp.quant_config("mxfp8", weight_shape=(256, 256))
    with pytest.raises(kp.InvalidValueError, match="weight scales"):
        _family(CpuFp8Gemm, mx)
    int8 = kp.quant_config("int8_per_channel", weight_shape=(256, 256))
    with pytest.raises(kp.InvalidValueError, match="float8_e4m3fn"):
        _family(CpuFp8Gemm, int8)


def test_the_op_refuses_a_scale_grid_of_the_wrong_shape() -> None:
    config = _config("1x128", "128x128", 256, 384)
    impl = _bind("cpu_fp8_gemm", LEVELS[0], config)
    weight = torch.zeros(256, 384).to(torch.float8_e4m3fn)
    x = torch.randn(2, 384)
    # Transposed: [3, 2] where [2, 3] is due. prepare_weights refuses it by shape; the op
    # itself refuses it too, for a caller who goes around the family.
    with pytest.raises(kp.KernelInputError, match="shape"):
        impl.prepare_weights(weight, torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="ceil"):
        impl._op(x, weight, torch.ones(3, 2), None, True, torch.float32, 128, 128, None)


def test_a_block_scale_in_another_layout_is_read_as_its_values() -> None:
    config = _config("1x128", "128x128", 256, 384, "float32", "float32")
    impl = _bind("cpu_fp8_gemm", LEVELS[-1], config)
    bundle = impl.quantize_weights(torch.randn(256, 384))
    transposed = bundle.scale.t().contiguous().t()  # the same values, column-major
    assert not transposed.is_contiguous()
    x = torch.randn(3, 384)
    got = impl.apply(x, impl.prepare_weights(bundle.weight, transposed))
    assert torch.equal(got, impl.apply(x, bundle))
