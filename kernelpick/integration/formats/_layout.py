"""What a checkpoint's quantization config says about its tensors: the scheme (and block
size) of its quantized layers, the name their weight scale is stored under, and which
modules it quantizes. ``compressed_tensors`` reads compressed-tensors' configs into one,
and ``fine_grained_fp8`` transformers' FineGrainedFP8 ones. Also how a checkpoint stores an E8M0
scale (uint8 bytes), both ways: ``encode_e8m0_scale`` and ``decode_e8m0_scale``."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.core import InvalidValueError, Scheme
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.layer import CheckpointFormat, Recipe

__all__ = [
    "E8M0_STORED_DTYPE",
    "QUANTIZATION_CONFIG",
    "Layout",
    "Stored",
    "check_e8m0_dtype",
    "decode_e8m0_scale",
    "encode_e8m0_scale",
]

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

    @property
    def recipe(self) -> Recipe:
        """What every quantized layer of the checkpoint is made with: its scheme and block
        size, pre-quantized (checked: a layout holds only what a reader accepted)."""
        return Recipe.of(
            self.scheme, checkpoint_format=CheckpointFormat.PRE_QUANTIZED,
            block_size=self.block_size,
        )  # fmt: skip

    def stored_name(self, name: str) -> str:
        """The name the checkpoint stores a layer's canonical tensor ``name`` under."""
        return self.scale_name if name == "weight_scale" else name

    def role(self, name: str, module: torch.nn.Module, stored: Stored) -> bool | str | None:
        """True for a quantized layer of the checkpoint; for a linear it keeps in high
        precision, why; None for any other module."""
        raise NotImplementedError(f"{type(self).__name__} must define role")


# How a checkpoint stores an E8M0 scale (mxfp8's weight_scale): as uint8 bytes, the bits of
# torch.float8_e8m0fnu (the value is 2 ** (byte - 127)). Why: compressed-tensors' MXFP8
# compressor (MXFP8QuantizationCompressor, scale_dtype torch.uint8) writes and reads them so.
E8M0_STORED_DTYPE = torch.uint8
_E8M0 = torch.float8_e8m0fnu
_E8M0_NAN = 0xFF  # E8M0 has no zero and no infinity: its one special byte is NaN
_READABLE = (E8M0_STORED_DTYPE, _E8M0)  # a reader takes either; kernelpick writes uint8


def encode_e8m0_scale(key: str, scale: torch.Tensor) -> torch.Tensor:
    """The tensor a checkpoint stores for the canonical E8M0 scale ``scale`` (``key``, its
    name, is for errors): the same bytes viewed as uint8, no value changed. Anything but
    float8_e8m0fnu is an ``InvalidValueError``."""
    if scale.dtype != _E8M0:
        raise InvalidValueError(
            f"dtype of {key}", str(scale.dtype),
            "torch.float8_e8m0fnu: an E8M0 scale is stored as its bytes, never converted",
        )  # fmt: skip
    return scale.view(E8M0_STORED_DTYPE)


def check_e8m0_dtype(where: str, dtype: torch.dtype | str) -> None:
    """Refuse, from the dtype alone (a safetensors header's, or safetensors' name for one
    torch lacks), a stored tensor that cannot be an E8M0 scale: ``CheckpointError`` naming
    ``where`` (the file and key) and the dtypes that are valid."""
    if dtype not in _READABLE:
        raise CheckpointError(
            where, "dtype", str(dtype),
            "torch.uint8 (E8M0 exponent bytes, as compressed-tensors stores MX scales) or "
            "torch.float8_e8m0fnu; no other dtype is read as E8M0 (is an fp32 value an "
            "exponent or a scale?)",
        )  # fmt: skip


def decode_e8m0_scale(where: str, stored: torch.Tensor) -> torch.Tensor:
    """The canonical float8_e8m0fnu scale a checkpoint's tensor ``stored`` holds: uint8
    bytes viewed as E8M0, an E8M0 tensor as it is. Another dtype (``check_e8m0_dtype``) or
    a NaN byte (0xFF) is a ``CheckpointError`` naming ``where`` (the file and key)."""
    check_e8m0_dtype(where, stored.dtype)
    nan = stored.view(torch.uint8) == _E8M0_NAN
    if bool(nan.any()):
        at = [int(i) for i in nan.nonzero()[0]]
        raise CheckpointError(
            where, "values", f"NaN (byte 0xFF) at {at}",
            "E8M0 exponent bytes 0-254 (2 ** (byte - 127)): 0xFF is E8M0's NaN, no scale",
        )  # fmt: skip
    return stored.view(_E8M0)
