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
from kernelpick.adapters import LAUNCHES
from kernelpick.core import Dtype, GroupShape, QuantKey
from kernelpick.kernels import KernelBase, RowMajorKernel, WeightBundle

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


def emulate(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: kp.QuantConfig,
    fp8: Dtype,
    *,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
    weight_only: bool = False,
) -> torch.Tensor:
    """The fp32 output of ``config`` for ``x [M, K]`` and a high-precision ``weight [N, K]``.

    ``weight_only`` emulates a W8A16 kernel, which leaves activations unquantized whatever
    the config says (the degraded fallback). ``input_scale`` is a checkpoint's, for
    e4m3fn (range 448): on an e4m3fnuz device (range 224) it applies doubled.
    """
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
    out = x_deq @ w_deq.t()
    return out if bias is None else out + bias.to(torch.float32)


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
