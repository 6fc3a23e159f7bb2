"""``CpuInt4Gemm``: int4 weight-only layers on kernelpick's own CPU kernel
(``_cpu_int4_gemv.cpp``), for bf16 activations on AVX512-BF16.

The prepared weight is the canonical nibbles as bytes (in group order for act-order),
K padded to a multiple of 64 and of the group, and shaped ``[N, units, unit / 2]`` (a
unit: the group, or the padded row where one group spans K), so a bundle of another
grouping is refused by its shape; each group of a row has its
fp32 scale and, where asymmetric, its zero point as the shift ``7 - z`` the kernel reads
each nibble through (see the C++).
"""

from __future__ import annotations

from typing import ClassVar, Protocol, cast

import attrs
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._bundle import WeightBundle
from kernelpick.kernels._cpu_build import levels_within
from kernelpick.kernels._cpu_gemm import best_op, registered_op
from kernelpick.kernels._torch import reject
from kernelpick.kernels._wna16 import IntWeightOnly

__all__ = ["BF16_LEVELS", "CpuInt4Gemm", "int4_op_name"]

# The levels whose build registers the op: those compiled with AVX512-BF16 (vdpbf16ps).
BF16_LEVELS = ("avx512_amx", "avx512_bf16")
_BLOCK = 64  # values of K the op decodes a step
_HALF = 32  # the least group the op reads: half a block


def int4_op_name(level: str) -> str:
    """The op one level's build registers: ``kernelpick::int4_gemm_<level>``."""
    return f"int4_gemm_{level}"


class _Op(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        scales: torch.Tensor,
        shifts: torch.Tensor | None,
        span: int,
    ) -> torch.Tensor: ...


def _fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    shifts: torch.Tensor | None,
    span: int,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def _op(level: str) -> _Op:
    """The op of ``level`` (see ``kernels._cpu_gemm.registered_op``)."""
    return cast(_Op, registered_op(level, int4_op_name(level), _fake, "the CPU int4 GEMM"))


@attrs.frozen
class CpuInt4Gemm(IntWeightOnly):
    """int4 weights, bf16 activations, groups of 32 or a multiple of 64 (or per channel), zero
    points and act-order; built for the best AVX512-BF16 level the device's flags allow,
    when the kernel is bound."""

    FORMATS: ClassVar[frozenset[Dtype]] = frozenset({Dtype.INT4})
    _keeps_zero_points: ClassVar[bool] = True

    level: str = attrs.field(init=False)
    _kernel: _Op = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        levels = [level for level in levels_within(self.isa) if level in BF16_LEVELS]
        if not levels:
            expected = "AVX512-BF16 (avx512_bf16 with AVX-512 F/BW/VL and VBMI)"
            raise InvalidValueError(f"{self.kernel_id} CPU ISA", sorted(self.isa), expected)
        depth = self.config.weight_block[1]
        if depth < self.config.k and depth != _HALF and depth % _BLOCK:
            expected = f"groups of {_HALF} values or a multiple of {_BLOCK}"
            raise InvalidValueError(f"{self.kernel_id} group size", depth, expected)
        level, op = best_op(self.kernel_id, levels, _op)  # built or loaded now, at set-up
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "_kernel", op)

    def _unit(self) -> int:
        # Values of K a row is shaped by: its group (32 or a multiple of 64), or the padded row
        # where one group spans K (per channel, or a group as deep as K).
        depth = self.config.weight_block[1]
        return depth if depth < self.config.k else -(-self.config.k // _BLOCK) * _BLOCK

    def _padded(self) -> int:
        step = max(self._unit(), _BLOCK)
        return -(-self.config.k // step) * step

    def _span(self) -> int:
        # Blocks of 64 values that share one scale and zero point: a group of a multiple
        # of 64, or the whole row; 0 where groups of 32 give a block two.
        unit = self._unit()
        return unit // _BLOCK if unit % _BLOCK == 0 else 0

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        n, padded, unit = self.config.n, self._padded(), self._unit()
        return (torch.uint8, (n, padded // unit, unit // 2)), (torch.float32, (n, padded // unit))

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        order: torch.Tensor | None,
    ) -> WeightBundle:
        n, k = q.shape
        padded = self._padded()
        unsigned = torch.full((n, padded), 8, dtype=torch.uint8, device=q.device)
        unsigned[:, :k] = (q.to(torch.int16) + 8).to(torch.uint8)
        unit = self._unit()
        packed = (unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)).reshape(n, padded // unit, -1)
        # Each unit's scale: its group's (the last group's for a unit past K, where x is
        # zero); one unit, the padded row, where a group spans K.
        depth = self.config.weight_block[1]
        first = torch.arange(0, padded, unit, device=q.device)
        index = (first // depth).clamp(max=scale.shape[1] - 1)
        scales = scale[:, index].contiguous()
        shifts = None if zero is None else (7 - zero.to(torch.int16))[:, index].contiguous()
        return WeightBundle(packed.contiguous(), scales, None, shifts, order)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dtype != torch.bfloat16:  # the catalog row takes bf16 only: exact products
            raise InvalidValueError(f"{self.kernel_id} input dtype", str(x.dtype), "bfloat16")
        shifts = bundle.zero_point
        if shifts is not None and (
            shifts.dtype != torch.int16 or shifts.shape != bundle.scale.shape
        ):
            raise reject(  # zero points another family prepared: not these shifts
                "bundle.zero_point", shifts,
                f"int16 {list(bundle.scale.shape)} shifts, as {self.kernel_id} prepares them",
            )  # fmt: skip
        rows = self._columns(x, bundle).contiguous()
        weight = bundle.weight.view(bundle.weight.shape[0], -1)
        out = self._kernel(rows, weight, bundle.scale, shifts, self._span())
        return self._finish(out, bias)
