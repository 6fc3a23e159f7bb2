"""The CPU adapter: a pure ``translate`` of device properties, a one-line ``probe``
cached per device index, and the launchers that run this platform's catalog ids."""

from kernelpick.adapters.cpu._device import probe, read_properties, translate
from kernelpick.adapters.cpu._launch import LAUNCHERS

__all__ = ["LAUNCHERS", "probe", "read_properties", "translate"]
