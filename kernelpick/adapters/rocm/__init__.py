"""The ROCm adapter: a pure ``translate`` of device properties (gcnArchName, fnuz), a ``probe``
cached per device index."""

from kernelpick.adapters.rocm._device import probe, read_properties, translate

__all__ = ["probe", "read_properties", "translate"]
