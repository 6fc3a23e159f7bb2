"""The facts the built-in catalog's rows are made of: each rule value with the reason it
holds and its public source, named once so several rows can share it.
"""

from __future__ import annotations

from kernelpick.core._arch import CudaArch
from kernelpick.core._config_rules import (
    ActivationScales,
    Alignment,
    DynamicActivationScales,
    Fp8Dtypes,
    InputDtypes,
    MinTokens,
    NotBothPerTensor,
    OutDtypes,
    QuantDtypes,
    ScaleDtypes,
    WeightScales,
)
from kernelpick.core._device_rules import (
    CpuIsa,
    CpuIsaAnyOf,
    CudaArchs,
    MinComputeCapability,
    MinTorch,
    NeedsToolchain,
    RocmArchs,
)
from kernelpick.core._dtypes import (
    E4M3_FORMATS,
    HIGH_PRECISION,
    INTEGER_FORMATS,
    SCALE_DTYPES,
    Dtype,
)
from kernelpick.core._quant import GroupShape
from kernelpick.core._specs import Requirement
from kernelpick.core._weight_rules import ActOrder, GroupSizes, ZeroPoints

__all__ = [
    "ALIGN_16",
    "ALIGN_32",
    "ALIGN_128",
    "ANY_GROUPING",
    "ANY_OUT",
    "BF16",
    "BLOCK_128",
    "BLOCK_OUT",
    "CPP_TOOLCHAIN",
    "CPU_BF16_ISA",
    "CPU_FP8_ACTIVATIONS",
    "CPU_FP8_BLOCK",
    "CPU_FP8_ISA",
    "CPU_FP8_STATIC",
    "CPU_FP8_W8A8",
    "CPU_FP8_WEIGHTS",
    "CPU_INT4_GEMM",
    "CPU_INT8_ACTIVATIONS",
    "CPU_INT8_WEIGHTS",
    "DEQUANT_ANY",
    "E4M3",
    "E8M0",
    "INT4_PACK_MM",
    "INT8",
    "INT8_DOT_ISA",
    "INT8_PACK_MM",
    "INT8_PER_TOKEN",
    "INT_MM_ALIGN",
    "INT_MM_CUDA",
    "INT_MM_MIN_TOKENS",
    "MX_32",
    "PER_TENSOR",
    "PER_TOKEN",
    "ROCM_FP8",
    "ROWWISE",
    "SM75",
    "SM89",
    "SM90_CUDA_12_9",
    "SM100_SM120_MX",
    "TENSORWISE",
    "TENSOR_OR_CHANNEL",
    "TENSOR_OR_TOKEN",
    "TORCH_2_8",
    "TORCH_2_10",
    "TORCH_CPU_INT_INPUT",
    "UNFUSED",
    "WEIGHT_ONLY",
    "WNA16_ANY",
]

# Either e4m3 flavour: the integration quantizes into the device's native one (gfx94x
# computes in e4m3fnuz, everything else in OCP e4m3fn; AMD CDNA3 ISA guide).
E4M3 = Fp8Dtypes(E4M3_FORMATS)
TENSOR_OR_TOKEN = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_TOKEN})
TENSOR_OR_CHANNEL = frozenset({GroupShape.PER_TENSOR, GroupShape.PER_CHANNEL})
PER_TENSOR = frozenset({GroupShape.PER_TENSOR})
PER_TOKEN = frozenset({GroupShape.PER_TOKEN})
BF16 = OutDtypes(frozenset({Dtype.BFLOAT16}))
ANY_OUT = OutDtypes(HIGH_PRECISION)
# torch._scaled_mm needs K and N to be multiples of 16 (cuBLASLt / CUTLASS operand
# alignment; torch.compile's fake-tensor check of _scaled_mm demands it on CPU too).
ALIGN_16 = Alignment(16)
# The package's floor. Every scaled_mm path in the table exists there: row-wise on SM 8.9
# (pytorch#145676), SM 10.x (pytorch#148421), SM 12.x (pytorch#155991), ROCm (pytorch#144432).
TORCH_2_8 = MinTorch("2.8")
# CUTLASS/cuBLASLt FP8 tensor cores start at Ada (SM 8.9); torch's row-wise path has
# CUTLASS kernels for 8.9, 9.0, 10.x and 12.x (pytorch#145676, #148421, #155991).
SM89 = MinComputeCapability(CudaArch(8, 9))
# hipBLASLt FP8 GEMM: gfx942 in its fnuz format; gfx950 and RDNA4 (gfx1200/1201) in OCP
# e4m3fn from ROCm 7.0; torch's ROCm row-wise path is pytorch#144432.
ROCM_FP8 = RocmArchs({"gfx942": None, "gfx950": "7.0", "gfx1200": "7.0", "gfx1201": "7.0"})

ROWWISE: tuple[Requirement, ...] = (
    E4M3,
    ActivationScales(TENSOR_OR_TOKEN),
    WeightScales(TENSOR_OR_CHANNEL),
    NotBothPerTensor(),
    ALIGN_16,
)
TENSORWISE: tuple[Requirement, ...] = (
    E4M3,
    ActivationScales(PER_TENSOR),
    WeightScales(PER_TENSOR),
    ALIGN_16,
)
# Unit-scale scaled_mm to fp32, then both scales applied outside: any mix but both per-tensor.
UNFUSED: tuple[Requirement, ...] = ROWWISE
# Weight-only: dequantize a per-channel or per-tensor weight; activations stay as they come.
WEIGHT_ONLY: tuple[Requirement, ...] = (E4M3, WeightScales(TENSOR_OR_CHANNEL))
# Weight-only by dequantizing with torch ops, which expand any group of scales (blocks too),
# fp32 or E8M0 (an E8M0 scale widens to fp32 exactly): the block-FP8 and MXFP8 fallback.
DEQUANT_ANY = (E4M3, ScaleDtypes(SCALE_DTYPES))
# Block FP8 (DeepSeek-V3, Qwen3 FP8): 1x128 dynamic activation groups, 128x128 weight blocks.
BLOCK_128: tuple[Requirement, ...] = (
    E4M3,
    ActivationScales(frozenset({GroupShape.per_group(128)})),
    WeightScales(frozenset({GroupShape.block(128)})),
    DynamicActivationScales(),
)
# The block and MX rows call torch.nn.functional.scaled_mm (the _scaled_mm_v2 API of
# pytorch#164141, with the padded 128x128 scale layout of pytorch#166752), both merged
# after torch 2.9's branch cut (Sept-Nov 2025): 2.10 is the first release with them.
TORCH_2_10 = MinTorch("2.10")
# cuBLASLt's VEC128_32F / BLK128x128_32F scales run on SM 9.0 only (NVIDIA
# CUDALibrarySamples#270); torch refuses other SMs and cuBLASLt before 12.9
# (aten/src/ATen/native/cuda/ScaledBlas.cpp, _check_deepseek_support).
SM90_CUDA_12_9 = CudaArchs({9: "12.9"})
# K, N multiples of 128: torch's fake-tensor check (torch.compile's) sizes block scales
# K // 128 and N // 128 (torch/_meta_registrations.py, _check_scaled_mm_sizes_v2).
ALIGN_128 = Alignment(128)
# bf16 and fp32 out: what torch's block-scaled tests run (test_scaled_matmul_cuda.py,
# test_scaled_mm_vs_emulated_block_wise); fp16 is unverified, so left to other rows.
BLOCK_OUT = OutDtypes(frozenset({Dtype.BFLOAT16, Dtype.FLOAT32}))
E8M0 = frozenset({Dtype.FLOAT8_E8M0FNU})
# MXFP8 (OCP MX v1.0): e4m3 with one E8M0 scale per 32 elements along K, both operands.
MX_32: tuple[Requirement, ...] = (
    E4M3,
    ActivationScales(frozenset({GroupShape(1, 32)}), E8M0),
    WeightScales(frozenset({GroupShape(32, 1)}), E8M0),
    DynamicActivationScales(),
)
# cuBLASLt's VEC32_UE8M0 mode is Blackwell's: SM 10.x (pytorch#146655, "capability 10.0 and
# higher") and SM 12.x in the TN layout kernelpick uses (pytorch#198126); torch maps it from
# CUDA 12.8 (aten/src/ATen/cuda/CUDABlas.cpp, get_scale_mode, CUDA_VERSION >= 12080).
SM100_SM120_MX = CudaArchs({10: "12.8", 12: "12.8"})
# K in whole 32-element MX blocks; conservative on N, where torch asks 16 (ScaledBlas.cpp).
ALIGN_32 = Alignment(32)
# SmoothQuant / compressed-tensors int8 W8A8: per-token dynamic activations, per-channel
# (or per-tensor) symmetric int8 weights.
INT8 = QuantDtypes(frozenset({Dtype.INT8}))
# The compiled CPU int8 kernel reads these two (kernels/_cpu_gemm.py, CpuInt8Gemm).
CPU_INT8_ACTIVATIONS = ActivationScales(PER_TOKEN)
CPU_INT8_WEIGHTS = WeightScales(TENSOR_OR_CHANNEL)
INT8_PER_TOKEN: tuple[Requirement, ...] = (
    INT8,
    CPU_INT8_ACTIVATIONS,
    CPU_INT8_WEIGHTS,
    DynamicActivationScales(),
)
# torch._int_mm on CUDA: "self.size(0) needs to be greater than 16", K and N "a multiple
# of 8" (aten/src/ATen/native/cuda/Blas.cpp, _int_mm_out_cuda; pytorch#178469 to pad
# small M was closed). The int8 families read the floor from here, and pad up to it.
INT_MM_ALIGN = Alignment(8)
INT_MM_MIN_TOKENS = MinTokens(17, "torch._int_mm on CUDA")
INT_MM_CUDA: tuple[Requirement, ...] = (INT_MM_ALIGN, INT_MM_MIN_TOKENS)
# cuBLASLt's int8 IMMA kernels: Turing (SM 7.5) on; torch tests _int_mm on sm75 (#121277).
SM75 = MinComputeCapability(CudaArch(7, 5))
# AVX2+FMA+F16C, every x86-64 CPU since Haswell / Zen 1: F16C's vcvtph2ps decodes FP8
# exactly (an e4m3 byte shifted into an fp16 is its value times 2^-8), FMA accumulates in
# fp32; code built for them faults without them (docs/design.md, CpuIsa).
CPU_FP8_ISA = CpuIsa(frozenset({"avx2", "fma", "f16c"}))
# torch's CPU _int_mm is oneDNN's int8 GEMM. Without VNNI or AMX, oneDNN sums u8 x s8 pairs
# in saturating int16 (vpmaddubsw), and the int32 sums come out wrong, silently: measured
# on torch 2.13 with ONEDNN_MAX_CPU_ISA=AVX2 or AVX512_CORE, 4319 of 24100 outputs of random
# int8 operands wrong (by up to 18% of the output); none with AVX2_VNNI, AVX512_CORE_VNNI
# or the host's AMX-less AVX512_CORE_BF16. (tests/adapters/test_cpu_int8_isa.py runs both.)
INT8_DOT_ISA = CpuIsaAnyOf(frozenset({"avx512_vnni", "avx_vnni", "amx_int8"}))
# Compiled at first use by torch.utils.cpp_extension, which needs a C++ compiler and ninja.
CPP_TOOLCHAIN = NeedsToolchain()
# The C++ kernel quantizes activations itself, fused into the GEMM: dynamic scales per
# token, per 1x128 group or per tensor, or one stored (static) per-tensor scale; it reads
# per-tensor, per-channel or 128x128 block weight scales in every mix (each group's partial
# sum is scaled, kernels/_cpu_fp8_scales.h). Its tail path serves any N and K, so no
# Alignment rule; other block sizes go to the reference (the op takes any multiple of 64,
# untested). The CPU families read these.
CPU_FP8_BLOCK = 128
CPU_FP8_WEIGHTS = WeightScales(TENSOR_OR_CHANNEL | {GroupShape.block(CPU_FP8_BLOCK)})
CPU_FP8_ACTIVATIONS = ActivationScales(
    frozenset({GroupShape.PER_TOKEN, GroupShape.PER_TENSOR, GroupShape.per_group(CPU_FP8_BLOCK)})
)
CPU_FP8_STATIC = DynamicActivationScales(frozenset({GroupShape.PER_TENSOR}))
CPU_FP8_W8A8: tuple[Requirement, ...] = (
    E4M3,
    CPU_FP8_ACTIVATIONS,
    CPU_FP8_STATIC,
    CPU_FP8_WEIGHTS,
)
# The CPU reference quantizes and dequantizes in fp32, so any W8A8 scale mix, shape and
# format works: e4m3 or int8 values, fp32 or E8M0 scales.
ANY_GROUPING: tuple[Requirement, ...] = (
    QuantDtypes(E4M3_FORMATS | {Dtype.INT8}),
    ScaleDtypes(SCALE_DTYPES),
)

# Integer weight-only (W4A16, W8A16): compressed-tensors' pack-quantized weights, fp32
# scales (a checkpoint's bf16 or fp16 ones widen exactly), activations as they come.
_INT_SCALES = ScaleDtypes(frozenset({Dtype.FLOAT32}))
_INT4 = QuantDtypes(frozenset({Dtype.INT4}))
# Dequantizing with torch ops reads any group, either zero point and act-order (its
# columns put in group order at prepare): the fallback no integer config lacks.
WNA16_ANY: tuple[Requirement, ...] = (
    QuantDtypes(INTEGER_FORMATS),
    GroupSizes(None),
    ZeroPoints(INTEGER_FORMATS),
    ActOrder(True),
    _INT_SCALES,
)
# torch's tinygemm int4 ops, on CPU (_weight_int4pack_mm_for_cpu) and CUDA/ROCm
# (_weight_int4pack_mm): qGroupSize 32, 64, 128 or 256 and K a multiple of it
# (aten/src/ATen/native/LinearAlgebra.cpp, _weight_int4pack_mm_cpu; cuda/int4mm.cu);
# dequant (q - 8) * scale + zero, so a zero point folds into zero = -scale * z; the
# columns of an act-order weight are put in group order at prepare.
INT4_PACK_MM: tuple[Requirement, ...] = (
    _INT4,
    GroupSizes(frozenset({32, 64, 128, 256}), per_channel=False, whole_k=True),
    ZeroPoints(frozenset({Dtype.INT4})),
    ActOrder(True),
    _INT_SCALES,
)
# AVX512-BF16's vdpbf16ps (two bf16 products per fp32 lane, Cooper Lake, Sapphire Rapids,
# Zen 4 and 5), with the AVX-512 F/BW/VL and VBMI its kernels' level is built with.
CPU_BF16_ISA = CpuIsa(
    CPU_FP8_ISA.flags | {"avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_bf16"}
)
# kernelpick's int4 CPU kernel (kernels/_cpu_int4_gemv.cpp): bf16 activations times q - z
# on vdpbf16ps, exact, summed in fp32 over each group (32 values or a multiple of 64) before
# its scale, so these groups (the ones checkpoints use) or per channel, a partial
# last group padded; act-order's columns in group order at prepare. bf16 activations only:
# fp32 or fp16 ones would be rounded to bf16.
CPU_INT4_GEMM: tuple[Requirement, ...] = (
    CPU_BF16_ISA,
    CPP_TOOLCHAIN,
    _INT4,
    GroupSizes(frozenset({32, 64, 128, 256}), per_channel=True),
    ZeroPoints(frozenset({Dtype.INT4})),
    ActOrder(True),
    InputDtypes(frozenset({Dtype.BFLOAT16})),
    _INT_SCALES,
)
# torch's CPU int4 and int8 weight-only ops run their fast kernels for bf16 activations
# only: with fp32 or fp16 ones, which the ops accept, they measured 1.7-72x fp32 F.linear's
# time at N = K = 4096 and M = 1-256, and 6.5-85x at all-MiniLM-L6-v2's 384-1536 shapes
# (bf16: 0.13-0.86 of fp32's; torch 2.13, 2-core Zen 4), so they serve bf16 layers only.
TORCH_CPU_INT_INPUT = InputDtypes(frozenset({Dtype.BFLOAT16}))
# torch's CPU _weight_int8pack_mm: int8 [N, K] with one scale per channel, symmetric
# (aten LinearAlgebra.cpp, _weight_int8pack_mm_cpu: "expect scales to be 1d tensor").
# Its bf16 kernel steps K by 16 with no tail (cpu/int8mm_kernel.cpp): measured on torch
# 2.13, K = 75 faults at M >= 2 and reads past the row at M = 1, so K % 16.
INT8_PACK_MM: tuple[Requirement, ...] = (
    QuantDtypes(frozenset({Dtype.INT8})),
    GroupSizes(frozenset(), per_channel=True),
    Alignment(16),
    _INT_SCALES,
)
