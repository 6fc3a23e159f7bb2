"""The compiled CPU FP8 kernels (cpu_fp8_gemm, cpu_fp8_w8a16_gemm) at every ISA level this
machine can run, against the independent fp32 emulation (tests/support/emulation.py).

tests/kernels/test_kernels_numerics.py runs them over every scheme they serve; here, over the
input dtypes too. Both run each build the host's ISA allows (AVX2, AVX-512, AVX512-BF16)
and skip, naming the flags it lacks, each build it does not. The M range crosses the
kernel's switch from its GEMV path to its panel path, and K and N are any extent (the tail
paths).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.adapters.cpu._device import usable_isa
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec
from kernelpick.kernels import LAUNCHES, CpuFp8Gemm, CpuFp8GemmW8A16, KernelBase
from kernelpick.kernels._cpu_build import VNNI_LEVELS, _build_name, isa_level
from kernelpick.kernels._cpu_gemm import (
    AMX_INT_MM_FROM_TOKENS,
    INT_MM_FROM_TOKENS,
    int_mm_from_tokens,
)
from tests.support.cpu_levels import (
    EVERY_LEVEL,
    HOST_ISA,
    LEVELS,
    NEEDS_A_LEVEL,
    NEEDS_INT8_DOT,
    caps_at,
    on_one_and_two_threads,
    with_flags,
    with_int8_dot,
)
from tests.support.emulation import Emulated, assert_within_bound, emulated
from tests.support.values import static_per_token_config

KERNELS = {"cpu_fp8_gemm": "fp8_per_channel", "cpu_fp8_w8a16_gemm": "fp8_weight_only"}
DTYPES = ["float32", "bfloat16", "float16"]

pytestmark = NEEDS_A_LEVEL


def _bind(kernel: str, level: str, config: kp.QuantConfig) -> KernelBase:
    bound = kp.bind(kernel, config, caps_at(level))
    assert isinstance(bound, CpuFp8Gemm)
    assert bound.level == level
    return bound


def test_the_host_builds_its_best_level() -> None:
    assert isa_level(HOST_ISA) == LEVELS[0]


AVX2 = ("avx2", "fma", "f16c")
AVX512 = (*AVX2, "avx512f", "avx512bw", "avx512vl")
AMX = ("amx_bf16", "amx_int8", "amx_tile")


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        (AVX2, "avx2"),
        ((*AVX2, "avx_vnni"), "avx2_vnni"),  # Alder Lake: 256-bit vpdpbusd only
        ((*AVX512, "avx_vnni"), "avx512"),  # AVX-512 first: vpmaddwd on 32 weights a step
        (AVX512, "avx512"),  # Skylake-X
        ((*AVX512, "avx512_vnni"), "avx512_vnni"),  # Cascade Lake, Ice Lake
        ((*AVX512, "avx512vbmi", "avx512_bf16", "avx512_vnni"), "avx512_bf16"),  # Zen 4, 5
        ((*AVX512, "avx512vbmi", "avx512_bf16", "avx512_vnni", *AMX), "avx512_amx"),  # SPR on
        ((*AVX512, "avx512vbmi", "avx512_bf16", "amx_int8"), "avx512_bf16"),  # no amx_bf16
        # VNNI dropped by ONEDNN_MAX_CPU_ISA (below): the bf16 level all the same.
        ((*AVX512, "avx512vbmi", "avx512_bf16"), "avx512_bf16"),
        (("avx2", "fma"), None),  # no F16C: no level
    ],
)
def test_each_cpu_gets_the_best_level_its_flags_allow(
    flags: tuple[str, ...], level: str | None
) -> None:
    assert isa_level(flags) == level


@pytest.mark.parametrize("cap", ["AVX512_CORE", "AVX2", "AVX512_CORE_VNNI"])
def test_a_onednn_cap_does_not_cost_a_zen4_its_bf16_level(cap: str) -> None:
    # The probe drops avx512_vnni where oneDNN may not use it (for torch._int_mm's sums);
    # kernelpick's own kernels do not go through oneDNN, and keep vdpbf16ps.
    zen4 = [*AVX512, "avx512vbmi", "avx512_bf16", "avx512_vnni"]
    assert isa_level(usable_isa(zen4, {"ONEDNN_MAX_CPU_ISA": cap})) == "avx512_bf16"
    ice_lake = [*AVX512, "avx512_vnni"]
    vnni = "avx512_vnni" if cap == "AVX512_CORE_VNNI" else "avx512"
    assert isa_level(usable_isa(ice_lake, {"ONEDNN_MAX_CPU_ISA": cap})) == vnni


@pytest.mark.parametrize(
    ("cap", "level"),
    [
        ("AVX512_CORE_AMX", "avx512_amx"),
        ("DEFAULT", "avx512_amx"),
        ("AVX512_CORE_BF16", "avx512_bf16"),
        ("AVX512_CORE_FP16", "avx512_bf16"),
        ("AVX2_VNNI", "avx512_bf16"),
    ],
)
def test_amx_tiles_run_only_where_onednn_may_use_them(cap: str, level: str) -> None:
    # The avx512_amx build multiplies through oneDNN (at::native::cpublas::brgemm): capped
    # below AMX, oneDNN would run that on AVX-512, so the caps drop the AMX units and the
    # bf16 build's own outer products run instead.
    sapphire_rapids = [*AVX512, "avx512vbmi", "avx512_bf16", "avx512_vnni", *AMX]
    usable = usable_isa(sapphire_rapids, {"ONEDNN_MAX_CPU_ISA": cap})
    assert isa_level(usable) == level
    assert ("amx_int8" in usable) == (level == "avx512_amx")


@pytest.mark.parametrize(
    ("level", "k", "amx", "tokens"),
    [
        ("avx2", 8192, False, INT_MM_FROM_TOKENS),
        ("avx512", 4096, False, INT_MM_FROM_TOKENS),
        ("avx512_vnni", 4096, False, 192),
        ("avx512_vnni", 14336, False, 192),
        ("avx512_bf16", 2048, False, 192),
        ("avx512_bf16", 2047, False, 65),
        ("avx512_vnni", 1, False, 65),
        # AMX-INT8: _int_mm on AMX tiles wins from 41 tokens, whatever the build.
        ("avx512_amx", 4096, True, AMX_INT_MM_FROM_TOKENS),
        ("avx512_bf16", 14336, True, AMX_INT_MM_FROM_TOKENS),
        ("avx2", 1024, True, AMX_INT_MM_FROM_TOKENS),
    ],
)
def test_int8_hands_over_to_int_mm_where_it_measured_faster(
    level: str, k: int, amx: bool, tokens: int
) -> None:
    assert int_mm_from_tokens(level, k, amx) == tokens


def _case(
    kernel: str, level: str, m: int, n: int, k: int, dtype: str, out: str, bias: bool, seed: int
) -> tuple[torch.Tensor, Emulated]:
    generator = torch.Generator().manual_seed(seed)
    config = kp.quant_config(
        KERNELS[kernel], weight_shape=(n, k), input_dtype=dtype, out_dtype=out, bias=bias
    )
    x = torch.randn(m, k, generator=generator).to(getattr(torch, dtype))
    w = torch.randn(n, k, generator=generator) * 0.05
    b = torch.randn(n, generator=generator).to(getattr(torch, out)) if bias else None
    impl = _bind(kernel, level, config)
    got = impl.apply(x, impl.quantize_weights(w), b)
    assert got.shape == (m, n)
    assert got.dtype == getattr(torch, out)
    want = emulated(x, w, config, Dtype.FLOAT8_E4M3FN, bias=b, weight_only=kernel != "cpu_fp8_gemm")
    return got, want


@pytest.mark.parametrize("level", EVERY_LEVEL)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_matches_the_fp32_emulation(kernel: str, level: str, data: st.DataObject) -> None:
    m = data.draw(st.integers(1, 300), label="M")
    n = data.draw(st.integers(1, 300), label="N")
    k = data.draw(st.integers(1, 600), label="K")
    dtype = data.draw(st.sampled_from(DTYPES), label="input dtype")
    out = data.draw(st.sampled_from(DTYPES), label="out dtype")
    bias = data.draw(st.booleans(), label="bias")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    got, want = _case(kernel, level, m, n, k, dtype, out, bias, seed)
    assert_within_bound(got, want)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 64, 65, 300])
def test_per_token_quantization_is_torchs_e4m3_cast_exactly(level: str, m: int) -> None:
    # An identity weight of scale 1 makes the output the dequantized activations, so every
    # rounding of the fused quantizer (ties, subnormals, the clamp) is compared exactly.
    k = 72
    config = kp.quant_config("fp8_per_channel", weight_shape=(k, k), out_dtype="float32")
    impl = _bind("cpu_fp8_gemm", level, config)
    eye = torch.eye(k).to(torch.float8_e4m3fn)
    bundle = impl.prepare_weights(eye, torch.ones(k, 1))
    generator = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=generator) * torch.logspace(-12, 4, k)
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-40])
    got = impl.apply(x, bundle)
    scale = (x.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    want = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    assert torch.equal(got, want)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("flush_denormal", [False, True], ids=["denormals", "flush_denormal"])
@pytest.mark.parametrize("activation", ["float32", "bfloat16"])
def test_every_fp8_byte_decodes_exactly(level: str, flush_denormal: bool, activation: str) -> None:
    # The weight holds each finite e4m3fn byte once (0x7F and 0xFF are NaN), one per column.
    # Under torch.set_flush_denormal(True) (FTZ and DAZ, on one thread so that every path
    # runs under it) the 14 subnormal bytes must not read as zero: a decode that passes
    # them through fp32 denormals would (vcvtph2ps's fp16 denormals ignore DAZ). bf16
    # activations take the bf16 build's own paths (its table decode, and from 17 tokens
    # the packed panels of _cpu_bf16_outer.h); fp32 ones the fp32 paths. 33 rows, each
    # the bytes in another order: every lane of a 32-row panel, and a partial one.
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n, k = 33, len(codes)
    config = kp.quant_config(
        "fp8_weight_only", weight_shape=(n, k), input_dtype=activation, out_dtype="float32"
    )
    impl = _bind("cpu_fp8_w8a16_gemm", level, config)
    rows = torch.stack([codes.roll(7 * r) for r in range(n)])
    weight = rows.view(torch.float8_e4m3fn)
    bundle = impl.prepare_weights(weight, torch.ones(n, 1))
    threads = torch.get_num_threads()
    eye = torch.eye(k, dtype=getattr(torch, activation))  # row i picks weight column i
    try:
        torch.set_num_threads(1)
        torch.set_flush_denormal(flush_denormal)
        # Every path's decode: the panels (M = k), a few tokens (blocks of 5) and one token.
        outputs = [
            impl.apply(eye, bundle),
            torch.cat([impl.apply(eye[i : i + 5], bundle) for i in range(0, k, 5)]),
            torch.cat([impl.apply(eye[i : i + 1], bundle) for i in range(k)]),
        ]
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    for got in outputs:
        assert torch.equal(got, weight.float().t())


# Each kernel's schemes as the threads test runs them: per-tensor activations take one
# amax over every row, reduced across the threads.
THREADED = [
    *KERNELS.items(),
    ("cpu_fp8_gemm", "fp8_per_tensor"),
    ("cpu_int8_gemm", "int8_per_channel"),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("kernel", "scheme"), THREADED)
@pytest.mark.parametrize("m", [1, 7, 200])
@pytest.mark.parametrize(("out", "bias"), [("bfloat16", False), ("float32", True)])
def test_one_and_two_threads_agree_exactly(
    kernel: str, scheme: str, level: str, m: int, out: str, bias: bool
) -> None:
    # Every path: one token, a few, torch's GEMM on panels (bf16, no bias) and the decoded
    # panels (fp32 or a bias); N = 97 leaves a partial block of rows.
    config = kp.quant_config(scheme, weight_shape=(97, 160), out_dtype=out, bias=bias)
    impl = _bind(kernel, level, config)
    bundle = impl.quantize_weights(torch.randn(97, 160))
    x = torch.randn(m, 160).to(getattr(torch, out))
    b = torch.randn(97).to(getattr(torch, out)) if bias else None
    one, two = on_one_and_two_threads(lambda: impl.apply(x, bundle, b))
    assert torch.equal(one, two)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_compiles_with_fullgraph_as_one_custom_op(kernel: str) -> None:
    config = kp.quant_config(
        KERNELS[kernel], weight_shape=(48, 80), out_dtype="bfloat16", bias=True
    )
    impl = _bind(kernel, LEVELS[0], config)
    bundle = impl.quantize_weights(torch.randn(48, 80))
    bias = torch.randn(48).to(torch.bfloat16)
    x = torch.randn(2, 5, 80).to(torch.bfloat16)
    compiled = torch.compile(lambda t: impl.apply(t, bundle, bias), fullgraph=True)
    assert torch.equal(compiled(x), impl.apply(x, bundle, bias))


def test_an_activation_config_the_op_does_not_quantize_is_refused() -> None:
    # A stored per-token scale run through this family would be computed again: silent.
    config = static_per_token_config()
    spec = kp.default_catalog().kernel("cpu_fp8_gemm")
    with pytest.raises(kp.InvalidValueError, match="per-token"):
        CpuFp8Gemm(spec, config, torch.device("cpu"), Dtype.FLOAT8_E4M3FN, isa=HOST_ISA)


def test_a_cpu_without_the_isa_is_refused_at_bind_time() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(16, 16))
    spec = kp.default_catalog().kernel("cpu_fp8_gemm")
    sse = frozenset({"sse4_2"})
    with pytest.raises(kp.InvalidValueError, match="avx2"):
        CpuFp8Gemm(spec, config, torch.device("cpu"), Dtype.FLOAT8_E4M3FN, isa=sse)


def test_the_e4m3fnuz_format_is_refused_at_bind_time() -> None:
    # The op decodes e4m3fn bytes; fnuz bytes would decode as other values.
    config = kp.quant_config("fp8_per_channel", weight_shape=(16, 16))
    spec = kp.default_catalog().kernel("cpu_fp8_gemm")
    with pytest.raises(kp.InvalidValueError, match="float8_e4m3fn"):
        CpuFp8Gemm(spec, config, torch.device("cpu"), Dtype.FLOAT8_E4M3FNUZ, isa=HOST_ISA)


def test_a_backward_pass_is_refused_not_silently_gradient_free() -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(16, 32), out_dtype="float32")
    impl = _bind("cpu_fp8_gemm", LEVELS[0], config)
    bundle = impl.quantize_weights(torch.randn(16, 32))
    x = torch.randn(3, 32, requires_grad=True)
    y = impl.apply(x, bundle)
    with pytest.raises(kp.InvalidValueError, match="inference"):
        y.sum().backward()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 3, 70])
def test_a_nan_in_a_row_makes_that_rows_outputs_nan_as_torch_does(level: str, m: int) -> None:
    # Wherever the NaN sits in the row (the vector body or the scalar tail), it must not be
    # lost in the amax and leave a finite, wrong row.
    k = 83
    config = kp.quant_config("fp8_per_channel", weight_shape=(24, k), out_dtype="float32")
    impl = _bind("cpu_fp8_gemm", level, config)
    bundle = impl.quantize_weights(torch.randn(24, k))
    for column in (0, 5, 40, k - 1):
        x = torch.randn(m, k)
        x[m - 1, column] = float("nan")
        got = impl.apply(x, bundle)
        assert bool(torch.isnan(got[m - 1]).all())
        assert bool(torch.isfinite(got[: m - 1]).all())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 3, 70])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nonfinite_value_makes_its_int8_rows_outputs_nan_and_leaves_the_others(
    level: str, m: int, bad: float
) -> None:
    # The integer dot products never see a NaN (int16 has none): the row's scale must carry
    # it, or the row would come out finite and wrong. An inf amax quantizes the row's
    # infinities to NaN, so that row is all NaN too, as on the fp32 paths and in torch.
    k = 83
    config = kp.quant_config("int8_per_channel", weight_shape=(24, k), out_dtype="float32")
    impl = _bind("cpu_int8_gemm", level, config)
    bundle = impl.quantize_weights(torch.randn(24, k))
    for column in (0, 40, k - 1):
        x = torch.randn(m, k)
        clean = impl.apply(x, bundle)
        x[m - 1, column] = bad
        got = impl.apply(x, bundle)
        assert bool(torch.isnan(got[m - 1]).all())
        assert torch.equal(got[: m - 1], clean[: m - 1])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("k", [2**17, 2**17 + 1])
def test_int8_sums_too_long_for_int32_take_the_fp32_path(level: str, k: int) -> None:
    # The integer dot products hold a sum of 2^17 products of at most 128 * 127 in int32;
    # one product more could overflow it, so that K goes to the fp32 panels instead.
    config = kp.quant_config("int8_per_channel", weight_shape=(3, k), out_dtype="float32")
    impl = _bind("cpu_int8_gemm", level, config)
    generator = torch.Generator().manual_seed(k)
    # Every product at its largest: activations at +-127 after quantization, weights too.
    x = torch.ones(2, k)
    w = torch.ones(3, k)
    w[1] = -1.0
    w[2] = torch.randn(k, generator=generator)
    got = impl.apply(x, impl.quantize_weights(w))
    want = emulated(x, w, config, Dtype.FLOAT8_E4M3FN)
    assert_within_bound(got, want)
    assert float(got[0, 0]) == pytest.approx(k, rel=1e-4)  # fp32 sums past 2^24 round
    assert float(got[0, 1]) == pytest.approx(-k, rel=1e-4)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 5, 70])
@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_a_half_output_is_the_fp32_output_rounded_once_to_nearest_even(
    level: str, m: int, out: str
) -> None:
    # fp32 activations keep every path's sums in fp32 (no bf16 GEMM), so the output dtype
    # changes only the epilogue's store: eight values at a time, and the rest one by one,
    # each exactly torch's rounding of the fp32 result. N = 77 leaves a scalar tail.
    n, k = 77, 96
    config = kp.quant_config(
        "fp8_weight_only", weight_shape=(n, k), input_dtype="float32", out_dtype="float32",
        bias=True,
    )  # fmt: skip
    half = attrs.evolve(config, out_dtype=Dtype(out))
    generator = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=generator)
    x = torch.randn(m, k, generator=generator) * 1e3
    x[0, 0] = float("nan")  # a NaN row stays NaN in every dtype
    b = torch.randn(n, generator=generator)
    # Zero rows make their outputs the bias itself, which sits on ties of both half dtypes
    # (halfway between two bf16 or fp16 values, each way to even), in vector and tail.
    ulp = 2.0**-7 if out == "bfloat16" else 2.0**-10
    ties = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), -(1 + 3 * ulp / 2)])
    tied = [*range(0, 16), *range(72, 76)]
    w[tied] = 0.0
    b[tied] = ties.repeat(5)
    wide, narrow = (
        _bind("cpu_fp8_w8a16_gemm", level, config),
        _bind("cpu_fp8_w8a16_gemm", level, half),
    )
    want = wide.apply(x, wide.quantize_weights(w), b).to(getattr(torch, out))
    got = narrow.apply(x, narrow.quantize_weights(w), b)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [65, 131])
def test_int8_past_64_tokens_with_a_long_k_runs_integer_panels_as_the_emulation(
    level: str, m: int
) -> None:
    # Past 64 tokens an int8 layer with K >= 2048 keeps the integer dot products (rows
    # decoded once into panels, every token block against them); 1 and 2 threads agree.
    # (A vpdpbusd build, whose CPU has an int8 dot, hands over to _int_mm at 192 here.)
    n, k = 37, 2048 + 9
    config = kp.quant_config("int8_per_channel", weight_shape=(n, k), out_dtype="float32")
    impl = _bind("cpu_int8_gemm", level, config)
    generator = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=generator)
    x = torch.randn(m, k, generator=generator)
    bundle = impl.quantize_weights(w)
    one, two = on_one_and_two_threads(lambda: impl.apply(x, bundle))
    assert torch.equal(one, two)
    assert_within_bound(one, emulated(x, w, config, Dtype.FLOAT8_E4M3FN))


def test_block_weight_scales_of_another_size_are_refused_at_bind_time() -> None:
    # The op reads 128 x 128 blocks only (tests/kernels/test_cpu_block_fp8.py): a grid of 64 x 64
    # block scales read as one of 128 x 128 blocks would be misread, silently.
    block = kp.QuantConfig(
        weight=QuantKey(Dtype.FLOAT8_E4M3FN, ScaleSpec(GroupShape.block(64), static=True)),
        activation=None,
        weight_shape=(256, 16384),
        input_dtype=Dtype.BFLOAT16,
        out_dtype=Dtype.BFLOAT16,
    )
    spec = kp.default_catalog().kernel("cpu_fp8_w8a16_gemm")
    with pytest.raises(kp.InvalidValueError, match="per-channel"):
        CpuFp8GemmW8A16(spec, block, torch.device("cpu"), Dtype.FLOAT8_E4M3FN, isa=HOST_ISA)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [64, 65, 300])
def test_a_bias_that_cancels_the_product_keeps_its_digits(level: str, m: int) -> None:
    # A bias added after a bf16 rounding of the sums would keep only their rounding error.
    k, n = 256, 32
    config = kp.quant_config("fp8_weight_only", weight_shape=(n, k), bias=True)
    impl = _bind("cpu_fp8_w8a16_gemm", level, config)
    generator = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=generator)
    bundle = impl.quantize_weights(w)
    x = torch.randn(m, k, generator=generator).to(torch.bfloat16)
    deq = bundle.weight.double() * bundle.scale.double()
    exact = x.double() @ deq.t()
    bias = (-exact[0] + 0.01).to(torch.bfloat16)  # cancels row 0 down to about 0.01
    want = exact + bias.double()
    got = impl.apply(x, bundle, bias).double()
    # One bf16 rounding of the output (the bias's own rounding is inside want), plus what
    # fp32 sums may lose at most: K * 2^-24 of the sum of the products' magnitudes. The
    # failure this catches, a bias added after the sums are rounded to bf16, leaves an
    # error of up to 2^-9 of the cancelled sum, about 10x that.
    sums = 2.0**-24 * k * (x.double().abs() @ deq.abs().t())[0]
    assert bool((got[0] - want[0]).abs().le(2.0**-8 * want[0].abs() + sums).all())


def test_the_build_name_is_per_level_and_hashes_more_than_the_level() -> None:
    name = _build_name("avx2")
    assert name.startswith("kernelpick_cpu_fp8_avx2_")
    assert _build_name("avx2") == name  # stable within a process
    assert _build_name("avx512") != name.replace("avx2", "avx512")  # the flags differ too


def test_each_torch_install_has_its_own_build(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two venvs with the same torch version write their own include paths into a build;
    # sharing one, each would rebuild (and race) the other's.
    name = _build_name("avx2")
    monkeypatch.setattr(torch, "__file__", "/another/venv/site-packages/torch/__init__.py")
    assert _build_name("avx2") != name


def test_a_failed_build_reports_its_cause_again_not_a_missing_library(tmp_path: Path) -> None:
    # In a fresh process whose compiler fails: the second attempt must raise the first error
    # (the compiler's), not torch's "could not load" of a library that was never built.
    code = (
        "from kernelpick.kernels._cpu_build import KernelBuildError, load_ops\n"
        "messages = []\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        load_ops('avx2')\n"
        "    except KernelBuildError as error:\n"
        "        messages.append(str(error))\n"
        "assert len(messages) == 2 and messages[0] == messages[1], messages\n"
    )
    env = {**os.environ, "CXX": "/bin/false", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.slow  # 2-23 s: a fresh process loading a level (longer when it waits on a build)
def test_threads_binding_at_once_register_the_op_once() -> None:
    # In a fresh process: eight threads bind the same level together; a second registration
    # of the fake or the autograd refusal would warn "Overriding a previously registered".
    code = (
        "import threading, warnings\n"
        "import kernelpick as kp\n"
        "from kernelpick.kernels._cpu_gemm import _custom_op\n"
        "warnings.simplefilter('error')\n"
        "barrier = threading.Barrier(8)\n"
        "errors = []\n"
        "def bind():\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        _custom_op('avx2')\n"
        "    except Exception as error:\n"
        "        errors.append(repr(error))\n"
        "threads = [threading.Thread(target=bind) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "assert not errors, errors\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "Overriding" not in run.stderr


@NEEDS_INT8_DOT
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("offset", [-1, 0])
def test_int8_hands_larger_batches_to_int_mm_only_where_the_cpu_has_an_int8_dot(
    level: str, offset: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both routes against the emulation, either side of the level's hand-over (and at 1 and
    # 300 tokens); torch._int_mm counted, so the switch is seen.
    n, k = 96, 2048 + 8
    config = kp.quant_config(
        "int8_per_channel", weight_shape=(n, k), out_dtype="float32", bias=True
    )
    calls: list[int] = []
    int_mm = torch._int_mm

    def counted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(a.shape[0])
        return int_mm(a, b)

    monkeypatch.setattr(torch, "_int_mm", counted)
    plain = caps_at(level)
    # (caps, the hand-over there, or None where _int_mm is never called)
    routes: list[tuple[kp.DeviceCaps, int | None]] = [
        (with_int8_dot(plain), int_mm_from_tokens(level, k)),
    ]
    if level not in VNNI_LEVELS:  # a VNNI level's flags have the int8 dot product
        routes.append((plain, None))
    if "amx_int8" in HOST_ISA:  # _int_mm on AMX tiles: an earlier hand-over
        routes.append((with_flags(plain, "amx_int8"), AMX_INT_MM_FROM_TOKENS))
    for caps, handover in routes:
        for m in (1, (handover or INT_MM_FROM_TOKENS) + offset, 300):
            generator = torch.Generator().manual_seed(m)
            x = torch.randn(m, k, generator=generator)
            w = torch.randn(n, k, generator=generator) * 0.05
            b = torch.randn(n, generator=generator)
            want = emulated(x, w, config, Dtype.FLOAT8_E4M3FN, bias=b)
            impl = kp.bind("cpu_int8_gemm", config, caps)
            calls.clear()
            got = impl.apply(x, impl.quantize_weights(w), b)
            assert_within_bound(got, want)
            called = handover is not None and m >= handover
            assert calls == ([m] if called else []), (m, handover)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [1, 5, 70, 130])
def test_every_int8_weight_byte_sums_exactly_on_every_path(level: str, m: int) -> None:
    # Integer activations with one 127 quantize with scale 1 to themselves, and unit weight
    # scales leave the exact integer sums, under 2^24 here, so fp32 holds them: every
    # weight byte, -128 (which no quantizer writes, but a checkpoint may hold) and 127
    # included, in every position of a step (vpdpbusd reads the weight as w + 128), a
    # partial last step, each path (one token, a few, integer panels past 64 tokens).
    n, k = 21, 256 * 9 + 37
    config = kp.quant_config("int8_per_channel", weight_shape=(n, k), out_dtype="float32")
    impl = _bind("cpu_int8_gemm", level, config)
    generator = torch.Generator().manual_seed(m)
    codes = torch.arange(-128, 128, dtype=torch.int16).repeat(k // 256 + 1)[:k]
    w = torch.stack([codes.roll(3 * r) for r in range(n)]).to(torch.int8)
    x = torch.randint(-8, 9, (m, k), generator=generator, dtype=torch.int16)
    x[:, 5] = 127
    x[0, k - 1] = -127
    bundle = impl.prepare_weights(w.contiguous(), torch.ones(n, 1))
    got = impl.apply(x.float(), bundle)
    want = (x.long() @ w.long().t()).float()
    assert torch.equal(got, want)


def test_each_compiled_w8a8_family_refuses_the_other_ones_activation_format() -> None:
    # Built around bind (whose catalog rules would catch it): int8 activations through the
    # FP8 family, or e4m3fn ones through the int8 family, would be quantized as the wrong
    # format, silently.
    int8 = kp.quant_config("int8_per_channel", weight_shape=(16, 16))
    fp8 = kp.quant_config("fp8_per_channel", weight_shape=(16, 16))
    assert int8.activation is not None
    assert fp8.activation is not None
    mixed = {
        "cpu_int8_gemm": attrs.evolve(int8, activation=fp8.activation),
        "cpu_fp8_gemm": attrs.evolve(fp8, activation=int8.activation),
    }
    for kernel, config in mixed.items():
        spec = kp.default_catalog().kernel(kernel)
        with pytest.raises(kp.InvalidValueError, match="activations quantized"):
            LAUNCHES[kernel].kernel(spec, config, caps_at(LEVELS[0]), torch.device("cpu"))
    assert kp.rules.DynamicActivationScales(set()) == kp.rules.DynamicActivationScales()
