"""A model's ``config.json``, read as untrusted input: one JSON object, no key given twice,
its ``model_type`` and ``architectures`` named, and the dtype its weights are stored in."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from kernelpick.core import HIGH_PRECISION, Dtype, UnknownNameError
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import QUANTIZATION_CONFIG

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
        what = ", ".join(self.architectures) or "no architectures"
        return f"{what} ({self.model_type}) from {self.path}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:  # json.loads would keep the last silently: read two ways
            raise ValueError(f"the key {key!r} is given twice")
        found[key] = value
    return found


def _path(where: str | Path) -> Path:
    path = Path(where)
    return path / CONFIG_NAME if path.is_dir() else path


def read_config(where: str | Path) -> ModelConfig:
    """The config at ``where``: a ``config.json`` file, or a directory holding one. A
    ``CheckpointError`` names what cannot be read."""
    path = _path(where)
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        expected = "a model's config.json (UTF-8 JSON), or a directory holding one"
        raise CheckpointError(
            shown, "", f"a file that cannot be read ({error})", expected
        ) from error
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as error:
        expected = "a model's config.json: one JSON object, each key once"
        raise CheckpointError(shown, "", f"text that is not JSON ({error})", expected) from error
    if not isinstance(data, dict):
        raise CheckpointError(shown, "", type(data).__name__, "one JSON object")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        expected = "the model's type, as transformers names it (e.g. 'llama')"
        raise CheckpointError(shown, "model_type", repr(model_type), expected)
    architectures = data.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise CheckpointError(shown, "architectures", repr(architectures),
                              "a list of transformers model class names")  # fmt: skip
    return ModelConfig(shown, data, model_type, tuple(architectures), _dtype(shown, data))


def _dtype(where: str, data: Mapping[str, Any]) -> Dtype:
    # transformers 5 writes "dtype", earlier versions "torch_dtype".
    found = [data[key] for key in ("dtype", "torch_dtype") if data.get(key) is not None]
    if not found:
        return _DEFAULT_DTYPE
    if len(set(map(str, found))) > 1:
        raise CheckpointError(
            where, "dtype/torch_dtype", repr(found), "one dtype, or the same twice"
        )
    valid = ", ".join(sorted(d.value for d in HIGH_PRECISION))
    try:
        dtype = Dtype.parse(found[0])
    except UnknownNameError:
        dtype = None
    if dtype not in HIGH_PRECISION:
        raise CheckpointError(where, "dtype", repr(found[0]), f"one of {valid}")
    return dtype
