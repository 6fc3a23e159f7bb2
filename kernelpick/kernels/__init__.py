"""Kernel implementations (torch ops, cupy raw kernels), one family a module.

Depends on ``kernelpick.core`` only; adapters bind these launchers to a device.
"""

__all__: list[str] = []
