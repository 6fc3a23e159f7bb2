"""The fused 1x128 group FP8 quantizer, checked without a GPU: every specialization
compiles (nvcc), its per-group steps emulated on the host with the very encode helpers it
renders match ``quantize(x, (1, 128), fp8)`` byte for byte, launch geometry, input checks,
and the block FP8 family's routing to it (or to torch ops without cupy).

Its results on a device are tests/gpu/test_cupy_kernels_gpu.py.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import attrs
import pytest
import torch
import torch.nn.functional as F

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import LAUNCHES, Launch, MxScaledMM
from kernelpick.kernels._block_scaled_mm import block_activation_scales, block_weight_scales
from kernelpick.kernels._canonical import quantize_canonical
from kernelpick.kernels._cupy_codecs import render_fp8_encode
from kernelpick.kernels._cupy_group_quant import (
    GroupQuantSpec,
    group_quant_launch,
    group_quant_specializations,
    quantize_groups_cupy,
    render_quant_groups,
)
from kernelpick.kernels._cupy_runtime import Grid
from kernelpick.kernels._quantize import quantize
from tests.support.cuda_host import build_encode_harness

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ


def test_the_specializations_have_unique_names() -> None:
    # Each compiles for sm_75 and sm_90 with the others (tests/kernels/test_cupy_kernels.py).
    specs = group_quant_specializations()
    assert len({spec.name for spec in specs}) == len(specs) == 10


def test_the_kernel_reuses_the_per_token_encode_helpers_and_no_copy_of_them() -> None:
    for spec in group_quant_specializations():
        source = render_quant_groups(spec)
        prefix = render_fp8_encode(spec.fp8)
        assert source.startswith(prefix), spec.name
        kernel = source[len(prefix) :]
        for helper in ("kp_nanmax", "kp_row_scale", "kp_recip", "kp_div_by_scale", "kp_quant2"):
            assert f"{helper}(" in kernel, (spec.name, helper)  # used
            assert f" {helper}(float" not in kernel, (spec.name, helper)  # not defined again
    with pytest.raises(kp.InvalidValueError, match="vec"):
        render_quant_groups(GroupQuantSpec(Dtype.FLOAT32, FN, 8))
    with pytest.raises(kp.InvalidValueError, match="FP8 format"):
        render_quant_groups(GroupQuantSpec(Dtype.BFLOAT16, Dtype.FLOAT8_E5M2, 8))


# The kernel's steps for one row, lane by lane as a block runs them: 16 lanes of 8
# elements (vec 8: lane * 8 + j; vec 1: lane + 16 j), missing elements zero, the lanes'
# amax combined by the same xor butterfly, then the same encode calls.
HARNESS = r"""
int main() {
    int rows, cols, vec;
    if (scanf("%d %d %d", &rows, &cols, &vec) != 3) return 1;
    std::vector<float> x((size_t)rows * cols);
    for (size_t i = 0; i < x.size(); ++i) { unsigned b; scanf("%x", &b); x[i] = kp_bits_to_f32(b); }
    const int groups = (cols + 127) / 128;
    for (int row = 0; row < rows; ++row) {
        const float* xr = &x[(size_t)row * cols];
        std::vector<unsigned> out(cols);
        for (int g = 0; g < groups; ++g) {
            float lanes[16];
            for (int lane = 0; lane < 16; ++lane) {
                float amax = 0.0f;
                for (int j = 0; j < 8; ++j) {
                    int col = vec == 8 ? g * 128 + lane * 8 + j : g * 128 + lane + 16 * j;
                    amax = kp_nanmax(amax, fabsf(col < cols ? xr[col] : 0.0f));
                }
                lanes[lane] = amax;
            }
            for (int offset = 8; offset > 0; offset >>= 1) {
                float next[16];
                for (int l = 0; l < 16; ++l) next[l] = kp_nanmax(lanes[l], lanes[l ^ offset]);
                for (int l = 0; l < 16; ++l) lanes[l] = next[l];
            }
            const float s = kp_row_scale(lanes[0]), r = kp_recip(s);
            printf("%08x ", kp_f32_to_bits(s));
            for (int col = g * 128; col < cols && col < g * 128 + 128; ++col)
                out[col] = kp_quant2(kp_div_by_scale(xr[col], r, s), 0.0f) & 0xFFu;
        }
        printf("|");
        for (int col = 0; col < cols; ++col) printf(" %02x", out[col]);
        printf("\n");
    }
    return 0;
}
"""


def _bits(values: torch.Tensor) -> str:
    return " ".join(f"{struct.unpack('<I', struct.pack('<f', float(v)))[0]:08x}" for v in values)


def _near_ties(cols: int, gen: torch.Generator) -> torch.Tensor:
    """Per group: an amax that makes the scale inexact, then values within 2 ulps of
    ``midpoint * scale`` for random e4m3fn midpoints. Their quotients straddle the
    midpoints, where only a correctly rounded ``v / scale`` gives torch's byte (``v * r``
    alone is 1 ulp off for some, and flips the tie)."""
    codes = torch.arange(0, 126, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    grid = codes.float()
    midpoints = (grid[1:] + grid[:-1]) / 2
    groups = -(-cols // 128)
    amax = torch.rand(groups, 1, generator=gen) * 1000 + 1
    scale = amax / torch.tensor(448.0)
    pick = midpoints[torch.randint(0, len(midpoints), (groups, 128), generator=gen)]
    values = pick * scale
    steps = torch.randint(-2, 3, (groups, 128), generator=gen)
    for _ in range(2):  # up to 2 ulps either way
        up, down = steps > 0, steps < 0
        values = torch.where(up, torch.nextafter(values, torch.tensor(float("inf"))), values)
        values = torch.where(down, torch.nextafter(values, torch.tensor(-float("inf"))), values)
        steps = steps - up.int() + down.int()
    signs = torch.randint(0, 2, (groups, 128), generator=gen) * 2 - 1
    values = values * signs
    values[:, 0] = amax[:, 0]
    return values.reshape(-1)[:cols]


def _rows(cols: int) -> torch.Tensor:
    """Rows that matter: random scales of magnitude, FP8 ties (amax 448: scale 1, and the
    midpoints between e4m3 neighbours), a clamping outlier, subnormal quotients, zeros,
    -0, inf and NaN."""
    gen = torch.Generator().manual_seed(cols)
    rows = [torch.randn(cols, generator=gen) * 10.0 ** float(e) for e in (-30, -3, 0, 2, 30)]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    grid = torch.sort(codes.float()[torch.isfinite(codes.float())]).values
    ties = ((grid[1:] + grid[:-1]) / 2).repeat(-(-cols // 254))[:cols]
    ties[::128] = 448.0  # every group's amax 448: scale exactly 1, so the midpoints tie
    rows.append(ties)
    rows.append(_near_ties(cols, gen))
    outlier = torch.randn(cols, generator=gen)
    outlier[::97] = 3.0e5
    rows.append(outlier)  # most quotients far below FP8's least normal: subnormals and zeros
    rows.append(torch.zeros(cols))
    negative_zero = -torch.zeros(cols)
    negative_zero[::5] = -1.0
    rows.append(negative_zero)
    for special in (float("nan"), float("inf"), float("-inf")):
        row = torch.randn(cols, generator=gen)
        row[cols // 2] = special
        rows.append(row)
    return torch.stack(rows)


@pytest.fixture(scope="module", params=[FN, FNUZ], ids=lambda d: d.value)
def emulator(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Dtype, Path]:
    if shutil.which("g++") is None:
        pytest.skip("needs a host C++ compiler")
    folder = tmp_path_factory.mktemp(request.param.value)
    return request.param, build_encode_harness(request.param, HARNESS, folder, "groups")


@pytest.mark.parametrize("cols", [128, 200, 7, 4224])
@pytest.mark.parametrize("vec", [8, 1])
def test_the_kernels_group_steps_match_torch_byte_for_byte(
    emulator: tuple[Dtype, Path], cols: int, vec: int
) -> None:
    fp8, binary = emulator
    x = _rows(cols)
    stdin = f"{x.shape[0]} {cols} {vec}\n{_bits(x.reshape(-1))}\n"
    run = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True)
    lines = run.stdout.strip().split("\n")
    assert len(lines) == x.shape[0]
    scale_bits, byte_rows = [], []
    for line in lines:
        scales, codes = line.split("|")
        scale_bits.append([int(s, 16) for s in scales.split()])
        byte_rows.append([int(c, 16) for c in codes.split()])
    got_scale = torch.tensor(scale_bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    got = torch.tensor(byte_rows, dtype=torch.int32).to(torch.uint8)
    want, want_scale = quantize(x, (1, 128), fp8)
    assert got_scale.shape == want_scale.shape == (x.shape[0], -(-cols // 128))
    nan = torch.isnan(want_scale)
    assert torch.equal(torch.isnan(got_scale), nan)
    assert nan.any()  # the special rows did their part
    assert torch.isinf(want_scale).any()
    assert torch.equal(got_scale[~nan].view(torch.int32), want_scale[~nan].view(torch.int32))
    want_bytes = want.view(torch.uint8)
    nan_bytes = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.view(want.dtype).float()), nan_bytes)
    assert torch.equal(got[~nan_bytes], want_bytes[~nan_bytes])


def test_launch_geometry_comes_from_pure_helpers() -> None:
    assert group_quant_launch(rows=3, cols=4096) == Grid((3, 2, 1), (256, 1, 1))
    assert group_quant_launch(rows=3, cols=4224) == Grid((3, 3, 1), (256, 1, 1))
    assert group_quant_launch(rows=17, cols=200) == Grid((17, 1, 1), (32, 1, 1))
    assert group_quant_launch(rows=1, cols=7) == Grid((1, 1, 1), (32, 1, 1))
    assert group_quant_launch(rows=2, cols=640) == Grid((2, 1, 1), (96, 1, 1))


def test_inputs_are_checked_before_any_launch() -> None:
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(kp.KernelInputError, match=r"x: .*device cpu; expected a CUDA tensor"):
        quantize_groups_cupy(x, FN)
    with pytest.raises(kp.KernelInputError, match=r"x: .*dtype int32"):
        quantize_groups_cupy(torch.zeros(4, 256, dtype=torch.int32), FN)
    with pytest.raises(kp.KernelInputError, match=r"x: got shape \[4\]"):
        quantize_groups_cupy(torch.zeros(4, dtype=torch.bfloat16), FN)
    with pytest.raises(kp.InvalidValueError, match="group"):
        quantize_groups_cupy(x, FN, group=64)


def test_block_fp8_quantizes_with_the_fused_kernel_and_without_cupy_with_torch() -> None:
    launch = LAUNCHES["cuda_block_scaled_mm"]
    assert launch.fused_quant
    spec = kp.default_catalog().kernel("cuda_block_scaled_mm")
    h100, cpu = kp.device_profile("h100"), torch.device("cpu")
    config = kp.quant_config("fp8_block", weight_shape=(256, 256))
    with_cupy = launch.kernel(spec, config, h100, cpu)
    without = launch.kernel(spec, config, attrs.evolve(h100, libraries=frozenset()), cpu)
    assert with_cupy.fused_quant
    assert not without.fused_quant
    bundle = without.prepare_weights(*quantize_canonical(torch.randn(256, 256), config))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    # Routed to the cupy kernel, which refuses a CPU tensor by name before any launch.
    with pytest.raises(kp.KernelInputError, match="expected a CUDA tensor"):
        with_cupy.quantize_input(x, bundle)
    q, scale = without.quantize_input(x, bundle)
    want, want_scale = quantize(x, (1, 128), FN)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(scale, want_scale)


def test_other_groups_and_e8m0_scales_stay_on_torch_even_with_fused_quant() -> None:
    h100, cpu = kp.device_profile("h100"), torch.device("cpu")
    spec = kp.default_catalog().kernel("cuda_block_scaled_mm")
    config = kp.quant_config("fp8_block", weight_shape=(256, 256), block_size=64)
    kernel = LAUNCHES["cuda_block_scaled_mm"].kernel(spec, config, h100, cpu)
    assert kernel.fused_quant
    bundle = kernel.prepare_weights(*quantize_canonical(torch.randn(256, 256), config))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert kernel.quantize_input(x, bundle)[1].shape == (3, 4)
    mx_spec = kp.default_catalog().kernel("cuda_mxfp8_scaled_mm")
    mx_config = kp.quant_config("mxfp8", weight_shape=(256, 256))
    mx = Launch(MxScaledMM, fused_quant=True).kernel(mx_spec, mx_config, h100, cpu)
    assert mx.fused_quant
    mx_bundle = mx.prepare_weights(*quantize_canonical(torch.randn(256, 256), mx_config))
    assert mx.quantize_input(x, mx_bundle)[1].shape == (3, 8)


@pytest.mark.parametrize("m", [1, 5, 300])
def test_scales_written_outer_dim_major_reach_scaled_mm_without_a_copy(m: int) -> None:
    meta = torch.device("meta")
    k, n = 640, 256
    scale = torch.empty_strided((m, k // 128), (1, m), device=meta)
    assert block_activation_scales(scale) is scale
    contiguous = torch.rand(m, k // 128)
    arranged = block_activation_scales(contiguous)
    assert arranged.stride() == (1, m)
    assert arranged.data_ptr() != contiguous.data_ptr()
    assert torch.equal(arranged, contiguous)
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=meta)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=meta).t()
    weight_scale = block_weight_scales(torch.empty(n // 128, k // 128, device=meta))
    out = F.scaled_mm(
        a, b, scale, F.ScalingType.BlockWise1x128,
        weight_scale, F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16,
    )  # fmt: skip
    assert out.shape == (m, n)
