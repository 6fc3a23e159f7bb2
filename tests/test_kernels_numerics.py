"""Every CPU kernel against the independent fp32 emulation (tests/emulation.py).

Shapes are drawn by hypothesis (M 1..300; K, N multiples of 16 up to 1024, and any shape
for the reference and the compiled kernels), over every scheme each kernel implements,
with and without bias, in every output dtype. The ROCm and CUDA torch kernels share these
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
from kernelpick.adapters import LAUNCHES
from kernelpick.core import FEATURE_CPP_TOOLCHAIN, CpuArch, evaluate
from kernelpick.kernels._base import KernelBase
from kernelpick.kernels._canonical import quantize_weight
from tests.emulation import BOUND, emulate, relative_error

PER_CHANNEL, PER_TENSOR = "fp8_per_channel", "fp8_per_tensor"
STATIC, WEIGHT_ONLY = "fp8_per_tensor_static", "fp8_weight_only"
BLOCK, INT8, MXFP8 = "fp8_block", "int8_per_channel", "mxfp8"
# What each kernel implements (W8A16 kernels take per-tensor and block activation configs
# degraded).
IMPLEMENTS = {
    "cpu_fp8_gemm": (PER_CHANNEL, BLOCK),
    "cpu_fp8_w8a16_gemm": (WEIGHT_ONLY, PER_TENSOR, STATIC, BLOCK),
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
    "cpu_fp8_gemm",
    "cpu_fp8_w8a16_gemm",
    "cpu_dequant_reference",
    "cpu_w8a16_reference",
}
# The compiled kernels, built for the cpu profile's ISA (AVX2+FMA+F16C): run only where this
# host has that ISA and a C++ toolchain (tests/test_cpu_fp8_kernels.py runs every level).
COMPILED = {"cpu_fp8_gemm", "cpu_fp8_w8a16_gemm"}
HOST = kp.probe("cpu")
_PROFILE = kp.device_profile("cpu").arch
HOST_RUNS_COMPILED = (
    isinstance(_PROFILE, CpuArch)
    and isinstance(HOST.arch, CpuArch)
    and _PROFILE.isa <= HOST.arch.isa
    and FEATURE_CPP_TOOLCHAIN in HOST.features
)
CASES = [(kernel, scheme) for kernel, schemes in IMPLEMENTS.items() for scheme in schemes]

aligned = st.integers(1, 64).map(lambda v: v * 16)
any_extent = st.integers(1, 1024)


def _caps(kernel: str) -> kp.DeviceCaps:
    # Without cupy: on CPU tensors the CUDA families quantize with torch ops (the cupy
    # quantizer is checked on a GPU, tests/gpu).
    return attrs.evolve(kp.device_profile(DEVICE[kernel.split("_")[0]]), libraries=frozenset())


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


def _kernel(kernel: str, config: kp.QuantConfig) -> KernelBase:
    if kernel in COMPILED and not HOST_RUNS_COMPILED:
        pytest.skip(f"{kernel} needs an x86 CPU with AVX2+FMA+F16C and a C++ toolchain")
    # Launch.kernel hands the family the profile's ISA flags (the compiled kernels need them).
    return LAUNCHES[kernel].kernel(
        kp.default_catalog().kernel(kernel), config, _caps(kernel), torch.device("cpu")
    )


def _run_case(
    kernel: str, scheme: str, m: int, n: int, k: int, bias: bool, out: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
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
    impl = _kernel(kernel, config)
    fp8_weight, scale = quantize_weight(w, config)
    bundle = impl.prepare_weights(fp8_weight, scale, input_scale)
    got = impl.apply(x, bundle, b)
    assert got.shape == (m, n)
    assert got.dtype == dtype
    assert bool(torch.isfinite(got).all())
    want = emulate(x, w, config, fp8, bias=b, input_scale=input_scale, weight_only=_w8a16(kernel))
    return got, want


def test_the_table_matches_what_the_catalog_accepts() -> None:
    for kernel, scheme in CASES:
        config = kp.quant_config(scheme, weight_shape=(256, 256))
        verdict = next(v for v in evaluate(_caps(kernel), config) if v.kernel == kernel)
        assert verdict.ok, (kernel, scheme, verdict.reasons)
    assert {k for k in LAUNCHES if k.startswith("cpu")} <= set(IMPLEMENTS)


@pytest.mark.parametrize(("kernel", "scheme"), CASES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_kernel_matches_the_fp32_emulation(kernel: str, scheme: str, data: st.DataObject) -> None:
    unaligned = kernel in UNALIGNED_OK
    m = data.draw(st.integers(1, 300), label="M")
    n = data.draw(any_extent if unaligned else aligned, label="N")
    k = data.draw(
        (any_extent if unaligned else aligned).filter(_fallback_k(kernel, scheme)), label="K"
    )
    bias = data.draw(st.booleans(), label="bias")
    out = data.draw(st.sampled_from(_out_dtypes(kernel)), label="out_dtype")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    got, want = _run_case(kernel, scheme, m, n, k, bias, out, seed)
    bound = BOUND[out]
    if kernel.endswith("w8a16_torch") and out != "float32":
        # Dequantizes and multiplies in the activation's own half precision: one rounding of
        # the weight and a half-precision matmul, each about one unit of that precision.
        bound = 4 * BOUND[out]
    # An fp16 output below 2^-14 is subnormal, with an absolute step of 2^-24 rather than
    # a relative one: rounding there costs at most half a step per element.
    slack = 2.0**-25 * (m * n) ** 0.5 if out == "float16" else 0.0
    absolute = float(torch.linalg.norm(got.float() - want))
    limit = bound * float(torch.linalg.norm(want)) + slack
    assert absolute <= limit, f"relative error {relative_error(got, want):.3g} > {bound:.3g}"


def _fallback_k(kernel: str, scheme: str) -> Callable[[int], bool]:
    """The K a kernel serves the scheme at: a W8A16 kernel stands in for 1 x g activation
    groups only while g < K; at g >= K one group is the whole row, per-token, which the
    kind table keeps from every weight-only kernel (tests/test_kind_table.py)."""
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


@pytest.mark.parametrize(("kernel", "scheme"), CASES)
def test_fp8_edge_cases_stay_finite_and_match(kernel: str, scheme: str) -> None:
    n, k = 32, 64 if _fallback_k(kernel, scheme)(64) else 192
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype="float32")
    fp8 = _caps(kernel).fp8_format
    x = _edge_inputs(k)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3))
    w[0] = 0.0  # an all-zero output channel
    w[1, 5] = 1e4  # one outlier in a row
    # A static scale far too small for the data: everything beyond range must clamp.
    input_scale = torch.tensor(1e-3) if scheme == STATIC else None
    impl = _kernel(kernel, config)
    fp8_weight, scale = quantize_weight(w, config)
    assert not bool(torch.isnan(fp8_weight.float()).any())
    got = impl.apply(x, impl.prepare_weights(fp8_weight, scale, input_scale))
    assert bool(torch.isfinite(got).all())
    want = emulate(x, w, config, fp8, input_scale=input_scale, weight_only=_w8a16(kernel))
    assert relative_error(got, want) <= BOUND["float32"]
    assert bool((got[0] == 0).all())  # an all-zero row gives an all-zero output row
