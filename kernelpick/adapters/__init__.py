"""Per-platform adapters: probe a device into ``DeviceCaps``.

``probe_device`` turns a live device into facts, cached per device; ``default_caps`` is the
one answer to "which device is a layer selected for when the caller names none", used by
every path of ``kernelpick.integration``. Each platform package (cpu, cuda, rocm) has a pure
``translate`` from device properties and a one-line ``probe(device_index)``. Turning a
choice into a runnable kernel (``bind``, the launch table) is ``kernelpick.kernels``'s.
"""

import typing as _typing
import warnings as _warnings

from kernelpick.adapters._probe import default_caps, probe_device

__all__ = ["default_caps", "probe_device"]

# Moved to kernelpick.kernels in 0.3.0 (the launch table sits beside the families it names);
# these names go away in 0.4.0.
_MOVED = ("LAUNCHES", "Launch", "bind")


def __getattr__(name: str) -> _typing.Any:
    if name in _MOVED:
        _warnings.warn(
            f"kernelpick.adapters.{name} is deprecated and goes away in 0.4.0; "
            f"use kernelpick.kernels.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        from kernelpick import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'kernelpick.adapters' has no attribute {name!r}", name=name)
