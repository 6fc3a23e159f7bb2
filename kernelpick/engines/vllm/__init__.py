"""kernelpick inside vLLM: a quantization config named ``"kernelpick"``, registered through
vLLM's ``vllm.general_plugins`` entry point (``register``).

vLLM finds the entry point in every process it starts, as long as kernelpick is installed
in its environment and ``VLLM_PLUGINS`` (when set) names ``kernelpick``. A model then uses
it with ``quantization="kernelpick"`` (online quantization of a high-precision checkpoint,
``fp8_per_channel`` by default) or through its checkpoint's ``quantization_config``::

    {"quant_method": "kernelpick", "scheme": "fp8_per_channel"}

Each linear layer selects its kernel with ``kp.choose`` for this rank's partition before
any weight is allocated; a layer no kernel can run raises ``KernelSelectionError`` with
every kernel's reason. Weights load through vLLM's own parameter classes and loaders
(tensor-parallel narrowing, fused q/k/v and gate/up shards), then are quantized by
kernelpick; a row-parallel per-channel (or any per-tensor) layer agrees on its weight
scales over vLLM's tensor-parallel group.

A compressed-tensors checkpoint (FP8-dynamic, and the other schemes kernelpick's reader
accepts) stays vLLM's own unless the user asks for kernelpick with
``quantization="kernelpick"``: then ``override_quantization_method`` claims it and its
FP8 weights and scales load as they are (``checkpoint_format="pre_quantized"``).
Installing kernelpick never takes a checkpoint away from vLLM's own support.

This module does not import vLLM: ``register`` and the classes below do, when first used.
Without vLLM they raise ``VllmUnavailableError``.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from kernelpick.core import KernelpickError

if TYPE_CHECKING:  # typed for mypy; imported lazily at run time (see __getattr__)
    from kernelpick.engines.vllm._config import (
        KernelpickConfig as KernelpickConfig,
    )
    from kernelpick.engines.vllm._config import (
        KernelpickLinearMethod as KernelpickLinearMethod,
    )

__all__ = [
    "QUANTIZATION_NAME",
    "KernelpickConfig",
    "KernelpickLinearMethod",
    "VllmUnavailableError",
    "register",
]

# The name vLLM knows the config by: ``quantization=`` and a checkpoint's ``quant_method``.
QUANTIZATION_NAME = "kernelpick"

_LAZY = ("KernelpickConfig", "KernelpickLinearMethod")


class VllmUnavailableError(KernelpickError):
    """The vLLM plugin was used where vLLM cannot be imported."""

    def __init__(self, cause: BaseException | None = None) -> None:
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(
            "kernelpick.engines.vllm needs vLLM, which cannot be imported here" + detail
            + ": install it (pip install 'kernelpick[vllm]') in the environment vLLM runs in"
        )  # fmt: skip


def _config_module() -> Any:
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailableError()
    try:
        from kernelpick.engines.vllm import _config as _vllm_config
    except ImportError as error:
        raise VllmUnavailableError(error) from error
    return _vllm_config


def register() -> None:
    """Register the ``"kernelpick"`` quantization config with vLLM (the entry point vLLM's
    ``load_general_plugins`` calls). Calling it again does nothing new. Raises
    ``VllmUnavailableError`` where vLLM cannot be imported."""
    _config_module().register_config(QUANTIZATION_NAME)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(_config_module(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
