"""A launcher binds a kernel family to a kernel id, a layer's config and a device."""

from __future__ import annotations

import attrs
import torch

from kernelpick.core._device import DeviceCaps
from kernelpick.core._dtypes import HIGH_PRECISION, Dtype
from kernelpick.core._quant import QuantConfig
from kernelpick.kernels._base import KernelBase, Traits

__all__ = ["Launcher"]


@attrs.frozen
class Launcher:
    """How one catalog id runs: its kernel family plus the platform's traits for it."""

    family: type[KernelBase]
    alignment: int | None = None
    fused_bias: frozenset[Dtype] = HIGH_PRECISION
    fused_quant: bool = False  # use the cupy per-token quantizer where cupy is usable

    def bind(
        self, kernel_id: str, config: QuantConfig, caps: DeviceCaps, device: torch.device
    ) -> KernelBase:
        """The kernel for this layer on ``device``, in the device's native FP8 format."""
        fused_quant = self.fused_quant and "cupy" in caps.libraries
        traits = Traits(caps.fp8_format, self.alignment, self.fused_bias, fused_quant)
        return self.family(kernel_id, config, traits, device)
