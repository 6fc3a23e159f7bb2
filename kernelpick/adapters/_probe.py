"""Probe any device: route a device request to the cpu, cuda or rocm adapter's probe."""

from __future__ import annotations

import re

import torch

from kernelpick.adapters import cpu, cuda, rocm
from kernelpick.core import DeviceCaps, InvalidValueError, Platform, UnknownNameError

__all__ = ["DEVICE_NAMES", "default_caps", "probe_device", "route_device"]

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")
_ACCEPTED = "None, 'auto', 'cpu', 'cuda', 'cuda:N', a GPU index N or a torch.device"
_CUDA_INDEXED = re.compile(r"^cuda:(\d+)$")

# A parsed request: the CPU, whatever is current, or a GPU (None: the current GPU).
_Request = tuple[str, int | None]
_CPU: _Request = ("cpu", 0)
_AUTO: _Request = ("auto", None)


def _parse_request(device: object) -> _Request:
    if device is None:
        return _AUTO
    if isinstance(device, torch.device):
        # ROCm builds name AMD GPUs "cuda" too; any other type has no adapter here.
        if device.type == "cpu":
            return _CPU
        if device.type == "cuda":
            return ("gpu", device.index)
        raise InvalidValueError("device", device, f"{_ACCEPTED}, of type cpu or cuda")
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise InvalidValueError("device", device, f"{_ACCEPTED}, with N >= 0")
        return ("gpu", device)
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("cpu", "auto"):
            return _CPU if text == "cpu" else _AUTO
        if text == "cuda":
            return ("gpu", None)
        match = _CUDA_INDEXED.match(text)
        if match is not None:
            return ("gpu", int(match.group(1)))
        raise UnknownNameError("device", device, DEVICE_NAMES)
    raise InvalidValueError("device", device, _ACCEPTED)


def route_device(
    device: object, cuda_available: bool, is_hip: bool, current_index: int
) -> tuple[Platform, int]:
    """Which adapter and device index serve ``device``, given what the machine has. Pure.

    None and ``"auto"`` mean the current GPU when one is available, else the CPU. ``"cuda"``
    and ``torch.device("cuda")`` mean the current GPU, ``"cuda:N"`` and ``N`` GPU N. A GPU
    is routed to ROCm when ``is_hip`` (the ROCm build of torch) and to CUDA otherwise. A GPU
    request without an available GPU raises ``InvalidValueError``; an unknown name raises
    ``UnknownNameError``. The index is not checked against the device count here.
    """
    kind, index = _parse_request(device)
    if kind == "cpu" or (kind == "auto" and not cuda_available):
        return Platform.CPU, 0
    if not cuda_available:
        raise InvalidValueError(
            "device", device, "'cpu' or 'auto': no GPU is available (torch.cuda.is_available())"
        )
    gpu = Platform.ROCM if is_hip else Platform.CUDA
    return gpu, current_index if index is None else index


def probe_device(device: object = None) -> DeviceCaps:
    """The ``DeviceCaps`` of ``device`` (default: the current GPU, else the CPU), cached.

    Accepts what ``route_device`` accepts. An index past the visible devices raises
    ``InvalidValueError`` listing the valid range.
    """
    kind, _ = _parse_request(device)
    available = torch.cuda.is_available()
    # current_device() initializes CUDA in this process; a CPU request must not do that.
    current = torch.cuda.current_device() if available and kind != "cpu" else 0
    platform, index = route_device(device, available, torch.version.hip is not None, current)
    if platform is Platform.ROCM:
        return rocm.probe(index)
    if platform is Platform.CUDA:
        return cuda.probe(index)
    return cpu.probe(index)


def default_caps(device: torch.device | None = None) -> DeviceCaps:
    """The device a layer is selected for when its caller names none: ``device``, where the
    layer's tensors are (or will be), else the current one (the current GPU, else the
    CPU). Every path that makes or moves a layer asks this, so "the default device" is
    decided once."""
    return probe_device(device)
