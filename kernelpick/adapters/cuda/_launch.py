"""CUDA launch glue: which kernel family runs each ``cuda_*`` catalog id."""

from __future__ import annotations

from collections.abc import Mapping

from kernelpick.adapters._launcher import Launcher
from kernelpick.core._dtypes import Dtype
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, RowwiseScaledMM, TensorwiseScaledMM
from kernelpick.kernels._w8a16 import CupyGemvW8A16, DequantMatmul

__all__ = ["LAUNCHERS", "SCALED_MM_FUSED_BIAS"]

# cuBLASLt refuses a bias with an fp32 output ("Bias is not supported when out_dtype is set
# to Float32" in torch's _scaled_mm); the kernel adds it after the op there.
SCALED_MM_FUSED_BIAS = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})
# cuBLASLt and CUTLASS FP8 GEMMs need K and N to be multiples of 16 (design §4).
ALIGN = 16

# The W8A8 kernels quantize per-token activations with the fused cupy kernel when the
# device's cupy is usable (one pass per row instead of several torch ops), else torch ops.
LAUNCHERS: Mapping[str, Launcher] = {
    "cuda_rowwise_scaled_mm": Launcher(RowwiseScaledMM, ALIGN, SCALED_MM_FUSED_BIAS, True),
    "cuda_tensorwise_scaled_mm": Launcher(TensorwiseScaledMM, ALIGN, SCALED_MM_FUSED_BIAS),
    "cuda_channelwise_unfused": Launcher(ChannelwiseUnfused, ALIGN, SCALED_MM_FUSED_BIAS, True),
    "cuda_w8a16_cupy": Launcher(CupyGemvW8A16),
    "cuda_w8a16_torch": Launcher(DequantMatmul),
}
