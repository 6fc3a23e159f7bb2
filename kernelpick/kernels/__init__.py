"""Kernel families (torch ops, cupy raw kernels) and the canonical weight layout.

A family is the math of a kernel, the same on every device; ``kernelpick.adapters`` binds
a family to a catalog id, a layer's config and a device. Depends on ``kernelpick.core``
only. A new family subclasses ``KernelBase`` (or ``RowMajorKernel``), declares its
``KIND`` and defines ``_matmul``; see docs/adding-a-kernel.md. ``canonicalize_fp8_`` makes
an FP8 weight of one's own canonical (no -0, no NaN byte) before ``prepare_weights``.
"""

from kernelpick.kernels._base import Kernel, KernelBase, RowMajorKernel, WeightBundle
from kernelpick.kernels._bind import bind
from kernelpick.kernels._block_scaled_mm import BlockScaledMM, MxScaledMM
from kernelpick.kernels._canonical import canonicalize_fp8_, dequantize_weight, quantize_weight
from kernelpick.kernels._cpu_build import KernelBuildError
from kernelpick.kernels._cpu_gemm import CpuFp8Gemm, CpuFp8GemmW8A16
from kernelpick.kernels._int8 import Int8IntMM, Int8IntMMPadded
from kernelpick.kernels._launch import LAUNCHES, Launch, check_rows, launch_table
from kernelpick.kernels._reference import ReferenceW8A8, ReferenceW8A16
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, RowwiseScaledMM, TensorwiseScaledMM
from kernelpick.kernels._w8a16 import CupyGemvW8A16, DequantMatmul

__all__ = [
    "LAUNCHES",
    "BlockScaledMM",
    "ChannelwiseUnfused",
    "CpuFp8Gemm",
    "CpuFp8GemmW8A16",
    "CupyGemvW8A16",
    "DequantMatmul",
    "Int8IntMM",
    "Int8IntMMPadded",
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
    "dequantize_weight",
    "launch_table",
    "quantize_weight",
]
