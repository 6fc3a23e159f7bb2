"""ROCm launch glue: which kernel family runs each ``rocm_*`` catalog id.

The families are the CUDA ones; the FP8 flavour comes from the device (e4m3fnuz on gfx94x,
with 224 as its quantization range), so quantizing into the native format needs no code
here. An e4m3fn checkpoint goes through ``normalize_e4m3fn_to_fnuz`` first.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelpick.adapters._launcher import Launcher
from kernelpick.core._dtypes import Dtype
from kernelpick.kernels._fnuz import normalize_e4m3fn_to_fnuz
from kernelpick.kernels._scaled_mm import ChannelwiseUnfused, RowwiseScaledMM, TensorwiseScaledMM
from kernelpick.kernels._w8a16 import DequantMatmul

__all__ = ["LAUNCHERS", "normalize_e4m3fn_to_fnuz"]

# hipBLASLt, like cuBLASLt, takes the bias in-op for half-precision outputs only.
FUSED_BIAS = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})
ALIGN = 16

LAUNCHERS: Mapping[str, Launcher] = {
    "rocm_rowwise_scaled_mm": Launcher(RowwiseScaledMM, ALIGN, FUSED_BIAS),
    "rocm_tensorwise_scaled_mm": Launcher(TensorwiseScaledMM, ALIGN, FUSED_BIAS),
    "rocm_channelwise_unfused": Launcher(ChannelwiseUnfused, ALIGN, FUSED_BIAS),
    "rocm_w8a16_torch": Launcher(DequantMatmul),
}
