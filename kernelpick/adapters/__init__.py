"""Per-platform adapters: probe a device into ``DeviceCaps`` and launch the chosen kernel.

``probe_device`` turns a live device into facts; ``bind`` turns a choice into a runnable
kernel through the launch table ``LAUNCHES`` (one ``Launch`` row per catalog id). Each
platform package (cpu, cuda, rocm) has a pure ``translate`` from device properties and a
one-line ``probe(device_index)``.
"""

from kernelpick.adapters._launch import LAUNCHES, Launch, bind
from kernelpick.adapters._probe import probe_device

__all__ = ["LAUNCHES", "Launch", "bind", "probe_device"]
