"""What a checkpoint's quantization config says about its tensors: the scheme (and block
size) of its quantized layers, the name their weight scale is stored under, and which
modules it quantizes. ``_ct_config`` reads compressed-tensors' configs into one, and
``_hf_fp8_config`` transformers' FineGrainedFP8 ones."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.core._schemes import Scheme

__all__ = ["QUANTIZATION_CONFIG", "Layout", "Stored"]

QUANTIZATION_CONFIG = "quantization_config"  # the key in config.json, for either reader

# Whether the checkpoint stores a tensor of a module, by its name within the module.
Stored = Callable[[str], bool]


@attrs.frozen(kw_only=True)
class Layout:
    """A checkpoint's layout: ``scheme`` for every quantized layer, ``block_size`` for
    ``fp8_block`` (else None), and ``scale_name``, the stored name of each layer's
    canonical ``weight_scale``. ``where`` is the config file, for errors."""

    where: str
    scheme: Scheme
    block_size: int | None = None
    scale_name: str = "weight_scale"

    def stored_name(self, name: str) -> str:
        """The name the checkpoint stores a layer's canonical tensor ``name`` under."""
        return self.scale_name if name == "weight_scale" else name

    def role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        """True for a quantized layer of the checkpoint; for a linear it keeps in high
        precision, why; None for any other module."""
        raise NotImplementedError(f"{type(self).__name__} must define role")
