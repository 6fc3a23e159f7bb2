"""The dtype a model's ``config.json`` says its layers compute in: ``dtype``, which
transformers writes since 4.56 (``save_pretrained``: the model's own dtype), or
``torch_dtype``, which it wrote before. A config is untrusted input: the two keys naming
different dtypes, or a dtype no layer computes in, is a ``CheckpointError``. What a reader
does with a config that states none is its own rule, said where it applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernelpick.core import HIGH_PRECISION, Dtype, UnknownNameError
from kernelpick.integration._errors import CheckpointError

__all__ = ["DTYPE_KEY", "DTYPE_KEYS", "VALID_DTYPES", "config_dtype"]

DTYPE_KEY = "dtype"  # what transformers >= 4.56, the versions kernelpick runs with, write
DTYPE_KEYS = (DTYPE_KEY, "torch_dtype")
VALID_DTYPES = ", ".join(sorted(d.value for d in HIGH_PRECISION))


def config_dtype(where: str, config: Mapping[str, Any]) -> tuple[str, Dtype] | None:
    """The key ``config`` (read from ``where``) states its dtype under and the dtype, or
    None where it states none (both keys absent or null)."""
    stated = {key: config[key] for key in DTYPE_KEYS if config.get(key) is not None}
    if not stated:
        return None
    if len({str(value) for value in stated.values()}) > 1:
        raise CheckpointError(where, "dtype/torch_dtype", repr(stated),
                              "one dtype, or the same under both keys")  # fmt: skip
    key, value = next(iter(stated.items()))
    try:
        parsed: Dtype | None = Dtype.parse(value)
    except UnknownNameError:
        parsed = None
    if parsed is None or parsed not in HIGH_PRECISION:
        raise CheckpointError(
            where, key, repr(value), f"one of {VALID_DTYPES}: the dtype the layers compute in"
        )
    return key, parsed
