"""The W8A16 GEMV's bulk FP8 decode, checked without a GPU: the host rendering of the same
source (the fp16-bits path; the sm_89+ hardware path is guarded by ``__CUDA_ARCH__``)
against torch's casts on every byte of both formats, times the folded power of two."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kernelpick.core import Dtype
from kernelpick.kernels._cupy_codecs import render_fp8_decode
from kernelpick.kernels._cupy_gemv import GemvSpec, gemv_launch, render_gemv
from tests.support.cuda_host import NEEDS_CXX20, build_host_kernel

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ

HARNESS = r"""
#include <cstdio>
int main() {
    printf("%.9g %d\n", (double)KP_FP8_DECODE_FOLD, KP_FP8_HW_DECODE);
    for (u32 b = 0; b < 256; ++b) {
        u32 w = b | ((b ^ 0x5Au) << 8) | (((b + 1u) & 0xFFu) << 16) | ((255u - b) << 24);
        u32 h2[2];
        kp_fp8x4_split(w, h2[0], h2[1]);
        u32 v[4] = {0x7FC00000u, 0x7FC00000u, 0x7FC00000u, 0x7FC00000u};  /* unset: NaN */
        for (int word = 0; word < 2; ++word) {
            v[KP_FP8_LANE(word, 0)] = kp_f32_to_bits(kp_f16_lo(h2[word]));
            v[KP_FP8_LANE(word, 1)] = kp_f32_to_bits(kp_f16_hi(h2[word]));
        }
        printf("%08x %08x %08x %08x\n", v[0], v[1], v[2], v[3]);
    }
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize(("fp8", "fold"), [(FN, 256.0), (FNUZ, 128.0)])
def test_the_bulk_decode_matches_torch_on_every_byte(
    fp8: Dtype, fold: float, tmp_path: Path
) -> None:
    source = tmp_path / "decode.cpp"
    source.write_text(render_fp8_decode(fp8, device=False) + HARNESS)
    binary = tmp_path / "decode"
    subprocess.run(["g++", "-O1", "-o", str(binary), str(source)], check=True)
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    head, *rows = lines.strip().split("\n")
    assert head.split() == [f"{fold:g}", "0"]  # the software path, and its power of two
    got = (
        torch.tensor([[int(h, 16) for h in row.split()] for row in rows], dtype=torch.int64)
        .to(torch.int32)
        .view(torch.float32)
    )
    b = torch.arange(256, dtype=torch.int32)
    words = torch.stack([b, b ^ 0x5A, (b + 1) & 0xFF, 255 - b], dim=1)  # bytes 0..3
    want = words.to(torch.uint8).view(getattr(torch, fp8.value)).float()
    finite = torch.isfinite(want)
    scaled = got * fold
    # Every finite value, -0 and subnormals included, bit for bit (x 2^8 or 2^7 is exact).
    assert torch.equal(scaled[finite].view(torch.int32), want[finite].view(torch.int32))
    # NaN bytes do not decode to NaN here: the accept step refuses them before a launch.
    assert not torch.isnan(scaled).any()
    if fp8 is FN:
        assert float(scaled[0x7F, 0]) == 480.0
        assert scaled[0x80, 0].view(torch.int32) == torch.tensor(-0.0).view(torch.int32)


# ---- The whole kernel on the host (tests/support/cuda_host.py) ----

GEMV_MAIN = r"""
int main(int argc, char** argv) {
    const int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
    const int per_channel = atoi(argv[4]), has_bias = atoi(argv[5]);
    const kp_dim3 grid{(unsigned)atoi(argv[6]), (unsigned)atoi(argv[7]), 1};
    const kp_dim3 block{(unsigned)atoi(argv[8]), 1, 1};
    const size_t out_size = (size_t)atoi(argv[9]);
    const u16* x = (const u16*)kp_read(argv[10], (size_t)M * K * 2);
    const u8* w = (const u8*)kp_read(argv[11], (size_t)N * K);
    const float* scale = (const float*)kp_read(argv[12], (per_channel ? N : 1) * 4);
    const float* bias = (const float*)kp_read(argv[13], (size_t)N * 4);
    out_t* y = (out_t*)std::aligned_alloc(64, (size_t)M * N * out_size + 64);
    kp_host_launch(grid, block, [=] {
        KERNEL(x, w, scale, per_channel, bias, has_bias, y, M, N, K);
    });
    FILE* f = std::fopen(argv[14], "wb");
    std::fwrite(y, out_size, (size_t)M * N, f);
    std::fclose(f);
    return 0;
}
"""

BF16, FP16, FP32 = Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32
# (spec, shapes (M, N, K)): every vec and m_tile, each input and output dtype and both
# formats; K past one chunk (32 * vec * 2) and not a multiple of it, N not a multiple of a
# block's channels, M below, at and past m_tile.
HOST_CASES = [
    (GemvSpec(BF16, BF16, FN, 16, 1), [(1, 40, 2048 + 160), (1, 3, 16)]),
    (GemvSpec(FP16, FP32, FNUZ, 16, 8), [(3, 24, 1056), (17, 9, 32)]),
    (GemvSpec(FP16, FP16, FN, 4, 8), [(8, 13, 300), (9, 16, 4)]),
    (GemvSpec(BF16, FP32, FN, 1, 1), [(1, 11, 131)]),
    (GemvSpec(BF16, BF16, FNUZ, 1, 8), [(5, 7, 67)]),
]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _run_on_host(
    binary: Path, spec: GemvSpec, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
    bias: torch.Tensor | None, directory: Path,
) -> torch.Tensor:  # fmt: skip
    m, k = x.shape
    n = w.shape[0]
    out = getattr(torch, spec.out_dtype.value)
    files = {"x": x, "w": w.view(torch.uint8), "scale": scale.float(),
             "bias": torch.zeros(n) if bias is None else bias.float()}  # fmt: skip
    for key, tensor in files.items():
        (directory / key).write_bytes(_bits(tensor))
    grid = gemv_launch(m, n, spec)
    size = torch.empty((), dtype=out).element_size()
    args = [m, n, k, int(scale.numel() == n), int(bias is not None), grid.grid[0], grid.grid[1],
            grid.block[0], size, *(directory / key for key in files), directory / "y"]  # fmt: skip
    subprocess.run([str(binary), *map(str, args)], check=True, timeout=120)
    raw = torch.frombuffer(bytearray((directory / "y").read_bytes()), dtype=torch.uint8)
    return raw.view(out).reshape(m, n)


@pytest.mark.slow
@NEEDS_CXX20
@pytest.mark.parametrize(("spec", "shapes"), HOST_CASES, ids=[s.name for s, _ in HOST_CASES])
def test_the_gemv_kernel_run_on_the_host_matches_the_fp32_product(
    spec: GemvSpec, shapes: list[tuple[int, int, int]], tmp_path: Path
) -> None:
    source = render_gemv(spec).replace(spec.name, "KERNEL")
    binary = build_host_kernel(source, GEMV_MAIN, tmp_path, "gemv")
    generator = torch.Generator().manual_seed(0)
    fp8 = getattr(torch, spec.fp8.value)
    for index, (m, n, k) in enumerate(shapes):
        x = torch.randn(m, k, generator=generator).to(getattr(torch, spec.in_dtype.value))
        # Every byte but NaN's: subnormals, zeros and the extremes all pass through.
        codes = torch.randint(0, 256, (n, k), generator=generator, dtype=torch.int32)
        w = codes.to(torch.uint8).view(fp8)
        w = torch.where(torch.isnan(w.float()), torch.zeros((), dtype=fp8), w)
        per_channel = index % 2 == 0
        scale = torch.rand(n if per_channel else 1, generator=generator) + 0.5
        bias = torch.randn(n, generator=generator) if index == 0 else None
        got = _run_on_host(binary, spec, x, w, scale, bias, tmp_path)
        terms = x.float()[:, None, :] * (w.float() * scale.reshape(-1, 1))[None, :, :]
        want = terms.sum(-1) + (0.0 if bias is None else bias)
        # fp32 sums in another order (K * 2^-23 of the terms' magnitude), then one rounding
        # to the output dtype (half its ulp; 2^-8 covers bf16's).
        bound = terms.abs().sum(-1) * k * 2.0**-23 + want.abs() * 2.0**-8 + 1e-30
        assert got.shape == (m, n)
        error = (got.float() - want).abs()
        assert bool((error <= bound).all()), (m, n, k, float((error / bound).max()))
