"""Kernel families (torch ops, cupy raw kernels, compiled CPU C++), the canonical weight
layout, and the launch table with ``bind``.

A family is the math of a kernel, the same on every device; ``bind`` binds a family to a
catalog id (through its ``Launch`` row in ``LAUNCHES``), a layer's config and a device.
Depends on ``kernelpick.core`` only. A new family subclasses ``KernelBase`` (or
``RowMajorKernel``), declares its ``KIND`` and defines ``_matmul``; see
docs/adding-a-kernel.md. ``canonicalize_fp8_`` makes an FP8 weight of one's own canonical
(no -0, no NaN byte) before ``prepare_weights``.
The last group of ``__all__`` is for kernelpick's other packages, which import the
kernels from here and never from their private modules.
"""

import typing as _typing
import warnings as _warnings

from kernelpick.kernels._base import Kernel, KernelBase, RowMajorKernel, WeightBundle
from kernelpick.kernels._bind import bind
from kernelpick.kernels._block_scaled_mm import BlockScaledMM, MxScaledMM
from kernelpick.kernels._canonical import (
    CANONICAL_FP8,
    E8M0_DTYPES,
    E8M0_STORED,
    STORED_SCALE_DTYPES,
    canonical_dtype,
    canonical_scale,
    canonical_scale_dtype,
    canonicalize_fp8_,
    check_finite,
    check_fp8_finite,
    dequantize_weight,
    has_negative_zero,
    one_tensor_scale,
    positive_zero_,
    quantize_canonical,
    stored_scale,
)
from kernelpick.kernels._cpu_build import KernelBuildError
from kernelpick.kernels._cpu_gemm import CpuFp8Gemm, CpuFp8GemmW8A16, CpuInt8Gemm
from kernelpick.kernels._cpu_toolchain import toolchain_parts
from kernelpick.kernels._cupy_runtime import cupy_usable
from kernelpick.kernels._int8 import Int8IntMM, Int8IntMMPadded
from kernelpick.kernels._int_canonical import (
    dequantize_int,
    group_order,
    int_range,
    pack_int,
    pack_zero_points,
    quantize_int,
    unpack_int,
    unpack_zero_points,
)
from kernelpick.kernels._launch import LAUNCHES, Launch, check_rows, launch_table
from kernelpick.kernels._quantize import CHUNK_ROWS, AmaxReduce
from kernelpick.kernels._reference import ReferenceW8A8, ReferenceW8A16
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, RowwiseScaledMM, TensorwiseScaledMM
from kernelpick.kernels._torch import check_tensor, reject, torch_dtype
from kernelpick.kernels._w8a16 import CupyGemvW8A16, DequantMatmul
from kernelpick.kernels._wna16 import IntDequantMatmul, IntWeightOnly
from kernelpick.kernels._wna16_ops import Int4PackMM, Int8PackMM

__all__ = [
    "LAUNCHES",
    "BlockScaledMM",
    "ChannelwiseUnfused",
    "CpuFp8Gemm",
    "CpuFp8GemmW8A16",
    "CpuInt8Gemm",
    "CupyGemvW8A16",
    "DequantMatmul",
    "Int4PackMM",
    "Int8IntMM",
    "Int8IntMMPadded",
    "Int8PackMM",
    "IntDequantMatmul",
    "IntWeightOnly",
    "Kernel",
    "KernelBase",
    "KernelBuildError",
    "Launch",
    "MxScaledMM",
    "ReferenceW8A8",
    "ReferenceW8A16",
    "RowMajorKernel",
    "RowwiseScaledMM",
    "TensorwiseScaledMM",
    "WeightBundle",
    "bind",
    "canonicalize_fp8_",
    "check_rows",
    "dequantize_int",
    "dequantize_weight",
    "launch_table",
    "pack_int",
    "pack_zero_points",
    "quantize_canonical",
    "quantize_int",
    "unpack_int",
    "unpack_zero_points",
]
# For kernelpick's other packages (adapters, integration, engines, bench): the canonical
# layout's checks, torch's side of a Dtype, and what the probes ask of the build and of
# cupy. Not meant for engines; they may change in any release.
__all__ += [
    "CANONICAL_FP8",
    "CHUNK_ROWS",
    "E8M0_DTYPES",
    "E8M0_STORED",
    "STORED_SCALE_DTYPES",
    "AmaxReduce",
    "canonical_dtype",
    "canonical_scale",
    "canonical_scale_dtype",
    "check_finite",
    "check_fp8_finite",
    "check_tensor",
    "cupy_usable",
    "group_order",
    "has_negative_zero",
    "int_range",
    "one_tensor_scale",
    "positive_zero_",
    "reject",
    "stored_scale",
    "toolchain_parts",
    "torch_dtype",
]

# Renamed in 0.3.0 (it differed from Kernel.quantize_weights by one letter and returned
# another thing); the old name goes away in 0.4.0.
_RENAMED = {"quantize_weight": "quantize_canonical"}


def __getattr__(name: str) -> _typing.Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        _warnings.warn(
            f"kernelpick.kernels.{name} is deprecated and goes away in 0.4.0; use "
            f"kernelpick.kernels.{new} (the canonical weight and scale; a kernel's "
            "quantize_weights returns its prepared bundle)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module 'kernelpick.kernels' has no attribute {name!r}", name=name)
