"""INT8 W8A8 on ``torch._int_mm``: int8 x int8 with exact int32 sums, then both scales.

The activation is quantized per token (symmetric int8, round half to even), multiplied
with the int8 weight on the device's integer GEMM (cuBLASLt on CUDA, oneDNN on the CPU),
and the int32 sums are scaled in fp32: ``acc * x_scale[M, 1] * w_scale[1, N]``. The sums
are exact, so the only roundings are the quantization and the fp32 epilogue.

The weight goes in as the ``[K, N]`` transpose of the stored ``[N, K]`` (``KernelBase``'s
view): row-major x column-major, the one layout cuBLASLt's int8 kernels take on every SM
(torch's own test skips only the case where neither operand is transposed, pytorch#169961).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from kernelpick.core import INT_MM_MIN_TOKENS, KernelKind
from kernelpick.kernels._base import KernelBase, WeightBundle
from kernelpick.kernels._scaled_mm import apply_scales
from kernelpick.kernels._torch import reject

__all__ = ["INT_MM_MIN_ROWS", "Int8IntMM", "Int8IntMMPadded", "int_mm_weight"]

# The fewest rows torch._int_mm takes on a GPU: the catalog's rule, where its source is.
INT_MM_MIN_ROWS = INT_MM_MIN_TOKENS.minimum


def int_mm_weight(weight: torch.Tensor) -> torch.Tensor:
    """The ``[K, N]`` transpose view of an ``[N, K]`` int8 weight as ``torch._int_mm`` reads
    it right. For K=1 the transpose has strides (1, 1), which torch's CPU _int_mm misreads
    (torch 2.13: K=1, N=2 returns garbage; every other K is exact): the same bytes viewed
    afresh get row-major strides (N, 1); no copy."""
    return weight.view(weight.shape) if weight.shape[0] == 1 else weight


@attrs.frozen
class Int8IntMM(KernelBase):
    """Per-token int8 activations x per-channel (or per-tensor) int8 weights."""

    KIND: ClassVar[KernelKind] = KernelKind.W8A8

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x, bundle)
        acc = self._int_mm(xq, int_mm_weight(bundle.weight)).to(torch.float32)
        return apply_scales(acc, x_scale, bundle.scale, bias, self.out_dtype)

    def _int_mm(self, xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # The CPU's oneDNN GEMM takes any M; the GPU's check would surface as torch's bare
        # RuntimeError, so it is said here with what to do about it. ROCm devices are
        # "cuda" in torch and run the same check.
        m = xq.shape[0]
        if self.device.type == "cuda" and m < INT_MM_MIN_ROWS:
            expected = (
                f"at least {INT_MM_MIN_ROWS} rows (M > 16, got M={m}): torch._int_mm on a GPU "
                f"refuses fewer; {self.kernel_id}'s rule MinTokens({INT_MM_MIN_ROWS}) holds "
                "only for a config whose min_tokens says every call passes that many"
            )
            raise reject("x", xq, expected)
        return torch._int_mm(xq, weight)


@attrs.frozen
class Int8IntMMPadded(Int8IntMM):
    """``Int8IntMM`` for any M on a GPU: a call of 16 rows or fewer (decode) is padded with
    zero rows to 17, the least ``torch._int_mm`` takes there, and the extra rows of the
    result dropped. The GEMM then reads the same weight bytes a 1-row one would, which is
    what a decode step costs."""

    def _int_mm(self, xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        m = xq.shape[0]
        if self.device.type != "cuda" or m >= INT_MM_MIN_ROWS:
            return super()._int_mm(xq, weight)
        padded = xq.new_zeros((INT_MM_MIN_ROWS, xq.shape[1]))
        padded[:m] = xq
        return super()._int_mm(padded, weight)[:m]
