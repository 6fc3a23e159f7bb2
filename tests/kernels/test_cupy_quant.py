"""The fused per-token FP8 quantizer's math, checked without a GPU (issue 26, items 2 and 8).

A host C++ harness compiles ``render_fp8_encode`` (the software paths the kernel falls
back to) and runs, per input row, the kernel's own steps: amax by ``kp_nanmax`` of the
loaded |x| (bf16, fp16 or fp32 bits through the kernel's decoders), ``kp_row_scale``,
``kp_recip``, then ``kp_quant2(kp_div_by_scale(...))`` two values at a time. Checked
against ``quantize_per_token`` for e4m3fn and e4m3fnuz: scales bit for bit, bytes equal
(NaN as NaN-ness), on rows that reach every finite FP8 byte, round-half-even ties, the
clamp at +-qmax, subnormal FP8 results and subnormal inputs, zeros, fp16's range and
subnormals, and NaN / inf rows. A sweep checks that ``kp_div_by_scale`` from the
reciprocal is the correctly rounded ``v / s`` bit for bit, signed zeros included.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kernelpick.core import Dtype
from kernelpick.kernels._quantize import quantize_per_token, scale_floor
from tests.support.cuda_host import build_encode_harness

FN, FNUZ = Dtype.FLOAT8_E4M3FN, Dtype.FLOAT8_E4M3FNUZ
KINDS = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}

HARNESS = r"""
static float kp_load(int kind, unsigned b) {
    return kind == 0 ? kp_bf16_to_f32((u16)b) : kind == 1 ? kp_f16_to_f32((u16)b)
                                                          : kp_bits_to_f32(b);
}
int main() {
    char mode;
    while (scanf(" %c", &mode) == 1) {
        int kind, rows, cols, n;
        if (mode == 'q' && scanf("%d %d %d", &kind, &rows, &cols) == 3) {
            std::vector<unsigned> x(cols);
            for (int row = 0; row < rows; ++row) {
                float amax = 0.0f;                      /* the kernel's amax, then scale */
                for (int i = 0; i < cols; ++i) {
                    if (scanf("%x", &x[i]) != 1) return 1;
                    amax = kp_nanmax(amax, fabsf(kp_load(kind, x[i])));
                }
                const float s = kp_row_scale(amax), r = kp_recip(s);
                printf("%08x", kp_f32_to_bits(s));
                for (int i = 0; i < cols; i += 2) {     /* two values a kp_quant2 */
                    float lo = kp_div_by_scale(kp_load(kind, x[i]), r, s);
                    float hi = i + 1 < cols ? kp_div_by_scale(kp_load(kind, x[i + 1]), r, s)
                                            : 0.0f;
                    u16 pair = kp_quant2(lo, hi);
                    printf(" %02x", pair & 0xFFu);
                    if (i + 1 < cols) printf(" %02x", pair >> 8);
                }
                printf("\n");
            }
        } else if (mode == 'd' && scanf("%d", &n) == 1) {
            for (int i = 0; i < n; ++i) {
                unsigned sb, vb;
                if (scanf("%x %x", &sb, &vb) != 2) return 1;
                const float s = kp_bits_to_f32(sb);
                printf("%08x\n", kp_f32_to_bits(kp_div_by_scale(kp_bits_to_f32(vb),
                                                                 kp_recip(s), s)));
            }
        } else return 1;
    }
    return 0;
}
"""


@pytest.fixture(scope="module", params=[FN, FNUZ], ids=lambda d: d.value)
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Dtype, Path]:
    if shutil.which("g++") is None:
        pytest.skip("needs a host C++ compiler (g++)")
    folder = tmp_path_factory.mktemp(request.param.value)
    return request.param, build_encode_harness(request.param, HARNESS, folder, "quant")


def _hex(bits: np.ndarray) -> str:
    return " ".join(f"{int(b):08x}" for b in bits.astype(np.uint32).reshape(-1))


def _run(binary: Path, stdin: str) -> list[str]:
    run = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True)
    return run.stdout.strip().split("\n")


def host_quantize(binary: Path, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's steps on the host: (FP8 bytes ``[M, K]`` uint8, fp32 scales ``[M, 1]``)."""
    width = torch.int32 if x.dtype == torch.float32 else torch.int16
    bits = x.contiguous().view(width).numpy().view(np.uint32 if width == torch.int32 else np.uint16)
    lines = _run(binary, f"q {KINDS[x.dtype]} {x.shape[0]} {x.shape[1]}\n{_hex(bits)}\n")
    assert len(lines) == x.shape[0]
    words = [[int(w, 16) for w in line.split()] for line in lines]
    scales = np.array([w[0] for w in words], dtype=np.uint32).view(np.float32)
    codes = np.array([w[1:] for w in words], dtype=np.uint8)
    return torch.from_numpy(codes), torch.from_numpy(scales.copy()).view(-1, 1)


def assert_same(got: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, fp8: Dtype) -> None:
    """Host bytes and scales equal ``quantize_per_token``'s: scales bit for bit (NaN as
    NaN), bytes equal where torch's are not NaN and NaN where torch's are."""
    want, want_scale = quantize_per_token(x, fp8)
    codes, scale = got
    nan = torch.isnan(want_scale)
    assert torch.equal(torch.isnan(scale), nan)
    assert torch.equal(scale[~nan].view(torch.int32), want_scale[~nan].view(torch.int32))
    nan_bytes = torch.isnan(want.float())
    assert torch.equal(torch.isnan(codes.view(want.dtype).float()), nan_bytes)
    assert torch.equal(codes[~nan_bytes], want.view(torch.uint8)[~nan_bytes])


def fp8_grid(fp8: Dtype) -> torch.Tensor:
    """Every finite value of ``fp8``, sorted (-0 and +0 both, for e4m3fn)."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(getattr(torch, fp8.value))
    return torch.sort(values.float()[torch.isfinite(values.float())]).values


def _rows(fp8: Dtype) -> torch.Tensor:
    """fp32 rows (zero padded: zeros change no amax) with every case the kernel must get
    right. Scales come from amaxes whose ``amax / qmax`` is inexact unless said."""
    gen = torch.Generator().manual_seed(26)
    qmax, grid = torch.tensor(fp8.quant_max), fp8_grid(fp8)
    grid = grid[grid.abs() <= qmax]  # e4m3fnuz's +-240 would move the amax
    mids = (grid[1:] + grid[:-1]) / 2
    rows = []
    for amax in (1234.567, 0.0731, 3.3e4, *(torch.rand(3, generator=gen) * 900 + 1).tolist()):
        s = torch.tensor(amax) / qmax
        rows.append(grid * s)  # every finite byte
        rows.append(torch.cat([mids * s, qmax[None] * s]))  # near ties
        nudged = torch.nextafter(mids * s, torch.tensor(float("inf")))
        rows.append(torch.cat([nudged, qmax[None] * s]))
    for exact in (1.0, 2.0**-3):  # exact scales: the midpoints are exact ties
        rows.append(torch.cat([mids * exact, qmax[None] * exact]))
    amaxes = torch.rand(4000, generator=gen) * 5e4 + 1e-2
    down = amaxes[(amaxes / qmax).double() * fp8.quant_max < amaxes.double()][:20]
    for amax in down.tolist():  # amax / qmax rounded down: amax / scale clamps to +-qmax
        rows.append(torch.tensor([amax, -amax, amax / 3]))
    floor = scale_floor(fp8)
    rows.append(grid[grid.abs() < 2 * grid[grid > 0].min() * 8] * floor)  # floor scale
    rows.append(torch.randn(64, generator=gen) * 1e-40)  # fp32 subnormal inputs
    rows.append(torch.cat([torch.tensor([1.0]), torch.randn(63, generator=gen) * 1e-40]))
    rows += [torch.zeros(8), -torch.zeros(8)]  # all zero: the floor scale
    f16_sub = torch.arange(-1023, 1024, 37).float() * 2.0**-24  # fp16 subnormals
    rows.append(torch.cat([torch.tensor([65504.0, -65504.0, 65472.0, 65440.0]), f16_sub]))
    rows.append(f16_sub)
    rows.extend(torch.randn(200, generator=gen) * 10.0**e for e in (-3, 0, 2))
    width = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


@pytest.mark.parametrize("dtype", list(KINDS), ids=str)
def test_the_kernels_row_steps_match_torch_byte_for_byte(
    harness: tuple[Dtype, Path], dtype: torch.dtype
) -> None:
    fp8, binary = harness
    x = _rows(fp8).to(dtype)
    got = host_quantize(binary, x)
    assert_same(got, x, fp8)
    if dtype != torch.float32:
        return
    # The rows did their part: every byte in range, exact ties, the clamp, subnormal inputs.
    every = torch.arange(256).to(torch.uint8).view(getattr(torch, fp8.value))
    finite = every.float().abs() <= fp8.quant_max  # e4m3fnuz's +-240 lie past the clamp
    reached = torch.zeros(256, dtype=torch.bool)
    reached[got[0].reshape(-1).long()] = True
    assert torch.equal(reached & finite, finite)
    q = (x / got[1]).numpy()
    grid = fp8_grid(fp8)
    assert np.isin(q, ((grid[1:] + grid[:-1]) / 2).numpy()).sum() > 100  # exact ties
    assert (np.abs(q) > fp8.quant_max).sum() >= 5
    assert ((x != 0) & (x.abs() < 2.0**-126)).any()


@pytest.mark.parametrize("dtype", list(KINDS), ids=str)
def test_nan_and_inf_rows_give_torchs_nan_bytes_and_scales(
    harness: tuple[Dtype, Path], dtype: torch.dtype
) -> None:
    fp8, binary = harness
    nan, inf = float("nan"), float("inf")
    x = torch.tensor(
        [
            [1.0, -2.0, nan, 3.0, -0.0, 0.5],
            [inf, 1.0, -2.0, 0.0, -0.0, 4.0],
            [-inf, 1.0, -2.0, 0.0, 7.0, inf],
            [inf, nan, 1.0, -1.0, 0.0, 2.0],
            [1.0, -2.0, 3.0, 0.25, 0.0, 5.0],
        ]
    ).to(dtype)
    got = host_quantize(binary, x)
    assert_same(got, x, fp8)
    codes, scale = got
    assert torch.isnan(scale[[0, 3]]).all()
    assert torch.equal(scale[[1, 2]], torch.full((2, 1), inf))
    values = codes.view(getattr(torch, fp8.value)).float()
    assert torch.isnan(values[[0, 3]]).all()
    assert torch.equal(torch.isnan(values[1:3]), torch.isinf(x[1:3].float()))
    finite = torch.isfinite(x[1:3].float())
    assert (values[1:3][finite] == 0).all()
    assert not torch.isnan(values[4]).any()


def _divisions(fp8: Dtype, gen: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scales, values): for each scale, every FP8 value, midpoint and random values up
    to qmax times it, signed zeros, and dividends from 2^-149 (subnormal) to 2^-100."""
    qmax, floor, grid = fp8.quant_max, scale_floor(fp8), fp8_grid(fp8)
    log_scales = torch.rand(150, generator=gen) * (np.log(1e4) - np.log(floor)) + np.log(floor)
    amax_scales = torch.rand(150, generator=gen) * 1e4 / torch.tensor(qmax)
    scales = torch.cat([log_scales.exp(), amax_scales.clamp(min=floor), torch.tensor([floor])])
    scales = torch.cat([scales, torch.rand(20, generator=gen) * 1e4 + floor])
    factors = torch.cat(
        [
            grid,
            (grid[1:] + grid[:-1]) / 2,
            (torch.rand(400, generator=gen) * 2 - 1) * qmax,
            torch.tensor([0.0, -0.0, qmax, -qmax]),
        ]
    )
    v = scales[:, None] * factors[None, :]
    exponents = torch.randint(-149, -100, (len(scales), 32), generator=gen).float()
    tiny = (torch.rand(len(scales), 32, generator=gen) * 4 - 2) * 2.0**exponents
    v = torch.cat([v, tiny], dim=1)
    s = scales[:, None].expand_as(v)
    return s.contiguous().numpy().reshape(-1), v.contiguous().numpy().reshape(-1)


def test_the_division_from_the_reciprocal_is_correctly_rounded(
    harness: tuple[Dtype, Path],
) -> None:
    fp8, binary = harness
    s, v = _divisions(fp8, torch.Generator().manual_seed(8))
    pairs = np.stack([s.view(np.uint32), v.view(np.uint32)], axis=1)
    lines = _run(binary, f"d {len(s)}\n{_hex(pairs)}\n")
    got = np.array([int(h, 16) for h in lines], dtype=np.uint32)
    want = (v / s).astype(np.float32)  # numpy's float32 division: exact IEEE
    # Below about 2^-110 the residual v - q0 * s underflows and the quotient may be 1 ulp
    # off; it is then below 2^-80, far under FP8's least subnormal: the byte is the same.
    tiny = np.abs(v) < 2.0**-100
    bad = np.flatnonzero((got != want.view(np.uint32)) & ~tiny)
    assert bad.size == 0, [(float(s[i]), float(v[i]), hex(got[i])) for i in bad[:5]]
    fp8_torch = getattr(torch, fp8.value)
    near_zero = torch.from_numpy(got[tiny].view(np.float32)).to(fp8_torch).view(torch.uint8)
    assert torch.equal(near_zero, torch.from_numpy(want[tiny]).to(fp8_torch).view(torch.uint8))
    assert (np.signbit(want) & (want == 0)).any()  # -0 was among them
    assert ((v * (1 / s)).astype(np.float32) != want)[~tiny].any()  # v * r alone is not
