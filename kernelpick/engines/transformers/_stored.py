"""What a high-precision checkpoint's files hold, read before transformers loads a tensor
of them: a quantize-on-load must not be handed a checkpoint that is quantized already.

transformers casts every stored tensor to the model's dtype before the quantize op (or a
module kept in high precision) sees it, and renames keys on the way (``key_mapping``, a
model's conversion mapping, the base model's prefix). So FP8 or int8 bytes would arrive as
plausible values without their scale, under a name kernelpick cannot map back. The check
reads what is stored, not where it goes: an FP8 tensor anywhere, an int8 or uint8 weight,
or a quantization scale (a ``weight_scale``, FineGrainedFP8's ``weight_scale_inv``, an
``input_scale``) says the checkpoint is quantized, and it is refused whole.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import torch
from safetensors import SafetensorError, safe_open

from kernelpick.integration import CheckpointError

__all__ = ["check_high_precision"]

_FP8 = ("F8_E4M3", "F8_E5M2", "F8_E8M0")  # safetensors' names
_INTEGER = ("I8", "U8")
_TORCH = {
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8", torch.uint8: "U8",
}  # fmt: skip
_SCALES = (".weight_scale", ".weight_scale_inv", ".input_scale", ".weight_packed",
           ".weight_zero_point", ".weight_g_idx")  # pack-quantized's tensors too  # fmt: skip
_EXPECTED = (
    "a high-precision checkpoint to quantize on load: this one is quantized already. Load it "
    "with its own quantization_config (compressed-tensors, FineGrainedFP8), or with "
    "kernelpick.integration.load_quantized"
)


def _safetensors(file: str) -> Iterator[tuple[str, str]]:
    try:
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118  # a safetensors handle
                yield key, handle.get_slice(key).get_dtype()
    except (OSError, SafetensorError) as error:
        raise CheckpointError(file, "", str(error), "a safetensors file") from error


def _pickled(file: str) -> Iterator[tuple[str, str]]:
    """A torch.save file's tensors, memory-mapped where it allows (no data is read)."""
    try:
        try:
            state = torch.load(file, mmap=True, weights_only=True, map_location="cpu")
        except RuntimeError:  # a file from before torch's zip format cannot be mapped
            state = torch.load(file, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, pickle.UnpicklingError) as error:
        raise CheckpointError(file, "", str(error), "a torch.save checkpoint") from error
    if isinstance(state, dict):
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield str(key), _TORCH.get(value.dtype, str(value.dtype))


def _quantized(key: str, dtype: str) -> bool:
    return dtype in _FP8 or (dtype in _INTEGER and key.endswith(".weight")) or key.endswith(_SCALES)


def check_high_precision(files: object) -> None:
    """Refuse, before anything loads, checkpoint ``files`` (transformers' list) that hold a
    quantized tensor; see the module. A file of another kind (gguf) is not read here."""
    if not isinstance(files, (list, tuple)):
        return
    for file in (str(f) for f in files):
        if file.endswith(".safetensors"):
            stored = _safetensors(file)
        elif file.endswith((".bin", ".pt", ".pth")):
            stored = _pickled(file)
        else:
            continue
        for key, dtype in stored:
            if _quantized(key, dtype):
                raise CheckpointError(file, key, f"{dtype} (quantized already)", _EXPECTED)
