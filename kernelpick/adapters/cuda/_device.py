"""Probe an NVIDIA device: raw properties, a pure translate, a probe cached per index."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from kernelpick.adapters._props import Properties, check_index
from kernelpick.core import DeviceCaps
from kernelpick.kernels import cupy_usable

__all__ = ["probe", "read_properties", "translate"]

_LABEL = "CUDA"


def read_properties(device_index: int) -> dict[str, object]:
    """The raw facts of CUDA device ``device_index`` and the torch build, JSON-ready.

    Keys: ``name``, ``major``, ``minor``, ``torch_version``, ``cuda_version`` (None on a
    build without CUDA) and ``libraries`` (``["cupy"]`` when cupy is usable).
    """
    check_index(device_index, torch.cuda.device_count(), _LABEL)
    props = torch.cuda.get_device_properties(device_index)
    return {
        "name": str(props.name),
        "major": int(props.major),
        "minor": int(props.minor),
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda,
        "libraries": ["cupy"] if cupy_usable() else [],
    }


def translate(props: Mapping[str, object]) -> DeviceCaps:
    """The ``DeviceCaps`` of an NVIDIA device from its properties (as ``read_properties`` gives).

    Pure: reads ``name``, ``major``, ``minor``, ``torch_version``, ``cuda_version`` and
    ``libraries``; a missing or wrongly typed one, or a torch build without CUDA
    (``cuda_version`` None), raises ``InvalidValueError``.
    """
    read = Properties(props, _LABEL)
    return DeviceCaps.cuda(
        f"{read.count('major')}.{read.count('minor')}",
        name=read.text("name"),
        torch_version=read.text("torch_version"),
        cuda_version=read.toolkit("cuda_version", "12.8"),
        libraries=read.names("libraries"),
    )


@functools.cache
def _probe(device_index: int) -> DeviceCaps:
    return translate(read_properties(device_index))


def probe(device_index: int) -> DeviceCaps:
    """The ``DeviceCaps`` of CUDA device ``device_index``, probed once per index per process."""
    return _probe(check_index(device_index, torch.cuda.device_count(), _LABEL))
