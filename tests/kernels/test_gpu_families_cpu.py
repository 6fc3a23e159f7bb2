"""The GPU-only families (block FP8, MXFP8, int8 ``_int_mm``, block/MX weight-only), checked
on the CPU: the scale layouts against independent constructions, the layouts against
torch's own shape checks on the meta device, the dequantizing fallback's numerics, the
int8 refusal of small M, and the catalog's choices and reasons."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelpick as kp
from kernelpick.core import Dtype, RejectCode, evaluate
from kernelpick.kernels import (
    BlockScaledMM,
    DequantMatmul,
    Int8IntMM,
    Int8IntMMPadded,
    MxScaledMM,
    WeightBundle,
)
from kernelpick.kernels._block_scaled_mm import (
    block_activation_scales,
    block_weight_scales,
    mx_blocked_scales,
    mx_blocked_size,
)
from kernelpick.kernels._canonical import quantize_canonical
from tests.support.emulation import BOUND, emulated, on_cpu, relative_error

E4M3 = Dtype.FLOAT8_E4M3FN
META = torch.device("meta")


def _e8m0(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    bits = torch.randint(0, 255, (rows, cols), generator=torch.Generator().manual_seed(seed))
    return bits.to(torch.uint8).view(torch.float8_e8m0fnu)


# --- scale layouts against independent constructions -----------------------------------------


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 3), (128, 4), (130, 7), (256, 9)])
def test_mx_blocked_scales_put_each_scale_where_cublas_reads_it(rows: int, cols: int) -> None:
    scale = _e8m0(rows, cols)
    got = mx_blocked_scales(scale)
    assert got.dtype == torch.float8_e8m0fnu
    assert got.dim() == 1
    tiles_c = -(-cols // 4)
    assert got.numel() == -(-rows // 128) * 128 * tiles_c * 4 == mx_blocked_size(rows, cols * 32)
    # The cuBLAS block-scaling layout, element by element: 512-byte tiles of 128 rows by 4
    # columns in row-major tile order, row r at (r % 32) * 16 + ((r % 128) // 32) * 4.
    want = [0] * got.numel()
    source = scale.view(torch.uint8).tolist()
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_c + c // 4
            want[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = source[r][c]
    assert got.view(torch.uint8).tolist() == want


@pytest.mark.parametrize("blocks_k", [1, 2, 3, 4, 5, 8])
def test_block_weight_scales_pad_the_k_blocks_to_four(blocks_k: int) -> None:
    scale = torch.rand(3, blocks_k) + 0.5
    got = block_weight_scales(scale)
    padded = -(-blocks_k // 4) * 4
    assert got.shape == (padded, 3)
    assert got.stride() == (1, padded)
    assert torch.equal(got[:blocks_k], scale.t())
    assert not got[blocks_k:].any()
    if padded == blocks_k:  # nothing to pad: a view of the stored scale
        assert got.data_ptr() == scale.data_ptr()


@pytest.mark.parametrize("m", [1, 3, 17])
def test_block_activation_scales_are_outer_dim_major(m: int) -> None:
    scale = torch.rand(m, 5)
    got = block_activation_scales(scale)
    assert got.shape == (m, 5)
    assert got.stride() == (1, m)
    assert torch.equal(got, scale)


# --- the layouts against torch's shape checks (meta device) ----------------------------------


def _meta_block(m: int, n: int, k: int, weight_scale: torch.Tensor) -> torch.Tensor:
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=META)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=META).t()
    scale_a = block_activation_scales(torch.empty(m, k // 128, device=META))
    return F.scaled_mm(
        a, b, scale_a, F.ScalingType.BlockWise1x128,
        weight_scale, F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16,
    )  # fmt: skip


@pytest.mark.parametrize(("m", "n", "k"), [(1, 128, 128), (5, 384, 640), (300, 256, 1152)])
def test_block_scales_pass_torchs_scaled_mm_checks(m: int, n: int, k: int) -> None:
    stored = torch.empty(n // 128, k // 128, device=META)
    assert _meta_block(m, n, k, block_weight_scales(stored)).shape == (m, n)
    if (k // 128) % 4:  # the unpadded transpose is what pytorch#166752 found silently wrong
        with pytest.raises(RuntimeError, match="128x128"):
            _meta_block(m, n, k, stored.t())


@pytest.mark.parametrize(("m", "n", "k"), [(1, 32, 32), (5, 48, 96), (300, 256, 160)])
def test_mx_scales_pass_torchs_scaled_mm_checks(m: int, n: int, k: int) -> None:
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=META)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=META).t()

    def run(scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
        swizzle = F.SwizzleType.SWIZZLE_32_4_4
        return F.scaled_mm(
            a, b, scale_a, F.ScalingType.BlockWise1x32, scale_b, F.ScalingType.BlockWise1x32,
            swizzle_a=swizzle, swizzle_b=swizzle, output_dtype=torch.bfloat16,
        )  # fmt: skip

    groups = -(-k // 32)
    grid_a = torch.empty(m, groups, dtype=torch.float8_e8m0fnu, device=META)
    grid_b = torch.empty(n, groups, dtype=torch.float8_e8m0fnu, device=META)
    assert run(mx_blocked_scales(grid_a), mx_blocked_scales(grid_b)).shape == (m, n)
    with pytest.raises(RuntimeError, match="MX scaling"):  # the canonical grid is refused
        run(grid_a.reshape(-1), grid_b.reshape(-1))


def _meta_run(
    family: type[BlockScaledMM | MxScaledMM], scheme: str, m: int, n: int, k: int, bias: bool
) -> torch.Tensor:
    """The family's own forward on meta tensors: its quantizer, its scale arrangement and
    its scaled_mm call, which torch's meta registration checks."""
    config = kp.quant_config(scheme, weight_shape=(n, k), bias=bias)
    spec = kp.default_catalog().kernel(
        "cuda_block_scaled_mm" if family is BlockScaledMM else "cuda_mxfp8_scaled_mm"
    )
    kernel = family(spec, config, torch.device("cuda"), E4M3)
    weight = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=META)
    grid = torch.empty(config.weight_scale_shape, dtype=torch.float32, device=META)
    if family is MxScaledMM:
        grid = grid.to(torch.float8_e8m0fnu)
    bundle = WeightBundle(weight.t(), kernel._arrange_scales(grid))
    assert tuple(bundle.scale.shape) == kernel._bundle_form[2]  # what apply checks bundles against
    x = torch.empty(m, k, dtype=torch.bfloat16, device=META)
    b = torch.empty(n, dtype=torch.bfloat16, device=META) if bias else None
    return kernel._matmul(x, bundle, b)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 256, 640), (17, 128, 512)])
def test_block_family_forward_passes_torchs_checks(m: int, n: int, k: int, bias: bool) -> None:
    out = _meta_run(BlockScaledMM, "fp8_block", m, n, k, bias)
    assert out.shape == (m, n)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 96), (130, 256, 512)])
def test_mx_family_forward_passes_torchs_checks(m: int, n: int, k: int, bias: bool) -> None:
    out = _meta_run(MxScaledMM, "mxfp8", m, n, k, bias)
    assert out.shape == (m, n)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kernel", "scheme", "shape"),
    [
        ("cuda_block_scaled_mm", "fp8_block", (256, 640)),
        ("cuda_mxfp8_scaled_mm", "mxfp8", (64, 96)),
    ],
)
def test_prepare_weights_arranges_the_scales_once(
    kernel: str, scheme: str, shape: tuple[int, int]
) -> None:
    config = kp.quant_config(scheme, weight_shape=shape)
    impl = on_cpu(kernel, config, kp.device_profile("h100"))
    weight, scale = quantize_canonical(torch.randn(*shape), config)
    bundle = impl.prepare_weights(weight, scale)
    assert bundle.weight.data_ptr() == weight.data_ptr()  # the weight is not copied
    assert tuple(bundle.scale.shape) == impl._bundle_form[2]
    if kernel == "cuda_block_scaled_mm":
        assert torch.equal(bundle.scale, block_weight_scales(scale))
    else:
        want = mx_blocked_scales(scale)
        assert torch.equal(bundle.scale.view(torch.uint8), want.view(torch.uint8))


# --- the weight-only fallback on block and MX weights ----------------------------------------


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        ("fp8_block", (200, 320)),
        ("fp8_block", (128, 129)),  # K = 128 would be one group a row: per-token, refused
        ("mxfp8", (96, 80)),
        ("mxfp8", (64, 33)),
    ],
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bias", [False, True])
def test_dequant_matmul_runs_block_and_mx_weights(
    scheme: str, shape: tuple[int, int], dtype: str, bias: bool
) -> None:
    config = kp.quant_config(scheme, weight_shape=shape, out_dtype=dtype, bias=bias)
    spec = kp.default_catalog().kernel("cuda_w8a16_torch")
    impl = DequantMatmul(spec, config, torch.device("cpu"), E4M3)
    generator = torch.Generator().manual_seed(3)
    w = torch.randn(*shape, generator=generator) * 0.05
    x = torch.randn(7, shape[1], generator=generator).to(getattr(torch, dtype))
    b = torch.randn(shape[0], generator=generator).to(x.dtype) if bias else None
    got = impl.apply(x, impl.quantize_weights(w), b)
    want = emulated(x, w, config, E4M3, bias=b, weight_only=True).out
    # The matmul runs in the input dtype: a few units of its rounding.
    assert got.dtype == x.dtype
    assert relative_error(got, want) <= 4 * BOUND[dtype]


def test_dequant_matmul_scales_fp16_layers_outside_fp16s_range() -> None:
    # Weights near 2^-19 get E8M0 scales near 2^-27, below fp16's least subnormal (2^-24):
    # cast to fp16 first they would be 0 and so would every output. Scaled in fp32, the
    # weights land in fp16's subnormals with a few bits each, so the bound is loose.
    config = kp.quant_config("mxfp8", weight_shape=(32, 64), out_dtype="float16")
    spec = kp.default_catalog().kernel("cuda_w8a16_torch")
    impl = DequantMatmul(spec, config, torch.device("cpu"), E4M3)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(4)) * 2.0**-19
    _, scale = quantize_canonical(w, config)
    assert scale.float().max() < 2.0**-24
    x = torch.ones(2, 64, dtype=torch.float16) * 2.0**10
    got = impl.apply(x, impl.quantize_weights(w))
    assert torch.isfinite(got).all()
    assert relative_error(got, emulated(x, w, config, E4M3, weight_only=True).out) < 0.05


# --- int8: the GPU's floor on M, said before torch says it -----------------------------------


def test_int8_on_a_gpu_refuses_sixteen_rows_or_fewer_by_name() -> None:
    config = kp.quant_config("int8_per_channel", weight_shape=(32, 64), min_tokens=17)
    spec = kp.default_catalog().kernel("cuda_int8_int_mm")
    # Bound to a GPU device (no GPU is needed to hold the name); the bundle is made by hand
    # on the CPU, so the check that runs before any launch is what is tested.
    impl = Int8IntMM(spec, config, torch.device("cuda"), E4M3)
    weight, scale = quantize_canonical(torch.randn(32, 64), config)
    bundle = WeightBundle(weight.t(), scale)
    for m in (1, 16):
        with pytest.raises(kp.KernelInputError, match=rf"M > 16, got M={m}.*MinTokens\(17\)"):
            impl.apply(torch.randn(m, 64).to(torch.bfloat16), bundle)


@pytest.mark.parametrize("m", [1, 5, 16, 17, 40])
def test_int8_padded_serves_decode_rows_with_the_unpadded_numbers(m: int) -> None:
    # Bound to a GPU device name with CPU tensors: _int_mm runs on the CPU, and what is
    # checked is the padding (17 rows in, the first M out), not cuBLASLt.
    config = kp.quant_config("int8_per_channel", weight_shape=(48, 64), out_dtype="float32")
    spec = kp.default_catalog().kernel("cuda_int8_int_mm_padded")
    impl = Int8IntMMPadded(spec, config, torch.device("cuda"), E4M3)
    weight, scale = quantize_canonical(torch.randn(48, 64), config)
    bundle = WeightBundle(weight.t(), scale)
    x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m))
    calls: list[int] = []
    real = torch._int_mm

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(a.shape[0])
        return real(a, b)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "_int_mm", spy)
        got = impl.apply(x, bundle)
    assert calls == [max(m, 17)]
    cpu = on_cpu("cpu_int8_int_mm", config, kp.device_profile("cpu"))
    assert torch.equal(got, cpu.apply(x, cpu.prepare_weights(weight, scale)))


@pytest.mark.parametrize(("n", "k"), [(32, 64), (2, 1)])  # K=1: the (1, 1)-strided view
def test_int8_on_the_cpu_takes_any_m(n: int, k: int) -> None:
    config = kp.quant_config("int8_per_channel", weight_shape=(n, k), out_dtype="float32")
    impl = on_cpu("cpu_int8_int_mm", config, kp.device_profile("cpu"))
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(5))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(6))
    got = impl.apply(x, impl.quantize_weights(w))
    assert relative_error(got, emulated(x, w, config, E4M3).out) <= BOUND["float32"]


# --- the catalog's choices and reasons -------------------------------------------------------


def _verdict(caps: kp.DeviceCaps, config: kp.QuantConfig, kernel: str) -> set[RejectCode]:
    found = next(v for v in evaluate(caps, config) if v.kernel == kernel)
    return {reason.code for reason in found.reasons}


BLOCK = kp.quant_config("fp8_block", weight_shape=(4096, 4096))
MX = kp.quant_config("mxfp8", weight_shape=(4096, 4096))


@pytest.mark.parametrize(
    ("device", "config", "kernel"),
    [
        ("h100", BLOCK, "cuda_block_scaled_mm"),
        ("h200", BLOCK, "cuda_block_scaled_mm"),
        ("b200", MX, "cuda_mxfp8_scaled_mm"),
        ("rtx5090", MX, "cuda_mxfp8_scaled_mm"),
    ],
)
def test_block_and_mx_configs_select_their_scaled_mm(
    device: str, config: kp.QuantConfig, kernel: str
) -> None:
    decision = kp.choose(kp.device_profile(device), config)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == kernel


def test_the_wrong_sm_or_cuda_is_named() -> None:
    h100, b200 = kp.device_profile("h100"), kp.device_profile("b200")
    assert _verdict(b200, BLOCK, "cuda_block_scaled_mm") == {RejectCode.GPU_ARCH}
    assert _verdict(h100, MX, "cuda_mxfp8_scaled_mm") >= {RejectCode.GPU_ARCH}
    cuda_12_8 = kp.DeviceCaps.cuda("9.0", name="H100", torch_version="2.13", cuda_version="12.8")
    assert _verdict(cuda_12_8, BLOCK, "cuda_block_scaled_mm") == {RejectCode.TOOLKIT_VERSION}
    cuda_12_6 = kp.DeviceCaps.cuda("10.0", name="B200", torch_version="2.13", cuda_version="12.6")
    assert _verdict(cuda_12_6, MX, "cuda_mxfp8_scaled_mm") == {RejectCode.TOOLKIT_VERSION}
    torch_2_9 = kp.DeviceCaps.cuda("9.0", name="H100", torch_version="2.9", cuda_version="12.9")
    assert _verdict(torch_2_9, BLOCK, "cuda_block_scaled_mm") == {RejectCode.TORCH_VERSION}
    decision = kp.choose(b200, BLOCK)
    text = decision.render() if isinstance(decision, kp.Rejected) else str(decision.trace)
    assert "SM 9.x with CUDA >= 12.9" in text


def test_block_shapes_off_128_and_int8_decode_are_turned_down() -> None:
    h100 = kp.device_profile("h100")
    off = kp.quant_config("fp8_block", weight_shape=(4096, 4000))
    assert RejectCode.SHAPE_ALIGNMENT in _verdict(h100, off, "cuda_block_scaled_mm")
    decode = kp.quant_config("int8_per_channel", weight_shape=(4096, 4096))
    assert _verdict(h100, decode, "cuda_int8_int_mm") == {RejectCode.TOKEN_COUNT}
    prefill = kp.quant_config("int8_per_channel", weight_shape=(4096, 4096), min_tokens=17)
    decision = kp.choose(h100, prefill)
    assert isinstance(decision, kp.Selected)
    assert decision.kernel == "cuda_int8_int_mm"
