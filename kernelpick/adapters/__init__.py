"""Per-platform adapters: probe a device into ``DeviceCaps`` and launch the chosen kernel.

``probe_device`` turns a live device into facts; ``bind`` turns a selected kernel id into a
runnable kernel on a device. Each platform package (cpu, cuda, rocm) has a pure
``translate`` from device properties, a one-line ``probe(device_index)`` and its launchers.
"""

from kernelpick.adapters._probe import probe_device
from kernelpick.adapters._registry import LAUNCHERS, bind

__all__ = ["LAUNCHERS", "bind", "probe_device"]
