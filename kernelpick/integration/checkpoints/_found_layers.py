"""What a checkpoint's headers show, for ``inspect``: every stored tensor (``read_stored``:
each file's header, each key in the file its index names, the tied aliases), the quantized
layers, the layers its config keeps in high precision, and the activations' dtype.

A quantized layer is a module whose weight scale is stored (``Layout.scale_name``): every
format read here stores one for each quantized layer and for nothing else. Its N x K is its
``weight``'s shape, or, for a pack-quantized layer, the two ints of its stored
``weight_shape``: the packed width ``ceil(K * bits / 32)`` words fits several K, so it is
only checked against them, never read as K. Either way the layer's stored weight must be
the dtype and shape its ``QuantConfig`` implies (``LayerPlan.params_of``), so the scheme
reported is the one the tensors hold. A layer kept in high precision is one the config's
``ignore`` or ``modules_to_not_convert`` names (``Layout.ignores``) that stores a 2-D float
``weight``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from kernelpick.core import (
    INTEGER_WEIGHT_ONLY,
    Dtype,
    KeptLayer,
    KernelpickError,
    QuantConfig,
)
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._headers import (
    FileHeader,
    TensorEntry,
    read_header,
    read_ints,
)
from kernelpick.integration.checkpoints._safetensors_io import (
    ALIASES,
    DTYPES,
    INDEX_NAME,
    checkpoint_files,
    read_aliases,
)
from kernelpick.integration.formats import Layout, config_dtype
from kernelpick.integration.layer import SHAPE_NAME, LayerPlan, Recipe

__all__ = [
    "KEPT_REASON",
    "QuantizedLayer",
    "Stored",
    "activation_dtype",
    "kept_layers",
    "quantized_layers",
    "read_stored",
]

KEPT_REASON = "ignored by the checkpoint's config"


@attrs.frozen
class Stored:
    """Every tensor a checkpoint stores, by name (the header and entry holding it), and
    the names saved as aliases of one (tied weights)."""

    directory: Path
    entries: Mapping[str, tuple[FileHeader, TensorEntry]]
    aliases: Mapping[str, str]

    def get(self, name: str) -> tuple[FileHeader, TensorEntry] | None:
        found = self.entries.get(name)
        return found if found is not None else self.entries.get(self.aliases.get(name, ""))

    def names(self) -> Iterator[str]:
        """Stored names in file order, then the aliases."""
        yield from self.entries
        yield from (name for name in self.aliases if name not in self.entries)


@attrs.frozen
class QuantizedLayer:
    """A quantized layer a checkpoint stores: its name and the ``QuantConfig`` its layout
    and N x K make."""

    name: str
    config: QuantConfig

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "weight_shape": list(self.config.weight_shape),
                "bias": self.config.bias, "config": self.config.render()}  # fmt: skip


def _where(found: tuple[FileHeader, TensorEntry]) -> str:
    return str(found[0].path)


def _stored_shape(stored: Stored, prefix: str) -> tuple[int, int]:
    """A pack-quantized layer's ``[N, K]``, as its ``weight_shape`` tensor holds it."""
    name = f"{prefix}.{SHAPE_NAME}"
    found = stored.get(name)
    if found is None:
        raise CheckpointError(
            str(stored.directory), name, "nothing",
            "the [N, K] a pack-quantized layer stores: K is not read from the packed width, "
            "which several K fill alike",
        )  # fmt: skip
    header, entry = found
    if entry.dtype not in ("I32", "I64") or entry.shape != (2,):
        raise CheckpointError(str(header.path), name, f"{entry.dtype} {list(entry.shape)}",
                              "I32 or I64 [2]: the layer's N and K")  # fmt: skip
    values = read_ints(header, entry)
    if not all(value > 0 for value in values):
        raise CheckpointError(str(header.path), name, str(list(values)), "two positive ints")
    return values[0], values[1]


def _located(
    layout: Layout, stored: Stored, prefix: str, weight: str
) -> tuple[FileHeader, TensorEntry, int, int]:
    """A quantized layer's stored weight, and its N and K."""
    found = stored.get(f"{prefix}.{weight}")
    if found is None:
        raise CheckpointError(str(stored.directory), f"{prefix}.{weight}", "nothing",
                              f"the weight of a layer with a {layout.scale_name}")  # fmt: skip
    header, entry = found
    if layout.scheme in INTEGER_WEIGHT_ONLY:
        return (header, entry, *_stored_shape(stored, prefix))
    if len(entry.shape) != 2:
        raise CheckpointError(str(header.path), entry.name, f"shape {list(entry.shape)}",
                              "a weight [N, K]")  # fmt: skip
    return header, entry, entry.shape[0], entry.shape[1]


def _config(
    recipe: Recipe, header: FileHeader, entry: TensorEntry, shape: tuple[int, int], bias: bool,
    dtype: Dtype,
) -> QuantConfig:  # fmt: skip
    """The layer's config, its stored weight checked to be the one the config implies."""
    n, k = shape
    try:
        config = recipe.config(n, k, dtype, bias=bias)
    except KernelpickError as error:
        raise CheckpointError(f"{header.path}: {entry.name}", "shape", f"[{n}, {k}]",
                              str(error)) from error  # fmt: skip
    name = entry.name.rpartition(".")[2]
    params = LayerPlan.params_of(config, (n,), torch.bfloat16, online=False)
    wanted = next(p for p in params if p.name == name)
    if DTYPES[entry.dtype] != wanted.dtype or entry.shape != wanted.shape:
        dtype_name = str(wanted.dtype).removeprefix("torch.")
        raise CheckpointError(
            str(header.path), entry.name, f"{entry.dtype} {list(entry.shape)}",
            f"{dtype_name} {list(wanted.shape)}, what {recipe.scheme.value} stores for "
            f"[{n}, {k}] ({config.render()})",
        )  # fmt: skip
    return config


def quantized_layers(layout: Layout, stored: Stored, dtype: Dtype) -> tuple[QuantizedLayer, ...]:
    """Each layer whose weight scale ``stored`` holds, in file order, its config made in
    ``dtype``; a ``CheckpointError`` for one the config keeps in high precision, one
    without its weight, or one whose weight is not what its config implies."""
    suffix = f".{layout.scale_name}"
    weight = "weight_packed" if layout.scheme in INTEGER_WEIGHT_ONLY else "weight"
    recipe = layout.recipe
    # Made once a distinct layer: a checkpoint of thousands of experts has a few shapes.
    made: dict[tuple[object, ...], QuantConfig] = {}
    layers = []
    for name in stored.entries:
        if not name.endswith(suffix):
            continue
        prefix = name.removesuffix(suffix)
        if layout.ignores(prefix):
            raise CheckpointError(
                _where(stored.entries[name]), name, "a scale for a module the config keeps "
                "in high precision", f"no {layout.scale_name} for {prefix}, or a config that "
                f"does not keep it ({', '.join(layout.ignored)})",
            )  # fmt: skip
        header, entry, n, k = _located(layout, stored, prefix, weight)
        bias = stored.get(f"{prefix}.bias") is not None
        key = (n, k, bias, entry.dtype, entry.shape)
        if key not in made:
            made[key] = _config(recipe, header, entry, (n, k), bias, dtype)
        layers.append(QuantizedLayer(prefix, made[key]))
    return tuple(layers)


def kept_layers(
    layout: Layout, stored: Stored, quantized: tuple[QuantizedLayer, ...]
) -> tuple[KeptLayer, ...]:
    """The modules the config keeps in high precision whose 2-D float ``weight`` is stored
    (an alias of another tensor counts: a head tied to the embedding)."""
    taken = {layer.name for layer in quantized}
    kept = []
    for name in stored.names():
        prefix = name.removesuffix(".weight")
        if prefix == name or prefix in taken or not layout.ignores(prefix):
            continue
        found = stored.get(name)
        if found is None or len(found[1].shape) != 2:
            continue
        dtype = DTYPES[found[1].dtype]
        if dtype.is_floating_point and dtype.itemsize > 1:  # not FP8: a quantized weight
            n, k = found[1].shape
            kept.append(KeptLayer(prefix, (n, k), dtype.itemsize, KEPT_REASON))
    return tuple(kept)


def activation_dtype(where: Path, config: dict[str, Any]) -> tuple[Dtype, str]:
    """The layers' activation dtype, as config.json states it (``formats.config_dtype``),
    and where it came from."""
    stated = config_dtype(str(where), config)
    if stated is None:
        return Dtype.BFLOAT16, "assumed: config.json states no dtype"
    key, dtype = stated
    return dtype, f"config.json's {key}"


def read_stored(root: Path) -> tuple[Stored, tuple[FileHeader, ...]]:
    """Every file's header, each key where the index (if any) says it is, and the aliases."""
    entries: dict[str, tuple[FileHeader, TensorEntry]] = {}
    aliases: dict[str, str] = {}
    headers = []
    for path, keys in checkpoint_files(root).items():
        header = read_header(path)
        names = {entry.name for entry in header.tensors}
        missing = sorted((keys or set()) - names)
        if missing:
            raise CheckpointError(str(path), "tensors", f"none for {', '.join(missing[:5])}",
                                  f"the tensors {INDEX_NAME} lists for it")  # fmt: skip
        for entry in header.tensors:
            if keys is not None and entry.name not in keys:
                raise CheckpointError(
                    str(path), entry.name, "a tensor the index maps to another file, or none",
                    f"only the tensors {INDEX_NAME} maps to {path.name}",
                )  # fmt: skip
            entries[entry.name] = (header, entry)
        aliases.update(read_aliases(path, dict(header.metadata)))
        headers.append(header)
    for alias, target in aliases.items():
        if alias in entries or target not in entries:
            found = f"{alias} -> {target}" + (", both stored" if alias in entries else
                                              ", which no file stores")  # fmt: skip
            raise CheckpointError(str(root), ALIASES, found,
                                  "an unstored name for a stored tensor")  # fmt: skip
    return Stored(root, entries, aliases), tuple(headers)
