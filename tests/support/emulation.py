"""An independent fp32 emulation of FP8 linear layers, written for the tests from the
quantization formula in docs/integration.md.

It shares no code with kernelpick.kernels: quantize each operand by the formula,
dequantize, multiply in fp32. Kernels are held to it.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey
from kernelpick.kernels import LAUNCHES, KernelBase, RowMajorKernel, WeightBundle

# Relative Frobenius error allowed against the emulation, by output dtype: fp32 paths differ
# only in summation order; a half-precision output adds one rounding of at most 2^-8 (bf16)
# or 2^-11 (fp16) per element.
BOUND = {"float32": 1e-5, "bfloat16": 2.0**-8 + 1e-5, "float16": 2.0**-11 + 1e-5}

_FP8 = {
    Dtype.FLOAT8_E4M3FN: (torch.float8_e4m3fn, 448.0),
    Dtype.FLOAT8_E4M3FNUZ: (torch.float8_e4m3fnuz, 224.0),
    Dtype.INT8: (torch.int8, 127.0),
}
# The largest power of two at most each format's range: OCP MX v1.0's emax of the element
# format (448 = 1.75 * 2^8, 224 = 1.75 * 2^7).
_EMAX = {Dtype.FLOAT8_E4M3FN: 8, Dtype.FLOAT8_E4M3FNUZ: 7, Dtype.INT8: 6}


def fake_quant(t: torch.Tensor, scale: torch.Tensor, fp8: Dtype) -> torch.Tensor:
    """What a round trip through ``fp8`` (or int8: round half to even) leaves of ``t``
    (fp32) under ``scale``."""
    dtype, limit = _FP8[fp8]
    scaled = torch.clamp(t / scale, min=-limit, max=limit)
    if fp8 is Dtype.INT8:
        scaled = torch.round(scaled)
    return scaled.to(dtype).to(torch.float32) * scale


def dynamic_scale(t: torch.Tensor, per_row: bool, fp8: Dtype) -> torch.Tensor:
    _, limit = _FP8[fp8]
    amax = t.abs().amax(dim=-1, keepdim=True) if per_row else t.abs().max()
    return torch.clamp(amax / limit, min=1.0 / (limit * 512.0))


def _block_fake_quant(
    t: torch.Tensor, rows: int, cols: int, fp8: Dtype, power_of_two: bool
) -> torch.Tensor:
    """Each ``rows x cols`` tile of ``t`` (edge tiles smaller) quantized with its own
    scale: amax / range, or for E8M0 scales 2^(floor(log2(amax)) - emax), in float64."""
    _, limit = _FP8[fp8]
    height, width = t.shape
    grid = (-(-height // rows), -(-width // cols))
    padded = torch.zeros(grid[0] * rows, grid[1] * cols)
    padded[:height, :width] = t
    tiles = padded.view(grid[0], rows, grid[1], cols)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True).double()
    if power_of_two:
        exponent = torch.where(amax > 0, torch.floor(torch.log2(amax)) - _EMAX[fp8], -127.0)
        scale = torch.exp2(exponent.clamp(-127, 127)).float()
    else:
        scale = torch.clamp(amax / limit, min=1.0 / (limit * 512.0)).float()
    deq = fake_quant(tiles, scale, fp8).view(grid[0] * rows, grid[1] * cols)
    return deq[:height, :width]


def _group_fake_quant(
    t: torch.Tensor, key: QuantKey, fp8: Dtype, gemm_weight: bool
) -> torch.Tensor:
    """``t`` through ``key``'s grouping. A weight's group is written over the GEMM's
    ``[K, N]`` operand, so over the stored ``[N, K]`` its rows and columns swap."""
    group = key.scale.group
    rows, cols = (group.cols, group.rows) if gemm_weight else (group.rows, group.cols)
    rows = t.shape[0] if rows == -1 else rows
    cols = t.shape[1] if cols == -1 else cols
    return _block_fake_quant(t, rows, cols, fp8, key.scale.dtype is Dtype.FLOAT8_E8M0FNU)


def _operands(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: kp.QuantConfig,
    fp8: Dtype,
    input_scale: torch.Tensor | None,
    weight_only: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantized fp32 operands ``emulated`` multiplies: activations, weight."""
    xf, wf = x.to(torch.float32), weight.to(torch.float32)
    w_fmt = Dtype.INT8 if config.weight.dtype is Dtype.INT8 else fp8
    w_group = config.weight.scale.group
    if w_group in (GroupShape.PER_CHANNEL, GroupShape.PER_TENSOR) and _fp32(config.weight):
        per_channel = w_group == GroupShape.PER_CHANNEL
        w_deq = fake_quant(wf, dynamic_scale(wf, per_channel, w_fmt), w_fmt)
    else:
        w_deq = _group_fake_quant(wf, config.weight, w_fmt, gemm_weight=True)
    act = config.activation
    if act is None or weight_only:
        x_deq = xf
    elif act.scale.static:
        assert input_scale is not None
        if act.dtype is Dtype.INT8:
            x_deq = fake_quant(xf, input_scale, Dtype.INT8)
        else:
            doubled = fp8 is Dtype.FLOAT8_E4M3FNUZ
            x_deq = fake_quant(xf, input_scale * 2 if doubled else input_scale, fp8)
    else:
        a_fmt = Dtype.INT8 if act.dtype is Dtype.INT8 else fp8
        if act.scale.group in (GroupShape.PER_TOKEN, GroupShape.PER_TENSOR) and _fp32(act):
            per_token = act.scale.group == GroupShape.PER_TOKEN
            x_deq = fake_quant(xf, dynamic_scale(xf, per_token, a_fmt), a_fmt)
        else:
            x_deq = _group_fake_quant(xf, act, a_fmt, gemm_weight=False)
    return x_deq, w_deq


@attrs.frozen
class Emulated:
    """``emulated``'s output and, per element, the magnitude of what it sums:
    ``|x| @ |w|.T + |bias|`` over the dequantized operands, the scale every rounding of a
    sum of those terms is measured against (however much the terms cancel)."""

    out: torch.Tensor
    magnitude: torch.Tensor
    terms: int  # K, and one more with a bias


def emulated(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: kp.QuantConfig,
    fp8: Dtype,
    *,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
    weight_only: bool = False,
) -> Emulated:
    """The fp32 output of ``config`` for ``x [M, K]`` and a high-precision ``weight [N, K]``.

    ``weight_only`` emulates a W8A16 kernel, which leaves activations unquantized whatever
    the config says (the degraded fallback). ``input_scale`` is a checkpoint's, for
    e4m3fn (range 448): on an e4m3fnuz device (range 224) it applies doubled.

    With the output, the magnitude of the terms each output element sums.
    """
    x_deq, w_deq = _operands(x, weight, config, fp8, input_scale, weight_only)
    out, magnitude = x_deq @ w_deq.t(), x_deq.abs() @ w_deq.abs().t()
    if bias is not None:
        out, magnitude = out + bias.float(), magnitude + bias.float().abs()
    return Emulated(out, magnitude, x.shape[1] + (bias is not None))


# Unit roundoff of each output dtype (half an ulp of 1): 2^-24, 2^-8, 2^-11.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# Higham and Mary's probabilistic bound on a sum of K terms in fp32 (SIAM J. Sci. Comput.
# 41(5), 2019, Thm 3.1): |error| <= lambda sqrt(K) 2^-24 sum|terms|, failing with
# probability at most 2 K exp(-lambda^2 / 2), whatever the order of the sum, with rounding
# errors that are independent: at 9, 5e-15 a sum of 1024 terms, 5e-6 across the 10^9 sums
# a run checks at most. Doubled: the kernel's sum and the emulation's, in their own
# orders. The deterministic bound, K 2^-24 a sum, is 3.5x this at K = 1024 and would hide a
# scale off by 1e-3 there. The largest error these tests' draws have shown, at every
# kernel and ISA level, is 0.6 sqrt(K) 2^-24 of the magnitude: 30x below this bound.
_LAMBDA = 9.0


def assert_within_bound(got: torch.Tensor, want: Emulated, *, half_weight: bool = False) -> None:
    """Each element of ``got`` (its dtype the output's) against ``want``:

    ``|got - want| <= 2 lambda sqrt(terms) 2^-24 magnitude + 2 u |want| (+ 2^-25 for fp16)``

    The first term is two fp32 sums of K products and a bias in different orders (the
    kernel's, the emulation's), bounded by the terms' magnitude, not by the output, which
    a bias can all but cancel. The second rounds into a half-precision output (u, its unit
    roundoff), twice where a GEMM writes its sum in bf16 before the scale is applied. An
    fp16 output below 2^-14 is subnormal: half its absolute step of 2^-24 per element.
    ``half_weight``: the kernel rounds the dequantized weight into the output's half
    precision first, each product off by u of itself: u * magnitude more.
    """
    out = str(got.dtype).removeprefix("torch.")
    u = UNIT_ROUNDOFF[out]
    limit = 2 * _LAMBDA * want.terms**0.5 * UNIT_ROUNDOFF["float32"] * want.magnitude
    if out != "float32":
        limit = limit + 2 * u * want.out.abs()
    if half_weight:
        limit = limit + u * want.magnitude
    if out == "float16":
        limit = limit + 2.0**-25
    error = (got.float() - want.out).abs()
    excess = error - limit
    if bool((excess > 0).any()) or not bool(torch.isfinite(error).all()):
        worst = int(torch.nan_to_num(excess, nan=float("inf")).argmax())
        i, j = divmod(worst, error.shape[-1])
        raise AssertionError(
            f"output [{i}, {j}] is off by {float(error.flatten()[worst]):.3g}, over the bound "
            f"{float(limit.flatten()[worst]):.3g} (want {float(want.out.flatten()[worst]):.6g}, "
            f"magnitude of its terms {float(want.magnitude.flatten()[worst]):.3g})"
        )


def _fp32(key: QuantKey) -> bool:
    return key.scale.dtype is Dtype.FLOAT32


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().to(torch.float32), want.detach()
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want).clamp(min=1e-30))


def on_cpu(kernel_id: str, config: kp.QuantConfig, caps: kp.DeviceCaps) -> KernelBase:
    """Any catalog id's family bound to CPU tensors, with ``caps``' traits (e4m3fnuz on
    gfx942): ``bind`` refuses a GPU kernel on the CPU, and these tests want exactly that."""
    spec = kp.default_catalog().kernel(kernel_id)
    return LAUNCHES[kernel_id].kernel(spec, config, caps, torch.device("cpu"))


@attrs.frozen
class DequantThenMatmul(RowMajorKernel):
    """A made-up weight-only family for tests of kernels of one's own: dequantize the
    weight, then an fp32 matmul."""

    KIND: ClassVar[kp.KernelKind] = kp.KernelKind.W8A16

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        weight = bundle.weight.float() * bundle.scale
        out = x.float() @ weight.t()
        return (out if bias is None else out + bias.float()).to(self.out_dtype)
