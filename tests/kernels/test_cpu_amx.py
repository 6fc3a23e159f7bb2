"""The avx512_amx build's own paths: FP8 weights on AMX tiles, and activations bf16 does not
hold (fp32, fp16) split into exact bf16 planes for them. The shared numerics tables
(test_kernels_numerics.py) run this level too; these are its edge cases, each against the
avx512 build's fp32 tiles and panels on the same bytes, where it runs."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.kernels import KernelBase
from tests.support.cpu_levels import caps_at, skip_unless_runs
from tests.support.emulation import assert_within_bound, emulated

pytestmark = [skip_unless_runs("avx512_amx"), skip_unless_runs("avx512")]

# From 8 to 64 tokens (kSplitFrom, kSplitTokens in _cpu_bf16_amx.h) the fp32 and fp16
# activations of a weight-only layer go to the AMX tiles as bf16 planes; the checks run
# either side of both ends and across a block of 32 tokens.
TOKENS = [7, 8, 33, 64, 65]


def _pair(scheme: str, n: int, k: int, dtype: str) -> tuple[KernelBase, KernelBase]:
    config = kp.quant_config(
        scheme, weight_shape=(n, k), input_dtype=dtype, out_dtype="float32", bias=False
    )
    amx = kp.bind("cpu_fp8_w8a16_gemm", config, caps_at("avx512_amx"))
    fp32 = kp.bind("cpu_fp8_w8a16_gemm", config, caps_at("avx512"))
    return amx, fp32


@pytest.mark.parametrize("dtype", ["float32", "float16"])
# A W8A16 kernel serves a W8A8 config's weights (fp8_block: 128 x 128 blocks), the
# activations as they come.
@pytest.mark.parametrize("scheme", ["fp8_weight_only", "fp8_block"])
@pytest.mark.parametrize("m", TOKENS)
def test_activations_bf16_cannot_hold_keep_every_digit(dtype: str, scheme: str, m: int) -> None:
    # Values with all 24 (fp32) or 11 (fp16) significant bits set: one bf16 plane would
    # lose 2^-9 of each, beyond the bound; the split planes sum to each value exactly.
    n, k = 70, 384 + 64
    generator = torch.Generator().manual_seed(m)
    x = (torch.rand(m, k, generator=generator) + 1.0) * torch.where(
        torch.rand(m, k, generator=generator) < 0.5, -1.0, 1.0
    )
    x = x.to(getattr(torch, dtype))
    w = torch.randn(n, k, generator=generator) * 0.05
    amx, _ = _pair(scheme, n, k, dtype)
    config = amx.config
    got = amx.apply(x, amx.quantize_weights(w))
    assert_within_bound(got, emulated(x, w, config, Dtype.FLOAT8_E4M3FN, weight_only=True))


@pytest.mark.parametrize("m", [8, 33, 64])  # rows 0-4 hold the special values
def test_infinities_nans_and_the_largest_values_come_out_as_on_fp32_tiles(m: int) -> None:
    # An infinity stays whole in the first plane (inf - inf would make the others NaN); a
    # NaN whose payload lies in its low bits, whose top half reads as an infinity, stays a
    # NaN; a value past bf16's largest, which bf16 rounds to infinity, is truncated (its
    # weights small enough for the products to be finite).
    n, k = 40, 256
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=generator)
    x[0, 3] = float("inf")
    x[1, 5] = -float("inf")
    x.view(torch.int32)[2, 7] = 0x7F800001  # as bits: a Python float would make it quiet
    x[3, :] = 0.0
    big = torch.finfo(torch.float32).max * 0.999  # over 3.3895e38, bf16's largest
    x[3, 9], x[4, 9] = big, -big
    w = torch.randn(n, k, generator=generator) * 0.05
    w[:, 9] = w.abs().amax(dim=1) * 0.002  # e4m3 about 0.9 times the channel's scale
    w[::5, 3] = 0.0  # inf x 0: NaN, as in an fp32 GEMM
    amx, fp32 = _pair("fp8_weight_only", n, k, "float32")
    bundle = amx.quantize_weights(w)
    got = amx.apply(x, bundle)
    want = fp32.apply(x, bundle)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got[got.isinf()], want[want.isinf()])
    assert got[2].isnan().all()
    assert got[3].isfinite().all()
    assert got[4].isfinite().all()
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=1e-5)
