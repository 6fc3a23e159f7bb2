"""kernelpick: choose, explain and run the GEMM kernel for a quantized (FP8) linear layer.

``import kernelpick as kp`` gives the pure decision API of ``kernelpick.core``; importing it
does not import torch or cupy.
"""

from kernelpick.core import *  # noqa: F403  (the public API is the core's, re-exported whole)
from kernelpick.core import __all__ as _core_all

__version__ = "0.1.0"

__all__ = [*_core_all, "__version__"]
