"""Both fused FP8 quantizers run whole on the host (tests/support/cuda_host.py), launched
as their ops launch them, against the torch quantizers byte for byte: every load width,
rows with a stride past K, short last groups, NaN and inf, both formats.

What the per-row and per-group steps compute is checked value by value in
test_cupy_quant.py and test_cupy_group_quant.py; this checks the kernels' indexing,
reductions and stores around them. The sm_89+ hardware encode runs on a GPU only (tests/gpu).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from kernelpick.core import Dtype
from kernelpick.kernels._cupy_group_quant import (
    GroupQuantSpec,
    group_quant_launch,
    render_quant_groups,
)
from kernelpick.kernels._cupy_quant import (
    QuantSpec,
    quant_launch,
    quant_vec,
    render_quant_per_token,
)
from kernelpick.kernels._cupy_runtime import Grid
from kernelpick.kernels._quantize import quantize, quantize_per_token
from tests.support.cuda_host import NEEDS_CXX20, build_host_kernel

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ
BF16, FP16, FP32 = Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32

MAIN = r"""
int main(int argc, char** argv) {
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), groups = atoi(argv[3]);
    const long long stride = atoll(argv[4]);
    const kp_dim3 grid{(unsigned)atoi(argv[5]), (unsigned)atoi(argv[6]), 1};
    const kp_dim3 block{(unsigned)atoi(argv[7]), 1, 1};
    const in_t* x = (const in_t*)kp_read(argv[8], (size_t)rows * stride * sizeof(in_t));
    u8* q = (u8*)std::calloc((size_t)rows * cols + 1, 1);
    float* scales = (float*)std::calloc((size_t)rows * groups + 1, 4);
    kp_host_launch(grid, block, [=] { LAUNCH; });
    FILE* f = std::fopen(argv[9], "wb");
    std::fwrite(q, 1, (size_t)rows * cols, f);
    std::fwrite(scales, 4, (size_t)rows * groups, f);
    std::fclose(f);
    return 0;
}
"""
PER_TOKEN = "KERNEL(x, q, scales, rows, cols, stride)"
GROUPS = "KERNEL(x, q, scales, rows, cols, groups, stride)"


def _rows(m: int, k: int, stride: int, dtype: Dtype, seed: int) -> torch.Tensor:
    """``[m, k]`` of a ``[m, stride]`` buffer: magnitudes from 1e-6 to 1e4, with an
    all-zero row, a NaN and an inf where there are rows for them."""
    generator = torch.Generator().manual_seed(seed)
    size = torch.exp(torch.randn(m, stride, generator=generator) * 3)
    data = torch.randn(m, stride, generator=generator) * size
    if m > 3:
        data[0] = 0.0
        data[1, k // 2] = float("nan")
        data[2, min(k - 1, 130)] = float("inf")
    limit = 6e4 if dtype is FP16 else 3e38
    return data.clamp(-limit, limit).to(getattr(torch, dtype.value))[:, :k]


def _run(
    source: str, launch: str, x: torch.Tensor, groups: int, grid: Grid, tmp_path: Path
) -> tuple[torch.Tensor, torch.Tensor]:
    binary = build_host_kernel(source, MAIN.replace("LAUNCH", launch), tmp_path, "quant")
    m, k = x.shape
    stride = x.stride(0)
    buffer = x.as_strided((m, stride), (stride, 1)) if m else x
    (tmp_path / "x").write_bytes(buffer.contiguous().view(torch.uint8).numpy().tobytes())
    dims = [*grid.grid[:2], grid.block[0]]
    args = [m, k, groups, stride, *dims, tmp_path / "x", tmp_path / "out"]
    subprocess.run([str(binary), *map(str, args)], check=True, timeout=120)
    raw = torch.frombuffer(bytearray((tmp_path / "out").read_bytes()), dtype=torch.uint8)
    return raw[: m * k].reshape(m, k), raw[m * k :].clone().view(torch.float32)


def _assert_same(q: torch.Tensor, scales: torch.Tensor, want_q: torch.Tensor,
                 want_scales: torch.Tensor) -> None:  # fmt: skip
    nan = torch.isnan(want_scales)
    assert torch.equal(torch.isnan(scales), nan)
    assert torch.equal(scales[~nan].view(torch.int32), want_scales[~nan].view(torch.int32))
    nan_bytes = torch.isnan(want_q.float())
    assert torch.equal(torch.isnan(q.view(want_q.dtype).float()), nan_bytes)
    assert torch.equal(q[~nan_bytes], want_q.view(torch.uint8)[~nan_bytes])


# (input dtype, format, M, K, row stride): the 16-byte path where rows allow it, else the
# scalar one (an odd K, a row stride past K that breaks 16-byte alignment, fp32).
SHAPES = [
    (BF16, FN, 5, 4224, 4224),
    (FP16, FNUZ, 4, 1000, 1000),
    (BF16, FNUZ, 6, 200, 203),
    (FP32, FN, 4, 300, 300),
    (FP16, FN, 2, 7, 9),
]


@pytest.mark.slow
@NEEDS_CXX20
@pytest.mark.parametrize(("dtype", "fp8", "m", "k", "stride"), SHAPES)
def test_the_per_token_kernel_matches_torch_byte_for_byte(
    dtype: Dtype, fp8: Dtype, m: int, k: int, stride: int, tmp_path: Path
) -> None:
    x = _rows(m, k, stride, dtype, seed=k)
    vec = quant_vec(x.dtype, k, x.stride(0), 256)  # the host buffer is 64-byte aligned
    spec = QuantSpec(dtype, fp8, vec)
    source = render_quant_per_token(spec).replace(spec.name, "KERNEL")
    q, scales = _run(source, PER_TOKEN, x, 1, quant_launch(m, k, vec), tmp_path)
    want_q, want_scales = quantize_per_token(x, fp8)
    _assert_same(q, scales, want_q, want_scales.reshape(-1))


@pytest.mark.slow
@NEEDS_CXX20
@pytest.mark.parametrize(("dtype", "fp8", "m", "k", "stride"), SHAPES)
def test_the_group_kernel_matches_torch_byte_for_byte(
    dtype: Dtype, fp8: Dtype, m: int, k: int, stride: int, tmp_path: Path
) -> None:
    x = _rows(m, k, stride, dtype, seed=k + 1)
    vec = quant_vec(x.dtype, k, x.stride(0), 256)
    spec = GroupQuantSpec(dtype, fp8, vec)
    source = render_quant_groups(spec).replace(spec.name, "KERNEL")
    groups = -(-k // 128)
    q, scales = _run(source, GROUPS, x, groups, group_quant_launch(m, k), tmp_path)
    want_q, want_scales = quantize(x, (1, 128), fp8)
    # The kernel stores scale g of row m at g * M + m: outer-dim-major, as cuBLASLt reads.
    _assert_same(q, scales, want_q, want_scales.t().reshape(-1))
