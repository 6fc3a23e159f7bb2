"""The dtype a checkpoint's layers compute in, for ``inspect``, which makes each layer's
config in it: what ``config.json`` states (``formats.config_dtype``), or else the one float
dtype of every high-precision tensor the checkpoint stores.

``load_quantized`` computes in the dtype of the model it loads into: built from this
config, the config's dtype, or where it states none, one its builder picks (transformers'
``dtype="auto"`` takes the first float tensor it reads, an fp32 scale as readily as a
weight). The model's own weights are the high-precision tensors (the embedding, the norms,
the layers kept in high precision, the quantized layers' biases); a quantized layer's other
tensors are not (a scale is fp32 whatever the model's dtype), nor are FP8 or integer ones.
Where those hold two dtypes, or there are none, nothing says which dtype the layers compute
in: a ``CheckpointError`` asks for the config's ``dtype``, never a guess.
"""

from __future__ import annotations

from pathlib import Path

from kernelpick.core import HIGH_PRECISION, Dtype, UnknownNameError
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._found_layers import scaled_modules
from kernelpick.integration.checkpoints._safetensors_io import DTYPES
from kernelpick.integration.checkpoints._stored import Stored
from kernelpick.integration.formats import DTYPE_KEY, VALID_DTYPES, Layout

__all__ = ["activation_dtype"]

_SHOWN = 3  # names shown of each dtype's tensors


def _high_precision(layout: Layout, stored: Stored) -> dict[str, list[str]]:
    """The stored high-precision tensors' names (see the module), by safetensors dtype."""
    quantized = scaled_modules(layout, stored)
    found: dict[str, list[str]] = {}
    for name, (_, entry) in stored.entries.items():
        prefix, _, tensor = name.rpartition(".")
        dtype = DTYPES[entry.dtype]
        if prefix in quantized and tensor != "bias":
            continue
        if dtype.is_floating_point and dtype.itemsize > 1:
            found.setdefault(entry.dtype, []).append(name)
    return found


def _computed_in(stored_as: str) -> Dtype | None:
    """The dtype a layer computes in that a safetensors dtype is, or None (float64)."""
    try:
        dtype = Dtype.parse(DTYPES[stored_as])
    except UnknownNameError:
        return None
    return dtype if dtype in HIGH_PRECISION else None


def _listed(names: list[str]) -> str:
    more = f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def activation_dtype(
    where: Path, stated: tuple[str, Dtype] | None, layout: Layout, stored: Stored
) -> tuple[Dtype, str]:
    """The layers' activation dtype and where it came from (see the module): ``stated`` is
    what ``where``, ``config.json``, states (``formats.config_dtype``)."""
    if stated is not None:
        key, dtype = stated
        return dtype, f"config.json's {key}"
    found = _high_precision(layout, stored)
    if len(found) == 1:
        ((stored_as, names),) = found.items()
        one = _computed_in(stored_as)
        if one is not None:
            return one, (f"config.json states none; the one dtype of the {len(names)} "
                         f"high-precision tensors stored ({_listed(names)})")  # fmt: skip
    if found:
        held = "; ".join(f"{dtype}: {_listed(names)}" for dtype, names in found.items())
        stored_as = f"none, and high-precision tensors stored in {held}"
    else:
        stored_as = "none, and no high-precision tensor stored (only quantized layers)"
    raise CheckpointError(
        str(where), DTYPE_KEY, stored_as,
        f'a "{DTYPE_KEY}" in config.json, one of {VALID_DTYPES}: the dtype the layers '
        "compute in, which the stored tensors do not say (transformers' save_pretrained "
        "and kernelpick's save_quantized write it)",
    )  # fmt: skip
