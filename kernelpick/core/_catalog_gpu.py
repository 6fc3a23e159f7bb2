"""kernelpick's own kernel catalog, its GPU rows (CUDA, ROCm); the CPU rows and the
catalog itself are in ``_builtin_catalog``.

Order is preference, fastest first per platform. The rule values shared by rows are named
in ``_catalog_facts``, each with the reason it holds and its source; a rule used by one
row only is written in the row with its comment. docs/design.md#the-catalog-and-its-
hardware-facts tables them; the kind rules (W8A8 / W8A16) are added by the core.
"""

from __future__ import annotations

from kernelpick.core._arch import CudaArch, Platform
from kernelpick.core._catalog_facts import (
    ALIGN_32,
    ALIGN_128,
    ANY_OUT,
    BF16,
    BLOCK_128,
    BLOCK_OUT,
    DEQUANT_ANY,
    E4M3,
    INT4_PACK_MM,
    INT8_PER_TOKEN,
    INT_MM_ALIGN,
    INT_MM_CUDA,
    MX_32,
    ROCM_FP8,
    ROWWISE,
    SM75,
    SM89,
    SM90_CUDA_12_9,
    SM100_SM120_MX,
    TENSORWISE,
    TORCH_2_8,
    TORCH_2_10,
    UNFUSED,
    WEIGHT_ONLY,
    WNA16_ANY,
)
from kernelpick.core._config_rules import Alignment, InputDtypes, ScaleDtypes
from kernelpick.core._device_rules import (
    MinComputeCapability,
    NeedsLibrary,
    RocmArchs,
)
from kernelpick.core._dtypes import Dtype
from kernelpick.core._specs import KernelKind, KernelSpec
from kernelpick.core._speed import Compute

__all__ = ["CUDA_ROWS", "ROCM_ROWS"]

W8A8, W8A16 = KernelKind.W8A8, KernelKind.W8A16
# How a row computes (kp.Compute), where it is not NATIVE: DECODE rows dequantize with
# torch ops, then matmul.
DECODE = Compute.DECODE
_BF16_IN = InputDtypes(frozenset({Dtype.BFLOAT16}))
CUDA, ROCM = Platform.CUDA, Platform.ROCM

CUDA_ROWS = (
    KernelSpec(
        "cuda_rowwise_scaled_mm",
        CUDA,
        W8A8,
        (SM89, TORCH_2_8, *ROWWISE, BF16),
        "torch._scaled_mm with row-wise scales (CUTLASS)",
    ),
    KernelSpec(
        "cuda_block_scaled_mm",
        CUDA,
        W8A8,
        (SM90_CUDA_12_9, TORCH_2_10, *BLOCK_128, ALIGN_128, BLOCK_OUT),
        "scaled_mm with 1x128 activation and 128x128 weight block scales (cuBLASLt, Hopper)",
    ),
    KernelSpec(
        # bf16 out: what torch's MX tests run, a bias included (pytorch#152665).
        "cuda_mxfp8_scaled_mm",
        CUDA,
        W8A8,
        (SM100_SM120_MX, TORCH_2_10, *MX_32, ALIGN_32, BF16),
        "scaled_mm with 1x32 E8M0 block scales, MXFP8 (cuBLASLt, Blackwell)",
    ),
    KernelSpec(
        "cuda_tensorwise_scaled_mm",
        CUDA,
        W8A8,
        (SM89, TORCH_2_8, *TENSORWISE, ANY_OUT),
        "torch._scaled_mm with per-tensor scales (cuBLASLt)",
    ),
    KernelSpec(
        "cuda_channelwise_unfused",
        CUDA,
        W8A8,
        (SM89, TORCH_2_8, *UNFUSED, ANY_OUT),
        "unit-scale torch._scaled_mm to fp32, then activation and weight scales",
    ),
    KernelSpec(
        "cuda_int8_int_mm",
        CUDA,
        W8A8,
        (SM75, *INT8_PER_TOKEN, *INT_MM_CUDA, ANY_OUT),
        "torch._int_mm (int8 x int8 -> int32, cuBLASLt), then token and channel scales",
    ),
    KernelSpec(
        # What serves decode (min_tokens <= 16), where the row above is turned down.
        "cuda_int8_int_mm_padded",
        CUDA,
        W8A8,
        (SM75, *INT8_PER_TOKEN, INT_MM_ALIGN, ANY_OUT),
        "torch._int_mm with a call of 16 rows or fewer padded to 17 zero rows (decode)",
    ),
    KernelSpec(
        # FP8 is decoded in software, so any GPU torch supports runs it (T4 is SM 7.5).
        "cuda_w8a16_cupy",
        CUDA,
        W8A16,
        (
            MinComputeCapability(CudaArch(7, 5)),
            NeedsLibrary("cupy"),
            *WEIGHT_ONLY,
            InputDtypes(frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})),
            ANY_OUT,
        ),
        "fused FP8-dequant GEMV (cupy) for small M; dequant + cuBLAS for large M",
    ),
    KernelSpec(
        "cuda_w8a16_torch",
        CUDA,
        W8A16,
        (*DEQUANT_ANY, ANY_OUT),
        "dequantize with torch ops (any scale grouping, blocks too), then matmul",
        compute=DECODE,
    ),
    KernelSpec(
        # tinygemm's CUDA kernels are built for SM 8.0 on (int4mm.cu, __CUDA_ARCH__ >= 800)
        # and take bf16 only ("expected A to be bf16"); K in tiles of 16 x innerKTiles
        # (2, 4 or 8), which a K of whole groups of 32 or more always fills, N % 8.
        "cuda_int4pack_mm",
        CUDA,
        W8A16,
        (MinComputeCapability(CudaArch(8, 0)), *INT4_PACK_MM, _BF16_IN, BF16, Alignment(8)),
        "torch._weight_int4pack_mm (tinygemm): int4 groups of 32-256, zero points folded",
        fallback=frozenset(),
    ),
    KernelSpec(
        "cuda_wna16_torch",
        CUDA,
        W8A16,
        (*WNA16_ANY, ANY_OUT),
        "int4/int8 weights dequantized with torch ops (any group, zero points, act-order), "
        "then matmul",
        fallback=frozenset(),
        compute=DECODE,
    ),
)

ROCM_ROWS = (
    KernelSpec(
        "rocm_rowwise_scaled_mm",
        ROCM,
        W8A8,
        (ROCM_FP8, TORCH_2_8, *ROWWISE, BF16),
        "torch._scaled_mm with row-wise scales (hipBLASLt)",
    ),
    KernelSpec(
        "rocm_tensorwise_scaled_mm",
        ROCM,
        W8A8,
        (ROCM_FP8, TORCH_2_8, *TENSORWISE, ANY_OUT),
        "torch._scaled_mm with per-tensor scales (hipBLASLt)",
    ),
    KernelSpec(
        # Serves what row-wise cannot, such as fp16 models (hipBLASLt row-wise is bf16 only).
        "rocm_channelwise_unfused",
        ROCM,
        W8A8,
        (ROCM_FP8, TORCH_2_8, *UNFUSED, ANY_OUT),
        "unit-scale torch._scaled_mm to fp32, then activation and weight scales",
    ),
    KernelSpec(
        # fp32 scales only: on gfx942 the weight is reread as e4m3fnuz with doubled scales,
        # and an E8M0 scale has no arithmetic in torch to double it with.
        "rocm_w8a16_torch",
        ROCM,
        W8A16,
        (E4M3, ScaleDtypes(frozenset({Dtype.FLOAT32})), ANY_OUT),
        "dequantize with torch ops (any scale grouping, blocks too), then matmul",
        compute=DECODE,
    ),
    KernelSpec(
        # int4mm.cu's ROCm path: MFMA on CDNA2 and later (gfx90a, gfx942, gfx950; "only
        # supported on AMD gpu arch greater than or equal to CDNA2"), N padded to 16.
        "rocm_int4pack_mm",
        ROCM,
        W8A16,
        (
            RocmArchs({"gfx90a": None, "gfx942": None, "gfx950": None}),
            *INT4_PACK_MM,
            _BF16_IN,
            BF16,
            Alignment(16),
        ),
        "torch._weight_int4pack_mm (tinygemm on CDNA2+): int4 groups of 32-256",
        fallback=frozenset(),
    ),
    KernelSpec(
        "rocm_wna16_torch",
        ROCM,
        W8A16,
        (*WNA16_ANY, ANY_OUT),
        "int4/int8 weights dequantized with torch ops (any group, zero points, act-order), "
        "then matmul",
        fallback=frozenset(),
        compute=DECODE,
    ),
)
