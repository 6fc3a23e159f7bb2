"""Probe an AMD device: raw properties, a pure translate, a probe cached per index.

ROCm builds of torch expose AMD GPUs through the ``torch.cuda`` namespace, so the
properties come from ``torch.cuda.get_device_properties`` and the version from
``torch.version.hip``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from kernelpick.adapters._props import Properties, check_index
from kernelpick.core import DeviceCaps, InvalidValueError, RocmArch

__all__ = ["probe", "read_properties", "translate"]

_LABEL = "ROCm"


def read_properties(device_index: int) -> dict[str, object]:
    """The raw facts of ROCm device ``device_index`` and the torch build, JSON-ready.

    Keys: ``name``, ``gcnArchName`` (e.g. ``gfx942:sramecc+:xnack-``), ``torch_version``
    and ``hip_version`` (None on a build without ROCm).
    """
    check_index(device_index, torch.cuda.device_count(), _LABEL)
    props = torch.cuda.get_device_properties(device_index)
    return {
        "name": str(props.name),
        "gcnArchName": str(props.gcnArchName),
        "torch_version": str(torch.__version__),
        "hip_version": torch.version.hip,
    }


def _arch(read: Properties) -> RocmArch:
    value = read.text("gcnArchName")
    try:
        return RocmArch.parse(value)
    except InvalidValueError:
        # Re-raised to name the property, which is what a person reading a probe dump needs.
        raise InvalidValueError(
            "ROCm property 'gcnArchName'", value, "a gfx name such as 'gfx942:sramecc+:xnack-'"
        ) from None


def translate(props: Mapping[str, object]) -> DeviceCaps:
    """The ``DeviceCaps`` of an AMD device from its properties (as ``read_properties`` gives).

    Pure: reads ``name``, ``gcnArchName``, ``torch_version`` and ``hip_version``; a
    missing, wrongly typed or malformed one, or a torch build without ROCm
    (``hip_version`` None), raises ``InvalidValueError``. cupy is not used on ROCm, so
    ``libraries`` is empty.
    """
    read = Properties(props, _LABEL)
    return DeviceCaps.rocm(
        _arch(read),
        name=read.text("name"),
        torch_version=read.text("torch_version"),
        rocm_version=read.toolkit("hip_version", "7.0.51831"),
    )


@functools.cache
def _probe(device_index: int) -> DeviceCaps:
    return translate(read_properties(device_index))


def probe(device_index: int) -> DeviceCaps:
    """The ``DeviceCaps`` of ROCm device ``device_index``, probed once per index per process."""
    return _probe(check_index(device_index, torch.cuda.device_count(), _LABEL))
