"""The CPU adapter: a pure ``translate`` of device properties, a one-line ``probe``
cached per device index."""

from kernelpick.adapters.cpu._device import probe, read_properties, translate

__all__ = ["probe", "read_properties", "translate"]
