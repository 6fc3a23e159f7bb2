"""A model's ``config.json``, read as untrusted input: one JSON object, no key given twice,
its ``model_type`` and ``architectures`` (one or more) named, and the dtype its weights
are stored in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from kernelpick.core import Dtype
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import QUANTIZATION_CONFIG, config_dtype, read_json_object

__all__ = ["CONFIG_NAME", "ModelConfig", "read_config"]

CONFIG_NAME = "config.json"
# A config without a dtype: what vLLM's dtype "auto" computes such a model in on a GPU.
_DEFAULT_DTYPE = Dtype.BFLOAT16


@attrs.frozen(eq=False)  # holds a dict
class ModelConfig:
    """A model's config: the file it was read from (``path``), its ``data`` as read, the
    ``model_type``, the ``architectures`` it names and the ``dtype`` of its weights."""

    path: str
    data: Mapping[str, Any]
    model_type: str
    architectures: tuple[str, ...]
    dtype: Dtype

    @property
    def quantization_config(self) -> object:
        """The checkpoint's own ``quantization_config``, or None."""
        return self.data.get(QUANTIZATION_CONFIG)

    def describe(self) -> str:
        return f"{', '.join(self.architectures)} ({self.model_type}) from {self.path}"


def _path(where: str | Path) -> Path:
    path = Path(where)
    return path / CONFIG_NAME if path.is_dir() else path


def read_config(where: str | Path) -> ModelConfig:
    """The config at ``where``: a ``config.json`` file, or a directory holding one. A
    ``CheckpointError`` names what cannot be read."""
    path = _path(where)
    shown = str(path)
    data = read_json_object(path, "a model's config.json (one JSON object, each key once)")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        expected = "the model's type, as transformers names it (e.g. 'llama')"
        raise CheckpointError(shown, "model_type", repr(model_type), expected)
    architectures = data.get("architectures")
    # Without one, transformers' AutoModel would build the bare backbone: no output head,
    # every name without the checkpoint's prefix, so ignore patterns would match nothing.
    # vLLM refuses such a config too.
    if (not isinstance(architectures, list) or not architectures
            or not all(isinstance(a, str) and a for a in architectures)):  # fmt: skip
        raise CheckpointError(
            shown, "architectures", repr(architectures),
            "a list naming the model's transformers class first (e.g. "
            "[\"LlamaForCausalLM\"]), as vLLM reads it",
        )  # fmt: skip
    return ModelConfig(shown, data, model_type, tuple(architectures), _dtype(shown, data))


def _dtype(where: str, data: Mapping[str, Any]) -> Dtype:
    stated = config_dtype(where, data)
    return _DEFAULT_DTYPE if stated is None else stated[1]
