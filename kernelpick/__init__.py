"""kernelpick: choose, explain and run the GEMM kernel for a quantized (FP8) linear layer.

``import kernelpick as kp`` gives the pure decision API of ``kernelpick.core``; importing it
does not import torch or cupy. ``kp.probe`` imports torch when called.
"""

from kernelpick.core import *  # noqa: F403  (the public API is the core's, re-exported whole)
from kernelpick.core import DeviceCaps
from kernelpick.core import __all__ as _core_all

__version__ = "0.1.0"


def probe(device: object = None) -> DeviceCaps:
    """The ``DeviceCaps`` of a live device, probed once per device and cached.

    ``device``: None or ``"auto"`` for the current one (the current GPU if torch sees one,
    else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a GPU index or a ``torch.device``.
    """
    # Imported here, not at the top, so that `import kernelpick` stays free of torch.
    from kernelpick.adapters._probe import probe_device

    return probe_device(device)


__all__ = [*_core_all, "__version__", "probe"]
