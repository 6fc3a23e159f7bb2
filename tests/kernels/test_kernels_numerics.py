"""Every CPU kernel against the independent fp32 emulation (tests/support/emulation.py).

Shapes are drawn by hypothesis (M 1..300; K, N multiples of 16 up to 1024, and any shape
for the reference and the compiled kernels), over every scheme each kernel implements,
with and without bias, in every output dtype, the compiled kernels at every ISA level the
host has; each output element is held to a bound on the rounding of the terms it sums
(tests/support/emulation.py, ``assert_within_bound``). The ROCm and CUDA torch kernels share these
kernel families; the same checks run them on CPU tensors with their own traits (e4m3fnuz
on gfx942).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import evaluate
from kernelpick.kernels import LAUNCHES, IntWeightOnly
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._canonical import quantize_canonical
from kernelpick.kernels._cpu_build import ISA_LEVELS
from tests.support.cpu_levels import NEEDS_INT8_DOT, caps_at, skip_unless_runs, with_int8_dot
from tests.support.emulation import Emulated, assert_within_bound, emulated
from tests.support.torch_cpu import skip_where_fnuz_is_refused

PER_CHANNEL, PER_TENSOR = "fp8_per_channel", "fp8_per_tensor"
STATIC, WEIGHT_ONLY = "fp8_per_tensor_static", "fp8_weight_only"
BLOCK, INT8, MXFP8 = "fp8_block", "int8_per_channel", "mxfp8"
# What each kernel implements (W8A16 kernels take per-tensor and block activation configs
# degraded).
IMPLEMENTS = {
    "cpu_fp8_gemm": (PER_CHANNEL, BLOCK, PER_TENSOR, STATIC),
    "cpu_fp8_w8a16_gemm": (WEIGHT_ONLY, PER_TENSOR, STATIC, BLOCK),
    "cpu_int8_gemm": (INT8,),
    "cpu_int8_int_mm": (INT8,),
    "cpu_rowwise_scaled_mm": (PER_CHANNEL,),
    "cpu_tensorwise_scaled_mm": (PER_TENSOR, STATIC),
    "cpu_dequant_reference": (PER_CHANNEL, PER_TENSOR, STATIC, BLOCK, INT8, MXFP8),
    "cpu_w8a16_reference": (WEIGHT_ONLY, PER_TENSOR, STATIC, BLOCK, MXFP8),
    "rocm_rowwise_scaled_mm": (PER_CHANNEL,),
    "rocm_tensorwise_scaled_mm": (PER_TENSOR, STATIC),
    "rocm_channelwise_unfused": (PER_CHANNEL,),
    "rocm_w8a16_torch": (WEIGHT_ONLY, PER_TENSOR, STATIC, BLOCK),
    "cuda_rowwise_scaled_mm": (PER_CHANNEL,),
    "cuda_tensorwise_scaled_mm": (PER_TENSOR, STATIC),
    "cuda_channelwise_unfused": (PER_CHANNEL,),
    "cuda_w8a16_torch": (WEIGHT_ONLY, PER_TENSOR, STATIC, BLOCK, MXFP8),
}
DEVICE = {"cpu": "cpu", "rocm": "mi300x", "cuda": "h100"}
UNALIGNED_OK = {
    "cpu_int8_int_mm",
    "cpu_int8_gemm",
    "cpu_fp8_gemm",
    "cpu_fp8_w8a16_gemm",
    "cpu_dequant_reference",
    "cpu_w8a16_reference",
}
# The compiled kernels run at every ISA level (the build each level's flags select), each
# where this host has that level and a C++ toolchain: AVX2 everywhere, so an AVX2-only CPU's
# numerics are also those of the host that runs the suite.
COMPILED = {"cpu_fp8_gemm", "cpu_fp8_w8a16_gemm", "cpu_int8_gemm"}
CASES = [(kernel, scheme) for kernel, schemes in IMPLEMENTS.items() for scheme in schemes]


def _marks(kernel: str) -> list[pytest.MarkDecorator]:
    # The ROCm families run here on e4m3fnuz CPU tensors, which some torch CPU ops refuse.
    if kernel == "cpu_int8_int_mm":
        return [NEEDS_INT8_DOT]
    fp8 = kp.device_profile(DEVICE[kernel.split("_")[0]]).fp8_format
    return [skip_where_fnuz_is_refused(kernel, fp8)]


# Each case with its ISA level: every level for a compiled kernel, else None.
LEVEL_CASES = [
    pytest.param(
        kernel, scheme, level, marks=skip_unless_runs(level), id=f"{kernel}-{scheme}-{level}"
    )
    for kernel, scheme in CASES
    if kernel in COMPILED
    for level in ISA_LEVELS
] + [
    pytest.param(
        kernel, scheme, None, id=f"{kernel}-{scheme}",
        marks=_marks(kernel),
    )
    for kernel, scheme in CASES
    if kernel not in COMPILED
]  # fmt: skip

aligned = st.integers(1, 64).map(lambda v: v * 16)
any_extent = st.integers(1, 1024)


def _caps(kernel: str) -> kp.DeviceCaps:
    # Without cupy: on CPU tensors the CUDA families quantize with torch ops (the cupy
    # quantizer is checked on a GPU, tests/gpu).
    caps = attrs.evolve(kp.device_profile(DEVICE[kernel.split("_")[0]]), libraries=frozenset())
    return with_int8_dot(caps) if kernel == "cpu_int8_int_mm" else caps


def _out_dtypes(kernel: str) -> list[str]:
    """The output dtypes the catalog says the kernel writes."""
    caps = _caps(kernel)
    names = ["float32", "bfloat16", "float16"]
    ok = []
    for name in names:
        config = kp.quant_config(IMPLEMENTS[kernel][0], weight_shape=(16, 16), out_dtype=name)
        verdict = next(v for v in evaluate(caps, config) if v.kernel == kernel)
        codes = {r.code for r in verdict.reasons}
        if kp.RejectCode.OUT_DTYPE not in codes and kp.RejectCode.INPUT_DTYPE not in codes:
            ok.append(name)
    return ok


def _w8a16(kernel: str) -> bool:
    return kp.default_catalog().kernel(kernel).kind is kp.KernelKind.W8A16


def _kernel(kernel: str, config: kp.QuantConfig, level: str | None) -> KernelBase:
    # Launch.kernel hands the family the caps' ISA flags: a compiled kernel builds the level
    # they select.
    caps = _caps(kernel) if level is None else caps_at(level)
    return LAUNCHES[kernel].kernel(
        kp.default_catalog().kernel(kernel), config, caps, torch.device("cpu")
    )


def _run_case(
    kernel: str, scheme: str, level: str | None, m: int, n: int, k: int, bias: bool, out: str,
    seed: int,
) -> tuple[torch.Tensor, Emulated]:  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype=out, bias=bias)
    fp8 = _caps(kernel).fp8_format
    dtype = getattr(torch, out)
    x = torch.randn(m, k, generator=generator).to(dtype)
    w = torch.randn(n, k, generator=generator) * 0.05
    b = torch.randn(n, generator=generator).to(dtype) if bias else None
    input_scale = None
    if scheme == STATIC:
        # Between a quarter and twice the range the data needs, so some values clip.
        ratio = float(torch.empty(()).uniform_(0.25, 2.0, generator=generator))
        input_scale = (x.float().abs().max() / 448.0 * ratio).reshape(())  # for e4m3fn
    impl = _kernel(kernel, config, level)
    fp8_weight, scale = quantize_canonical(w, config)
    bundle = impl.prepare_weights(fp8_weight, scale, input_scale)
    got = impl.apply(x, bundle, b)
    assert got.shape == (m, n)
    assert got.dtype == dtype
    assert bool(torch.isfinite(got).all())
    want = emulated(x, w, config, fp8, bias=b, input_scale=input_scale, weight_only=_w8a16(kernel))
    return got, want


def test_the_table_matches_what_the_catalog_accepts() -> None:
    for kernel, scheme in CASES:
        config = kp.quant_config(scheme, weight_shape=(256, 256))
        verdict = next(v for v in evaluate(_caps(kernel), config) if v.kernel == kernel)
        assert verdict.ok, (kernel, scheme, verdict.reasons)
    # The integer weight-only families have their own table (test_wna16_kernels.py).
    fp8_or_w8a8 = {
        k
        for k in LAUNCHES
        if k.startswith("cpu") and not issubclass(LAUNCHES[k].family, IntWeightOnly)
    }
    assert fp8_or_w8a8 <= set(IMPLEMENTS)


@pytest.mark.parametrize(("kernel", "scheme", "level"), LEVEL_CASES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_kernel_matches_the_fp32_emulation(
    kernel: str, scheme: str, level: str | None, data: st.DataObject
) -> None:
    unaligned = kernel in UNALIGNED_OK
    m = data.draw(st.integers(1, 300), label="M")
    n = data.draw(any_extent if unaligned else aligned, label="N")
    k = data.draw(
        (any_extent if unaligned else aligned).filter(_fallback_k(kernel, scheme)), label="K"
    )
    bias = data.draw(st.booleans(), label="bias")
    out = data.draw(st.sampled_from(_out_dtypes(kernel)), label="out_dtype")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    got, want = _run_case(kernel, scheme, level, m, n, k, bias, out, seed)
    # The torch W8A16 families dequantize the weight into the activation's half precision.
    assert_within_bound(got, want, half_weight=kernel.endswith("w8a16_torch"))


@pytest.mark.parametrize(
    ("kernel", "scheme", "level"), [p for p in LEVEL_CASES if p.values[0] in COMPILED]
)
def test_a_bias_that_cancels_the_sum_leaves_only_its_rounding(
    kernel: str, scheme: str, level: str
) -> None:
    # The bias is minus the emulated sum, so the emulation's output is exactly 0 and the
    # kernel's is the rounding of its own sum in its own order: a few units of 2^-24 of the
    # terms' magnitude, and none of an output that is not there. (On an AVX2 CPU a drawn
    # case like this one failed a bound relative to the output.)
    n, k = 16, 1008
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype="float32", bias=True)
    fp8 = _caps(kernel).fp8_format
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, k, generator=generator)
    w = torch.randn(n, k, generator=generator) * 0.05
    input_scale = (x.abs().max() / 448.0).reshape(()) if scheme == STATIC else None
    weight_only = _w8a16(kernel)
    bias = -emulated(x, w, config, fp8, input_scale=input_scale, weight_only=weight_only).out[0]
    impl = _kernel(kernel, config, level)
    bundle = impl.prepare_weights(*quantize_canonical(w, config), input_scale)
    got = impl.apply(x, bundle, bias)
    want = emulated(x, w, config, fp8, bias=bias, input_scale=input_scale, weight_only=weight_only)
    assert bool((want.out == 0).all())
    assert_within_bound(got, want)


def _fallback_k(kernel: str, scheme: str) -> Callable[[int], bool]:
    """The K a kernel serves the scheme at: a W8A16 kernel stands in for 1 x g activation
    groups only while g < K; at g >= K one group is the whole row, per-token, which the
    kind table keeps from every weight-only kernel (tests/core/test_kind_table.py)."""
    group = {BLOCK: 128, MXFP8: 32}.get(scheme)
    if group is None or not _w8a16(kernel):
        return lambda k: True
    return lambda k: k > group


def _edge_inputs(k: int) -> torch.Tensor:
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(7))
    x[0] = 0.0  # an all-zero row
    x[1] = 1e6  # far beyond any FP8 range before scaling
    x[2, 3] = 3e4  # one huge outlier in an ordinary row
    x[3] = -1e-30  # subnormal-small values
    x[4, ::2] = -x[4, ::2] * 1e3
    return x


@pytest.mark.parametrize(("kernel", "scheme", "level"), LEVEL_CASES)
def test_fp8_edge_cases_stay_finite_and_match(kernel: str, scheme: str, level: str | None) -> None:
    n, k = 32, 64 if _fallback_k(kernel, scheme)(64) else 192
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype="float32")
    fp8 = _caps(kernel).fp8_format
    x = _edge_inputs(k)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3))
    w[0] = 0.0  # an all-zero output channel
    w[1, 5] = 1e4  # one outlier in a row
    # A static scale far too small for the data: everything beyond range must clamp.
    input_scale = torch.tensor(1e-3) if scheme == STATIC else None
    impl = _kernel(kernel, config, level)
    fp8_weight, scale = quantize_canonical(w, config)
    assert not bool(torch.isnan(fp8_weight.float()).any())
    got = impl.apply(x, impl.prepare_weights(fp8_weight, scale, input_scale))
    assert bool(torch.isfinite(got).all())
    want = emulated(x, w, config, fp8, input_scale=input_scale, weight_only=_w8a16(kernel))
    assert_within_bound(got, want)
    assert bool((got[0] == 0).all())  # an all-zero row gives an all-zero output row


# Every remainder of the compiled kernels' register tiles (_cpu_fp8_dot.h, kTokens x kRows:
# 6 x 2 on AVX2, 6 x 4 on AVX-512, 4 x 4 with AVX512-BF16): M from 2 past two whole token
# blocks and at the few-token path's end (64), N off every row multiple, and K with a
# partial step of every step width (8, 16 and 64 weights) and past a 128-group. The drawn
# cases above reach these only by chance.
TILE_M = (2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 64)
TILE_NK = ((1, 7), (3, 9), (6, 17), (7, 72), (5, 130), (4, 200))


@pytest.mark.parametrize(
    ("kernel", "scheme", "level"), [p for p in LEVEL_CASES if p.values[0] in COMPILED]
)
def test_every_register_tile_remainder_matches_the_fp32_emulation(
    kernel: str, scheme: str, level: str
) -> None:
    for m in TILE_M:
        for n, k in TILE_NK:
            if not _fallback_k(kernel, scheme)(k):
                continue
            got, want = _run_case(kernel, scheme, level, m, n, k, True, "float32", m * n + k)
            assert_within_bound(got, want)
