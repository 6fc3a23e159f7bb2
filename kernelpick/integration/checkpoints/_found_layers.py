"""What a checkpoint's stored tensors (``_stored``) show, for ``inspect``: its quantized
layers and the layers it keeps in high precision.

Each module is decided by its layout's own rule, ``Layout.role``, as ``load_quantized``
decides it (``Layout.loaded_role``), the module read as its name says
(``formats.stand_in``: an embedding, an MoE router, GPT-2's Conv1D by config.json's model
type, or a linear) since headers hold names, not modules. A Conv1D is kept, its N x K its
stored K x N transposed; one with a stored scale is refused, as loading refuses it.

A quantized layer is a module whose weight scale is stored (``Layout.scale_name``,
``scaled_modules``) and whose role is quantized. Its N x K is its ``weight``'s shape,
or, for a pack-quantized layer, the two ints of its stored ``weight_shape``: the packed
width ``ceil(K * bits / 32)`` words fits several K, so it is only checked against them,
never read as K. Either way the layer's stored weight must be the dtype and shape its
``QuantConfig`` implies (``LayerPlan.params_of``), so the scheme reported is the one the
tensors hold. Every other module storing a 2-D weight is decided by the same rule: one
it quantizes, whose scale is not stored, is refused (compressed-tensors: its config
targets it, and loading refuses it too); one it keeps in high precision (an ``ignore``
or ``modules_to_not_convert`` entry; in FineGrainedFP8, any linear stored without a
scale) is a ``KeptLayer`` with the rule's reason, its weight a high-precision float, as
loading requires.
"""

from __future__ import annotations

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
from kernelpick.integration.checkpoints._headers import FileHeader, TensorEntry, read_ints
from kernelpick.integration.checkpoints._safetensors_io import DTYPES
from kernelpick.integration.checkpoints._stored import Stored
from kernelpick.integration.formats import Layout, is_conv1d, moe_block, stand_in
from kernelpick.integration.layer import SHAPE_NAME, LayerPlan

__all__ = [
    "Located",
    "QuantizedLayer",
    "Roles",
    "kept_layers",
    "located_layers",
    "quantized_layers",
    "scaled_modules",
]


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
    layout: Layout, header: FileHeader, entry: TensorEntry, shape: tuple[int, int], bias: bool,
    dtype: Dtype,
) -> tuple[QuantConfig, frozenset[str]]:  # fmt: skip
    """The layer's config, its stored weight checked to be the one the config implies, and
    the names the layer may store its tensors under (its params', a bias)."""
    recipe = layout.recipe
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
    shape_name = [SHAPE_NAME] if layout.scheme in INTEGER_WEIGHT_ONLY else []  # N and K
    return config, frozenset({*(layout.stored_name(p.name) for p in params), "bias", *shape_name})


def scaled_modules(layout: Layout, stored: Stored) -> dict[str, str]:
    """Each module whose weight scale ``stored`` holds, in file order: the scale's name."""
    suffix = f".{layout.scale_name}"
    return {name.removesuffix(suffix): name for name in stored.entries if name.endswith(suffix)}


@attrs.frozen
class Roles:
    """Each module's role in a checkpoint by its ``layout``'s rule, as loading decides it
    (see the module): read once for the checkpoint, for its quantized and kept layers."""

    layout: Layout
    stored: Stored
    moe_blocks: frozenset[str]  # the modules holding stored experts: a gate there routes
    conv1d: frozenset[str]  # the names that are Conv1D in the model (formats.conv1d_names)

    @classmethod
    def read(cls, layout: Layout, stored: Stored, conv1d: frozenset[str]) -> Roles:
        found = ((name, stored.get(name)) for name in stored.names())
        held = (moe_block(name, len(at[1].shape)) for name, at in found if at is not None)
        return cls(layout, stored, frozenset(block for block in held if block is not None),
                   conv1d)  # fmt: skip

    def module(self, prefix: str) -> torch.nn.Module:
        """What the module ``prefix`` is read as (``formats.stand_in``)."""
        return stand_in(prefix, self.moe_blocks, self.conv1d)

    def role(self, prefix: str) -> bool | str | None:
        """``Layout.loaded_role`` of the module ``prefix``, read as its name says."""

        def held(tensor: str) -> bool:
            return self.stored.get(f"{prefix}.{tensor}") is not None

        return self.layout.loaded_role(prefix, self.module(prefix), held)

    def read_as(self, prefix: str) -> str:
        """What ``stand_in`` reads the module as, in words."""
        module = self.module(prefix)
        if is_conv1d(module):
            return "a transformers Conv1D, by config.json's model type"
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            return f"an nn.{type(module).__name__}"
        return "an MoE router, which is no nn.Linear"


@attrs.frozen
class Located:
    """A quantized layer as its headers show it, before its config is made (that takes
    the activations' dtype): its stored weight, its N x K, and whether a bias is stored."""

    name: str
    header: FileHeader
    entry: TensorEntry
    shape: tuple[int, int]
    bias: bool
    tensors: tuple[tuple[str, str], ...]  # each tensor stored under it: its name, its file


def located_layers(roles: Roles) -> tuple[Located, ...]:
    """Each layer whose weight scale is stored, in file order; a ``CheckpointError`` for a
    scale of a module the layout does not quantize or one without its weight."""
    layout, stored = roles.layout, roles.stored
    weight = "weight_packed" if layout.scheme in INTEGER_WEIGHT_ONLY else "weight"
    scaled = scaled_modules(layout, stored)
    held: dict[str, list[tuple[str, str]]] = {prefix: [] for prefix in scaled}
    for name, at in stored.entries.items():
        prefix, _, tensor = name.rpartition(".")
        held.get(prefix, []).append((tensor, _where(at)))
    layers = []
    for prefix, scale in scaled.items():
        role = roles.role(prefix)  # FineGrainedFP8's rule refuses a kept module's scale itself
        if is_conv1d(roles.module(prefix)):  # loading swaps nn.Linear only
            raise CheckpointError(
                _where(stored.entries[scale]), scale, f"a scale for {roles.read_as(prefix)}",
                f"no {layout.scale_name} for {prefix}: kernelpick loads nn.Linear layers "
                "only, and keeps a Conv1D in high precision",
            )  # fmt: skip
        if role is not True:
            found = ("a scale for a module the config keeps in high precision" if role else
                     f"a scale for a module the config does not quantize, read by its name "
                     f"as {roles.read_as(prefix)}")  # fmt: skip
            raise CheckpointError(
                _where(stored.entries[scale]), scale, found,
                f"no {layout.scale_name} for {prefix}, or a config that quantizes it",
            )  # fmt: skip
        header, entry, n, k = _located(layout, stored, prefix, weight)
        bias = stored.get(f"{prefix}.bias") is not None
        layers.append(Located(prefix, header, entry, (n, k), bias, tuple(held[prefix])))
    return tuple(layers)


def quantized_layers(
    layout: Layout, located: tuple[Located, ...], dtype: Dtype
) -> tuple[QuantizedLayer, ...]:
    """Each located layer with its config made in ``dtype``; a ``CheckpointError`` for one
    whose weight is not what its config implies, or that stores a tensor its scheme does
    not have (loading refuses it: an ``input_scale`` under dynamic activations would be
    dropped, a ``weight_zero_point`` under a symmetric scheme misread)."""
    # Made once a distinct layer: a checkpoint of thousands of experts has a few shapes.
    made: dict[tuple[object, ...], tuple[QuantConfig, frozenset[str]]] = {}
    layers = []
    for layer in located:
        key = (layer.shape, layer.bias, layer.entry.dtype, layer.entry.shape)
        if key not in made:
            made[key] = _config(layout, layer.header, layer.entry, layer.shape, layer.bias, dtype)
        config, names = made[key]
        extra = [(tensor, path) for tensor, path in layer.tensors if tensor not in names]
        if extra:
            raise CheckpointError(
                extra[0][1], f"{layer.name}.{extra[0][0]}", "a tensor of the layer",
                f"only what {layout.scheme.value} stores for it ({config.render()}): "
                f"{', '.join(sorted(names))}",
            )  # fmt: skip
        layers.append(QuantizedLayer(layer.name, config))
    return tuple(layers)


def kept_layers(roles: Roles, quantized: tuple[Located, ...]) -> tuple[KeptLayer, ...]:
    """Every other module storing a 2-D ``weight`` or ``weight_packed`` (an alias of
    another tensor counts: a head tied to the embedding; an alias of a quantized layer's
    weight is that layer at another path) that the layout keeps in high
    precision, with its reason; a ``CheckpointError`` for one the layout quantizes (its
    scale is not stored) or keeps with a weight that is no high-precision float."""
    layout, stored = roles.layout, roles.stored
    taken = {layer.name for layer in quantized}
    kept = []
    for name in stored.names():
        prefix, _, tensor = name.rpartition(".")
        found = stored.get(name)
        # The root module is the model, which loading never replaces.
        if tensor not in ("weight", "weight_packed") or not prefix or prefix in taken:
            continue
        # save_quantized stores a quantized module reachable at two paths once, the other
        # path's tensors its aliases: loading reads it as one layer, at its first path.
        if stored.aliases.get(name, "").rpartition(".")[0] in taken:
            continue
        if found is None:
            continue
        header, entry = found
        role = None if len(entry.shape) != 2 else roles.role(prefix)
        if role is None:
            continue
        stored_as = f"{entry.dtype} {list(entry.shape)}, and no {layout.scale_name}"
        conv1d = is_conv1d(roles.module(prefix))
        if not isinstance(role, str) and conv1d:  # compressed-tensors: targets naming it
            raise CheckpointError(
                str(header.path), name, stored_as,
                f"an ignore entry naming {prefix}, or targets that leave it: it is read as "
                f"{roles.read_as(prefix)}, and loading swaps nn.Linear only",
            )  # fmt: skip
        if not isinstance(role, str):  # compressed-tensors: its targets match it, no ignore
            raise CheckpointError(
                str(header.path), name, stored_as,
                f"{prefix}.{layout.scale_name} beside it, as the config quantizes {prefix} "
                f"(read by its name as {roles.read_as(prefix)}); or an ignore entry naming "
                "it, to keep it in high precision",
            )  # fmt: skip
        dtype = DTYPES[entry.dtype]
        if tensor != "weight" or not (dtype.is_floating_point and dtype.itemsize > 1):
            raise CheckpointError(
                str(header.path), name, stored_as,
                f"a float weight of 16 bits or more, which loading casts to the model's "
                f"dtype: the module is kept in high precision ({role})",
            )  # fmt: skip
        n, k = entry.shape[::-1] if conv1d else entry.shape  # a Conv1D stores K x N
        kept.append(KeptLayer(prefix, (n, k), dtype.itemsize, role))
    return tuple(kept)
