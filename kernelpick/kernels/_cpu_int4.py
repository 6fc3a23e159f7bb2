"""``CpuInt4Gemm``: int4 weight-only layers on kernelpick's own CPU kernel
(``_cpu_int4_gemv.cpp``), for bf16 activations on AVX512-BF16.

The prepared weight is the canonical nibbles as bytes (in group order for act-order),
padded to a multiple of 64 values; each 32 values of a row carry one fp32 scale (their
group's). Products of bf16 activations and ``q - 8`` are exact on vdpbf16ps and summed in
fp32; a zero point adds ``-scale * z * sum(x over the group)``, from the prepared
``scale * z`` and the call's group sums, in fp32.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, cast

import attrs
import torch

from kernelpick.core import Dtype, InvalidValueError
from kernelpick.kernels._bundle import WeightBundle
from kernelpick.kernels._cpu_build import KernelBuildError, levels_within
from kernelpick.kernels._cpu_gemm import registered_op
from kernelpick.kernels._wna16 import IntWeightOnly

__all__ = ["BF16_LEVELS", "CpuInt4Gemm", "int4_op_name"]

# The levels whose build registers the op: those compiled with AVX512-BF16 (vdpbf16ps).
BF16_LEVELS = ("avx512_amx", "avx512_bf16")
_BLOCK = 64  # values of K the op decodes a step
_HALF = 32  # values of K per scale the op reads


def int4_op_name(level: str) -> str:
    """The op one level's build registers: ``kernelpick::int4_gemm_<level>``."""
    return f"int4_gemm_{level}"


class _Op(Protocol):
    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, half_scales: torch.Tensor, span: int
    ) -> torch.Tensor: ...


def _fake(
    x: torch.Tensor, weight: torch.Tensor, half_scales: torch.Tensor, span: int
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def _op(level: str) -> _Op:
    """The op of ``level`` (see ``kernels._cpu_gemm.registered_op``)."""
    return cast(_Op, registered_op(level, int4_op_name(level), _fake, "the CPU int4 GEMM"))


@attrs.frozen
class CpuInt4Gemm(IntWeightOnly):
    """int4 weights, bf16 activations, groups of any multiple of 32 (or per channel), zero
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
        if depth % _HALF and depth < self.config.k:
            expected = f"groups of a multiple of {_HALF} values (one scale per {_HALF})"
            raise InvalidValueError(f"{self.kernel_id} group size", depth, expected)
        failure: KernelBuildError | None = None
        for level in levels:  # a level that does not compile gives way to the next
            try:
                op = _op(level)
            except KernelBuildError as error:
                failure = failure or error
                continue
            object.__setattr__(self, "level", level)
            object.__setattr__(self, "_kernel", op)
            return
        assert failure is not None
        raise failure

    def _span(self) -> int:
        # Blocks of 64 values that share one scale: a group of a multiple of 64, or one
        # scale for the whole row; 0 where groups of 32 give a block two.
        depth = self.config.weight_block[1]
        if depth >= self.config.k:
            return self._padded() // _BLOCK
        return depth // _BLOCK if depth % _BLOCK == 0 else 0

    def _padded(self) -> int:
        return -(-self.config.k // _BLOCK) * _BLOCK

    def _form(
        self,
    ) -> tuple[tuple[torch.dtype, tuple[int, ...] | None], tuple[torch.dtype, tuple[int, ...]]]:
        n, padded = self.config.n, self._padded()
        return (torch.uint8, (n, padded // 2)), (torch.float32, (n, padded // _HALF))

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
        packed = (unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)).contiguous()
        # Each 32 values' scale: its group's (the last group's past K, where x is zero).
        depth = self.config.weight_block[1]
        groups = scale.shape[1]
        first = torch.arange(0, padded, _HALF, device=q.device)
        index = (first // depth).clamp(max=groups - 1) if groups > 1 else first * 0
        half_scales = scale[:, index].contiguous()
        offset = None if zero is None else (scale * zero.to(torch.float32)).contiguous()
        return WeightBundle(packed, half_scales, None, offset, order)

    def _matmul(
        self, x: torch.Tensor, bundle: WeightBundle, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dtype != torch.bfloat16:  # the catalog row takes bf16 only: exact products
            raise InvalidValueError(f"{self.kernel_id} input dtype", str(x.dtype), "bfloat16")
        rows = self._columns(x, bundle).contiguous()
        out = self._kernel(rows, bundle.weight, bundle.scale, self._span())
        if bundle.zero_point is not None:  # - sum over groups of s * z * sum(x in the group)
            depth = self.config.weight_block[1]
            groups = bundle.zero_point.shape[1]
            sums = torch.zeros((rows.shape[0], groups * depth), dtype=torch.float32)
            sums[:, : rows.shape[1]] = rows
            out = out - sums.view(rows.shape[0], groups, depth).sum(-1) @ bundle.zero_point.t()
        return self._finish(out, bias)
