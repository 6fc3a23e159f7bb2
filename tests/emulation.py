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
from kernelpick.core import Dtype, GroupShape
from kernelpick.kernels import KernelBase, RowMajorKernel, WeightBundle

# Relative Frobenius error allowed against the emulation, by output dtype: fp32 paths differ
# only in summation order; a half-precision output adds one rounding of at most 2^-8 (bf16)
# or 2^-11 (fp16) per element.
BOUND = {"float32": 1e-5, "bfloat16": 2.0**-8 + 1e-5, "float16": 2.0**-11 + 1e-5}

_FP8 = {
    Dtype.FLOAT8_E4M3FN: (torch.float8_e4m3fn, 448.0),
    Dtype.FLOAT8_E4M3FNUZ: (torch.float8_e4m3fnuz, 224.0),
}


def fake_quant(t: torch.Tensor, scale: torch.Tensor, fp8: Dtype) -> torch.Tensor:
    """What an FP8 round trip leaves of ``t`` (fp32) under ``scale``."""
    dtype, limit = _FP8[fp8]
    return torch.clamp(t / scale, min=-limit, max=limit).to(dtype).to(torch.float32) * scale


def dynamic_scale(t: torch.Tensor, per_row: bool, fp8: Dtype) -> torch.Tensor:
    _, limit = _FP8[fp8]
    amax = t.abs().amax(dim=-1, keepdim=True) if per_row else t.abs().max()
    return torch.clamp(amax / limit, min=1.0 / (limit * 512.0))


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
    per_channel = config.weight.scale.group == GroupShape.PER_CHANNEL
    w_deq = fake_quant(wf, dynamic_scale(wf, per_channel, fp8), fp8)
    act = config.activation
    if act is None or weight_only:
        x_deq = xf
    elif act.scale.static:
        assert input_scale is not None
        doubled = fp8 is Dtype.FLOAT8_E4M3FNUZ
        x_deq = fake_quant(xf, input_scale * 2 if doubled else input_scale, fp8)
    else:
        per_token = act.scale.group == GroupShape.PER_TOKEN
        x_deq = fake_quant(xf, dynamic_scale(xf, per_token, fp8), fp8)
    out = x_deq @ w_deq.t()
    return out if bias is None else out + bias.to(torch.float32)


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
