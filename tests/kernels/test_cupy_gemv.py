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

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ

HARNESS = r"""
#include <cstdio>
int main() {
    printf("%.9g %d\n", (double)KP_FP8_DECODE_FOLD, KP_FP8_HW_DECODE);
    for (u32 b = 0; b < 256; ++b) {
        u32 w = b | ((b ^ 0x5Au) << 8) | (((b + 1u) & 0xFFu) << 16) | ((255u - b) << 24);
        u32 e = kp_fp8x4_even(w), o = kp_fp8x4_odd(w);
        printf("%08x %08x %08x %08x\n", kp_f32_to_bits(kp_f16_lo(e)), kp_f32_to_bits(kp_f16_lo(o)),
               kp_f32_to_bits(kp_f16_hi(e)), kp_f32_to_bits(kp_f16_hi(o)));
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
