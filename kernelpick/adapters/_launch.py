"""The launch table: how each catalog id runs, and ``bind``, from a choice to a kernel.

A kernel is declared in three places, each once: its requirements in the core catalog
(``kp.default_catalog()``), its family (the math, in ``kernelpick.kernels``) and its row
here, which names the family and the traits the catalog does not state. Alignment is not
repeated here: the kernel reads it from the catalog row's ``Alignment`` rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs
import torch

from kernelpick.core import (
    Catalog,
    DeviceCaps,
    InvalidValueError,
    KernelSpec,
    Platform,
    QuantConfig,
    Rejected,
    Selected,
    UnknownNameError,
    default_catalog,
)
from kernelpick.core._dtypes import HIGH_PRECISION, Dtype
from kernelpick.kernels import (
    ChannelwiseUnfused,
    CupyGemvW8A16,
    DequantMatmul,
    KernelBase,
    ReferenceW8A8,
    ReferenceW8A16,
    RowwiseScaledMM,
    TensorwiseScaledMM,
)

__all__ = ["LAUNCHES", "Launch", "bind"]


@attrs.frozen
class Launch:
    """How one catalog id runs: its kernel family plus the traits its GEMM library has.

    ``fused_bias``: the output dtypes for which the op takes the bias itself (others get it
    added after the op). ``fused_quant``: quantize per-token activations with the cupy
    kernel, used only where the device's cupy is usable.
    """

    family: type[KernelBase] = attrs.field(validator=attrs.validators.instance_of(type))
    fused_bias: frozenset[Dtype] = HIGH_PRECISION
    fused_quant: bool = False

    def kernel(
        self, spec: KernelSpec, config: QuantConfig, caps: DeviceCaps, device: torch.device
    ) -> KernelBase:
        """The family bound to one catalog row, one layer and one device, unchecked:
        ``bind`` checks the platform and device first."""
        fused_quant = self.fused_quant and "cupy" in caps.libraries
        return self.family(spec, config, device, caps.fp8_format, self.fused_bias, fused_quant)


# cuBLASLt refuses a bias with an fp32 output ("Bias is not supported when out_dtype is set
# to Float32", torch's _scaled_mm); hipBLASLt likewise takes it in-op for 16-bit outputs only.
BIAS_IN_16_BIT = frozenset({Dtype.BFLOAT16, Dtype.FLOAT16})

# Every id of kp.default_catalog(), by platform in catalog order. CPU _scaled_mm takes a
# bias in every output dtype. The CUDA W8A8 kernels quantize per-token activations with
# the fused cupy kernel when cupy is usable (one pass per row instead of several torch ops).
LAUNCHES: Mapping[str, Launch] = MappingProxyType(
    {
        "cuda_rowwise_scaled_mm": Launch(RowwiseScaledMM, BIAS_IN_16_BIT, fused_quant=True),
        "cuda_tensorwise_scaled_mm": Launch(TensorwiseScaledMM, BIAS_IN_16_BIT),
        "cuda_channelwise_unfused": Launch(ChannelwiseUnfused, BIAS_IN_16_BIT, fused_quant=True),
        "cuda_w8a16_cupy": Launch(CupyGemvW8A16),
        "cuda_w8a16_torch": Launch(DequantMatmul),
        "rocm_rowwise_scaled_mm": Launch(RowwiseScaledMM, BIAS_IN_16_BIT),
        "rocm_tensorwise_scaled_mm": Launch(TensorwiseScaledMM, BIAS_IN_16_BIT),
        "rocm_channelwise_unfused": Launch(ChannelwiseUnfused, BIAS_IN_16_BIT),
        "rocm_w8a16_torch": Launch(DequantMatmul),
        "cpu_rowwise_scaled_mm": Launch(RowwiseScaledMM),
        "cpu_tensorwise_scaled_mm": Launch(TensorwiseScaledMM),
        "cpu_dequant_reference": Launch(ReferenceW8A8),
        "cpu_w8a16_reference": Launch(ReferenceW8A16),
    }
)

# torch names ROCm devices "cuda" as well.
_DEVICE_TYPE = {Platform.CPU: "cpu", Platform.CUDA: "cuda", Platform.ROCM: "cuda"}


def _device(
    kernel_id: str, platform: Platform, device: torch.device | str | int | None
) -> torch.device:
    wanted = _DEVICE_TYPE[platform]
    if device is None:
        if wanted == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())
    resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if resolved.type != wanted:
        expected = f"a {wanted} device, since {kernel_id} runs on {platform}"
        raise InvalidValueError("device", str(device), expected)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def _kernel_id(choice: Selected | Rejected | str) -> str:
    match choice:
        case str():
            return choice
        case Selected():
            return choice.kernel
        case Rejected():
            expected = "a kp.Selected or a kernel id; this decision is a rejection:\n"
            raise InvalidValueError("choice", "Rejected", expected + choice.render())
        case _:
            raise InvalidValueError("choice", choice, "a kp.Selected or a kernel id")


def bind(
    choice: Selected | Rejected | str,
    config: QuantConfig,
    caps: DeviceCaps,
    device: torch.device | str | int | None = None,
    *,
    catalog: Catalog | None = None,
    launches: Mapping[str, Launch] | None = None,
) -> KernelBase:
    """The runnable kernel for ``choice`` (a ``Selected``, or a kernel id) on ``device``.

    ``caps`` supplies the device's facts (its FP8 format, whether cupy is usable);
    ``device`` is where the tensors live, by default the CPU or the current GPU. A kernel of
    your own is found in ``catalog`` (its spec) and ``launches`` (its row), both defaulting
    to kernelpick's. Raises ``UnknownNameError`` for an id with no spec or no launch row,
    and ``InvalidValueError`` for a rejection or a kernel of another platform than caps'.
    """
    kernel_id = _kernel_id(choice)
    rows = LAUNCHES if launches is None else launches
    spec = (default_catalog() if catalog is None else catalog).kernel(kernel_id)
    row = rows.get(kernel_id)
    if row is None:
        raise UnknownNameError("launchable kernel id", kernel_id, sorted(rows))
    if spec.platform is not caps.platform:
        raise InvalidValueError("caps", caps.name, f"a {spec.platform} device for {kernel_id}")
    return row.kernel(spec, config, caps, _device(kernel_id, spec.platform, device))
