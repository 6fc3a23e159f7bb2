"""The checks a layer's scales pass before a kernel reads them: dtype, shape, device, and
whether the config has a static activation scale at all."""

from __future__ import annotations

import torch

from kernelpick.core import KernelInputError, QuantConfig
from kernelpick.kernels._canonical import canonical_scale_dtype
from kernelpick.kernels._torch import check_tensor, reject

__all__ = ["checked_input_scale", "checked_weight_scale"]


def _one_value(name: str, scale: torch.Tensor) -> torch.Tensor:
    if scale.numel() != 1:
        raise reject(name, scale, "one per-tensor value")
    return scale.reshape(())


def checked_weight_scale(
    config: QuantConfig, scale: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """``scale`` in the config's scale dtype and ``config.weight_scale_shape``, on
    ``device``, contiguous; one per-tensor value comes back 0-dim."""
    shape = config.weight_scale_shape
    dtypes = (canonical_scale_dtype(config),)
    check_tensor("weight_scale", scale, dtypes=dtypes, device=device)
    if shape == (1,):
        return _one_value("weight_scale", scale)
    if tuple(scale.shape) != shape:
        raise reject("weight_scale", scale, f"shape {list(shape)}")
    # A view of another layout (a transposed block grid) is made row-major, as the compiled
    # kernels read it; a contiguous scale, the canonical one, is returned as it is.
    return scale.contiguous()


def checked_input_scale(
    config: QuantConfig, input_scale: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """A static activation scale as one fp32 0-dim value; None for a dynamic config. A
    scale where none is due, or none where one is, is refused rather than ignored."""
    act = config.activation
    static = act is not None and act.scale.static
    if input_scale is None:
        if static:
            expected = "a per-tensor fp32 scale: this config's activation scale is static"
            raise KernelInputError("input_scale", (), "None", "-", expected)
        return None
    if not static:
        expected = "None: this config computes activation scales per call"
        raise reject("input_scale", input_scale, expected)
    check_tensor("input_scale", input_scale, dtypes=(torch.float32,), device=device)
    return _one_value("input_scale", input_scale)
