"""Every launcher by catalog id, and ``bind``: from a selected kernel id to a runnable kernel."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from kernelpick.adapters._launcher import Launcher
from kernelpick.adapters.cpu._launch import LAUNCHERS as CPU
from kernelpick.adapters.cuda._launch import LAUNCHERS as CUDA
from kernelpick.adapters.rocm._launch import LAUNCHERS as ROCM
from kernelpick.core._arch import Platform
from kernelpick.core._builtin_catalog import DEFAULT_CATALOG
from kernelpick.core._device import DeviceCaps
from kernelpick.core._errors import InvalidValueError, UnknownNameError
from kernelpick.core._quant import QuantConfig
from kernelpick.kernels._base import Kernel

__all__ = ["LAUNCHERS", "bind"]

LAUNCHERS: Mapping[str, Launcher] = MappingProxyType({**CPU, **CUDA, **ROCM})

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


def bind(
    kernel_id: str,
    config: QuantConfig,
    caps: DeviceCaps,
    device: torch.device | str | int | None = None,
) -> Kernel:
    """The runnable kernel for ``kernel_id`` (usually ``Selected.kernel``) on ``device``.

    ``caps`` supplies the device's facts (its FP8 format); ``device`` is where the tensors
    live, by default the CPU or the current GPU. Raises ``UnknownNameError`` for an id with
    no launcher and ``InvalidValueError`` when the kernel's platform is not the device's.
    """
    launcher = LAUNCHERS.get(kernel_id)
    if launcher is None:
        raise UnknownNameError("launchable kernel id", kernel_id, sorted(LAUNCHERS))
    platform = DEFAULT_CATALOG.kernel(kernel_id).platform
    if platform is not caps.platform:
        raise InvalidValueError("caps", caps.name, f"a {platform} device for {kernel_id}")
    return launcher.bind(kernel_id, config, caps, _device(kernel_id, platform, device))
