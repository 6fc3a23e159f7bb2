"""What a checkpoint's quantization config says about its tensors: the scheme (and block
size) of its quantized layers, the name their weight scale is stored under, and which
modules it quantizes. ``compressed_tensors`` reads compressed-tensors' configs into one,
and ``fine_grained_fp8`` transformers' FineGrainedFP8 ones. ``check_e8m0_dtype`` refuses,
from a file header, a tensor that cannot be an E8M0 scale."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.core import Scheme
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats._conv1d import CONV1D_KEPT, is_conv1d
from kernelpick.integration.layer import CheckpointFormat, Recipe
from kernelpick.kernels import E8M0_DTYPES

__all__ = [
    "QUANTIZATION_CONFIG",
    "Layout",
    "Stored",
    "check_e8m0_dtype",
]

QUANTIZATION_CONFIG = "quantization_config"  # the key in config.json, for either reader

# Whether the checkpoint stores a tensor of a module, by its name within the module.
Stored = Callable[[str], bool]


@attrs.frozen(kw_only=True)
class Layout:
    """A checkpoint's layout: ``scheme`` for every quantized layer, ``block_size`` for
    ``fp8_block`` (else None), ``scale_name``, the stored name of each layer's
    canonical ``weight_scale``, and an integer weight-only scheme's ``group_size``,
    ``symmetric`` and ``act_order``. ``where`` is the config file, for errors."""

    where: str
    scheme: Scheme
    block_size: int | None = None
    scale_name: str = "weight_scale"
    group_size: int | None = None
    symmetric: bool = True
    act_order: bool = False

    @property
    def recipe(self) -> Recipe:
        """What every quantized layer of the checkpoint is made with: its scheme and block
        size, pre-quantized (checked: a layout holds only what a reader accepted)."""
        return Recipe.of(
            self.scheme, checkpoint_format=CheckpointFormat.PRE_QUANTIZED,
            block_size=self.block_size, group_size=self.group_size, symmetric=self.symmetric,
            act_order=self.act_order,
        )  # fmt: skip

    def stored_name(self, name: str) -> str:
        """The name the checkpoint stores a layer's canonical tensor ``name`` under."""
        return self.scale_name if name == "weight_scale" else name

    def role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        """True for a quantized layer of the checkpoint; for a linear it keeps in high
        precision, why; None for any other module."""
        raise NotImplementedError(f"{type(self).__name__} must define role")

    def loaded_role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        """``role`` as ``load_quantized`` takes it: a transformers ``Conv1D`` it does not
        quantize is kept, with ``CONV1D_KEPT`` (one it quantizes is refused: loading swaps
        nn.Linear only)."""
        role = self.role(name, module, stored)
        return CONV1D_KEPT if is_conv1d(module) and role is not True else role

    def expected_role(self, name: str, module: torch.nn.Module) -> bool | str | None:
        """``role`` in a checkpoint that stores what this config says, as a plan made
        before anything is downloaded reads it."""
        raise NotImplementedError(f"{type(self).__name__} must define expected_role")

    @property
    def ignored(self) -> tuple[str, ...]:
        """The modules the config keeps in high precision, as it lists them (compressed-
        tensors' ``ignore``, ``modules_to_not_convert``)."""
        raise NotImplementedError(f"{type(self).__name__} must define ignored")


# An E8M0 scale is stored as its uint8 bytes (kernelpick.kernels.E8M0_STORED, as
# compressed-tensors' MXFP8 compressor stores it); a checkpoint storing float8_e8m0fnu
# itself holds the same bits. Nothing else can be read as E8M0.


def check_e8m0_dtype(where: str, dtype: torch.dtype | str) -> None:
    """Refuse, from the dtype alone (a safetensors header's, or safetensors' name for one
    torch lacks), a stored tensor that cannot be an E8M0 scale: ``CheckpointError`` naming
    ``where`` (the file and key) and the dtypes that are valid. Its values are
    ``accept``'s, once read."""
    if dtype not in E8M0_DTYPES:
        raise CheckpointError(
            where, "dtype", str(dtype),
            "torch.uint8 (E8M0 exponent bytes, as compressed-tensors stores MX scales) or "
            "torch.float8_e8m0fnu; no other dtype is read as E8M0 (is an fp32 value an "
            "exponent or a scale?)",
        )  # fmt: skip
