"""kernelpick's own kernel catalog: the table kernel authors extend. The CPU rows are
here, the GPU rows (CUDA, ROCm) in ``_catalog_gpu``.

Order is preference, fastest first per platform. The rule values shared by rows are named
in ``_catalog_facts``, each with the reason it holds and its source; a rule used by one
row only is written in the row with its comment. docs/design.md#the-catalog-and-its-
hardware-facts tables them; the kind rules (W8A8 / W8A16) are added by the core.
"""

from __future__ import annotations

from kernelpick.core._arch import Platform
from kernelpick.core._catalog_facts import (
    ANY_GROUPING,
    ANY_OUT,
    CPP_TOOLCHAIN,
    CPU_FP8_ISA,
    CPU_FP8_W8A8,
    CPU_FP8_WEIGHTS,
    CPU_INT4_GEMM,
    DEQUANT_ANY,
    E4M3,
    INT4_PACK_MM,
    INT8_DOT_ISA,
    INT8_PACK_MM,
    INT8_PER_TOKEN,
    ROWWISE,
    TENSORWISE,
    TORCH_CPU_INT_INPUT,
    WNA16_ANY,
)
from kernelpick.core._catalog_gpu import CUDA_ROWS, ROCM_ROWS
from kernelpick.core._config_rules import Alignment
from kernelpick.core._device import FEATURE_SCALED_MM, FEATURE_SCALED_MM_ROWWISE
from kernelpick.core._device_rules import (
    NeedsTorchFeature,
)
from kernelpick.core._specs import Catalog, KernelKind, KernelSpec
from kernelpick.core._speed import Compute

__all__ = ["DEFAULT_CATALOG"]

W8A8, W8A16 = KernelKind.W8A8, KernelKind.W8A16
# How a row computes (kp.Compute), where it is not NATIVE: EMULATED rows are references, or
# torch's CPU _scaled_mm, which oneDNN runs only with amx_int8 and which even there measured
# 77-100 ms at N = K = 4096 (cpu_fp8_gemm: 0.78-7.3), so a selection of one warns.
EMULATED = Compute.EMULATED
CPU = Platform.CPU


_CPU = (
    KernelSpec(
        "cpu_fp8_gemm",
        CPU,
        W8A8,
        (CPU_FP8_ISA, CPP_TOOLCHAIN, *CPU_FP8_W8A8, ANY_OUT),
        "FP8 weights decoded in registers (AVX2/AVX-512 C++): GEMV for small M, bf16/fp32 "
        "tiles for large M (with AMX, from 4 tokens, bf16 on AMX tiles: N = K = 4096, "
        "M = 64, 0.26 of fp32 F.linear's time and 0.93 of bf16's, against 1.22 and 4.6 "
        "without), per-token, 1x128-group or per-tensor (dynamic or static) quantization "
        "fused",
    ),
    KernelSpec(
        "cpu_fp8_w8a16_gemm",
        CPU,
        W8A16,
        (CPU_FP8_ISA, CPP_TOOLCHAIN, E4M3, CPU_FP8_WEIGHTS, ANY_OUT),
        "FP8 weights decoded in registers (AVX2/AVX-512 C++): GEMV for small M, bf16/fp32 "
        "tiles for large M (with AMX, bf16 on AMX tiles from 4 tokens, for bf16 "
        "activations), activations kept in their own dtype",
    ),
    KernelSpec(
        "cpu_int8_gemm",
        CPU,
        W8A8,
        (CPU_FP8_ISA, CPP_TOOLCHAIN, *INT8_PER_TOKEN, ANY_OUT),
        "int8 x int8 in registers (the FP8 kernel's AVX2/AVX-512 C++: int16 vpmaddwd, or "
        "vpdpbusd with AVX512-VNNI or AVX-VNNI; exact int32 sums), per-token int8 "
        "quantization fused; on a CPU with VNNI or AMX it hands the product to "
        "torch._int_mm, which wins there (and sums wrong without them), from 49 tokens "
        "(vpdpbusd: from 65, or 192 from K = 2048; with AMX-INT8, where _int_mm runs on "
        "AMX tiles, from 41: N = K = 4096, 0.89 of its time at M = 40, 1.30 at 64)",
    ),
    KernelSpec(
        # torch's CPU _int_mm is oneDNN's int8 GEMM for any M, K and N (measured on torch
        # 2.13: M=1, K=60, N=12 runs), exact only with VNNI or AMX (INT8_DOT_ISA).
        "cpu_int8_int_mm",
        CPU,
        W8A8,
        (INT8_DOT_ISA, *INT8_PER_TOKEN, ANY_OUT),
        "torch._int_mm (oneDNN int8 GEMM, VNNI or AMX), then token and channel scales",
    ),
    KernelSpec(
        # torch runs CPU _scaled_mm through oneDNN only where the CPU has amx_int8
        # (aten/src/ATen/native/Blas.cpp, _scaled_mm_out_cpu); elsewhere it is emulated.
        "cpu_rowwise_scaled_mm",
        CPU,
        W8A8,
        (
            NeedsTorchFeature(FEATURE_SCALED_MM_ROWWISE, "row-wise torch._scaled_mm on CPU"),
            *ROWWISE,
            ANY_OUT,
        ),
        "torch._scaled_mm on CPU with (M,1) x (1,N) fp32 scales: oneDNN only where the CPU "
        "has amx_int8; elsewhere an emulation that copies and decodes the whole weight on "
        "every call (N=K=4096, M=1: 24x fp32 nn.Linear's time on the AVX512-BF16 dev VM, "
        "about 40x on a 2-core AVX2 EPYC). Even with AMX it does not win: 77 ms at M=1 and "
        "100 ms at M=256 on a 2-core AMX Xeon, against 0.78 / 7.3 for cpu_fp8_gemm. Serves "
        "where cpu_fp8_gemm cannot (no toolchain)",
        compute=EMULATED,
    ),
    KernelSpec(
        "cpu_tensorwise_scaled_mm",
        CPU,
        W8A8,
        (NeedsTorchFeature(FEATURE_SCALED_MM, "torch._scaled_mm on CPU"), *TENSORWISE, ANY_OUT),
        "torch._scaled_mm on CPU with scalar scales (an emulation: N=K=4096 on a 2-core AMX "
        "Xeon, 0.45 s at M=1 and 97 s at M=256)",
        compute=EMULATED,
    ),
    KernelSpec(
        # Before torch's op where both apply (bf16 activations on AVX512-BF16): faster at
        # M = 1 and from M = 16 up, a little slower at M = 4, on a 2-core Zen 4; and
        # torch.compile traces it whole, where tinygemm's packing breaks the graph.
        "cpu_int4_gemm",
        CPU,
        W8A16,
        (*CPU_INT4_GEMM, ANY_OUT),
        "int4 nibbles decoded in registers to bf16 (AVX512-BF16 C++), exact products on "
        "vdpbf16ps for bf16 activations, any N and K, per channel too (N = K = 4096, "
        "2-core Zen 4, against the best F.linear: 0.30 at M=1, torch's int4 op 0.34; 0.39 "
        "at M=4, torch's 0.35; 0.91 at M=16, torch's 1.05)",
        fallback=frozenset(),
    ),
    KernelSpec(
        # N % 16: _convert_weight_to_int4pack_for_cpu's "expect N to be dividable by 16".
        "cpu_int4pack_mm",
        CPU,
        W8A16,
        (*INT4_PACK_MM, Alignment(16), TORCH_CPU_INT_INPUT, ANY_OUT),
        "torch._weight_int4pack_mm_for_cpu: int4 groups of 32-256, zero points folded, "
        "packed at load for this CPU's ISA (N = K = 4096, bf16, 2-core AMX Xeon: 0.42 of "
        "bf16 F.linear's time at M=1, but 1.9 at M=16 and 8.9 at M=256, where F.linear "
        "runs on AMX tiles)",
        fallback=frozenset(),
    ),
    KernelSpec(
        "cpu_int8pack_mm",
        CPU,
        W8A16,
        (*INT8_PACK_MM, TORCH_CPU_INT_INPUT, ANY_OUT),
        "torch._weight_int8pack_mm: per-channel symmetric int8 (N = K = 4096, bf16, 2-core "
        "AMX Xeon: 0.59 of bf16 F.linear's time at M=1, 2.3 at M=16, 8.9 at M=256)",
        fallback=frozenset(),
    ),
    KernelSpec(
        "cpu_dequant_reference",
        CPU,
        W8A8,
        (*ANY_GROUPING, ANY_OUT),
        "quantize, dequantize, fp32 matmul: the numerics reference",
        compute=EMULATED,
    ),
    KernelSpec(
        "cpu_w8a16_reference",
        CPU,
        W8A16,
        (*DEQUANT_ANY, ANY_OUT),
        "dequantize the weight (any scale grouping), fp32 matmul",
        compute=EMULATED,
    ),
    KernelSpec(
        "cpu_wna16_reference",
        CPU,
        W8A16,
        (*WNA16_ANY, ANY_OUT),
        "int4/int8 weights dequantized to fp32 (any group, zero points, act-order), fp32 "
        "matmul: the numerics reference",
        fallback=frozenset(),
        compute=EMULATED,
    ),
)

DEFAULT_CATALOG = Catalog(CUDA_ROWS + ROCM_ROWS + _CPU)
