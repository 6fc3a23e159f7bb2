"""The ROCm adapter: a pure ``translate`` of device properties (gcnArchName, fnuz), a ``probe``
cached per device index, and the launchers that run this platform's catalog ids."""

from kernelpick.adapters.rocm._device import probe, read_properties, translate
from kernelpick.adapters.rocm._launch import LAUNCHERS

__all__ = ["LAUNCHERS", "probe", "read_properties", "translate"]
