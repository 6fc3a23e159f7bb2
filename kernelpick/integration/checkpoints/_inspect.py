"""What a checkpoint directory holds, from its config and its safetensors headers alone:
``inspect_checkpoint`` (``kernelpick inspect``) reads no tensor's data but the two ints of
each pack-quantized layer's ``weight_shape``, so a checkpoint of hundreds of GB inspects
in about the time its headers take to read.

It reports the format (compressed-tensors and its ``format``, transformers'
FineGrainedFP8, kernelpick's own format_version 1, or not quantized), the scheme and its
settings, the modules the config keeps in high precision, the tensors and their bytes by
dtype per file and in total, and each quantized layer's N x K; given a device, what each
layer would run there (a ``ModelSummary``). A checkpoint is untrusted input: whatever
cannot be read one way only is a ``CheckpointError`` naming the file and the entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from kernelpick.core import (
    INTEGER_WEIGHT_ONLY,
    PER_CHANNEL_GROUP,
    SCHEMA_VERSION,
    DeviceCaps,
    Dtype,
    KeptLayer,
    ModelSummary,
    Policy,
    Scheme,
    choose,
    collapse_names,
)
from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.checkpoints._activation_dtype import activation_dtype
from kernelpick.integration.checkpoints._found_layers import (
    QuantizedLayer,
    Roles,
    kept_layers,
    located_layers,
    quantized_layers,
)
from kernelpick.integration.checkpoints._safetensors_io import read_json
from kernelpick.integration.checkpoints._save_load import CONFIG_NAME
from kernelpick.integration.checkpoints._stored import read_stored
from kernelpick.integration.formats import (
    QUANTIZATION_CONFIG,
    Layout,
    config_dtype,
    conv1d_names,
    read_layout,
)
from kernelpick.integration.formats import compressed_tensors as ct
from kernelpick.integration.formats import kernelpick_v1 as v1

__all__ = ["CheckpointInfo", "DtypeTally", "FileTally", "inspect_checkpoint"]


@attrs.frozen
class DtypeTally:
    """The tensors of one safetensors ``dtype`` and their bytes (elements x element size)."""

    dtype: str
    tensors: int
    bytes: int

    @classmethod
    def summed(cls, parts: Iterable[tuple[str, int, int]]) -> tuple[DtypeTally, ...]:
        """(dtype, tensors, bytes) parts summed into one tally a dtype, the largest first."""
        counts: dict[str, tuple[int, int]] = {}
        for dtype, tensors, size in parts:
            had_tensors, had_size = counts.get(dtype, (0, 0))
            counts[dtype] = (had_tensors + tensors, had_size + size)
        tallies = (cls(dtype, tensors, size) for dtype, (tensors, size) in counts.items())
        return tuple(sorted(tallies, key=lambda t: (-t.bytes, t.dtype)))


@attrs.frozen
class FileTally:
    """One safetensors file: its ``name``, its ``size`` on disk (header included) and its
    tensors by dtype."""

    name: str
    size: int
    by_dtype: tuple[DtypeTally, ...]

    @property
    def tensors(self) -> int:
        return sum(t.tensors for t in self.by_dtype)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.by_dtype)

    def to_dict(self) -> dict[str, Any]:
        by_dtype = {t.dtype: {"tensors": t.tensors, "bytes": t.bytes} for t in self.by_dtype}
        return {"name": self.name, "size": self.size, "tensors": self.tensors,
                "bytes": self.bytes, "by_dtype": by_dtype}  # fmt: skip


def _describe(layout: Layout | None) -> tuple[str, dict[str, Any]]:
    """The format in words, and its record."""
    if layout is None:
        return "not quantized (config.json has no quantization_config)", {}
    if isinstance(layout, ct.CompressedTensorsLayout):
        return (f"compressed-tensors, format {layout.format}",
                {"quant_method": ct.METHOD, "format": layout.format})  # fmt: skip
    if isinstance(layout, v1.KernelpickV1Layout):
        return (f"kernelpick's own, format_version {v1.FORMAT_VERSION} (before it wrote "
                "compressed-tensors)", {"quant_method": v1.METHOD,
                                        "format_version": v1.FORMAT_VERSION})  # fmt: skip
    # read_layout's one other reader
    return 'transformers\' FineGrainedFP8 (quant_method "fp8")', {"quant_method": "fp8"}


def _settings(layout: Layout) -> dict[str, Any]:
    """The scheme's settings where they apply (None where they do not)."""
    integer = layout.scheme in INTEGER_WEIGHT_ONLY
    return {
        "scheme": layout.scheme.value,
        "block_size": layout.block_size if layout.scheme is Scheme.FP8_BLOCK else None,
        "group_size": layout.group_size if integer else None,
        "symmetric": layout.symmetric if integer else None,
        "act_order": layout.act_order if integer else None,
    }


def _scheme_words(settings: dict[str, Any]) -> str:
    words = [settings["scheme"]]
    if settings["block_size"] is not None:
        words.append(f"blocks of {settings['block_size']} x {settings['block_size']}")
    if settings["group_size"] is not None:
        size = settings["group_size"]
        words.append("per channel" if size == PER_CHANNEL_GROUP else f"groups of {size} along K")
        words.append("symmetric" if settings["symmetric"] else "asymmetric (zero points)")
        words.append("act-order (g_idx)" if settings["act_order"] else "no act-order")
    return ", ".join(words)


def _aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [(indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                                row[-1]])).rstrip() for row in rows]  # fmt: skip


@attrs.frozen
class CheckpointInfo:
    """What a checkpoint directory holds (see the module); ``summary`` is what its layers
    would run on a device, once ``on`` asked."""

    directory: str
    layout: Layout | None
    dtype: Dtype | None  # the activations' dtype the layers' configs are made in
    dtype_source: str
    files: tuple[FileTally, ...]
    layers: tuple[QuantizedLayer, ...]
    kept: tuple[KeptLayer, ...]
    aliases: tuple[tuple[str, str], ...]
    summary: ModelSummary | None = None

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> CheckpointInfo:
        """The checkpoint in ``directory``, from config.json and the safetensors headers
        (``model.safetensors``, or the index and its shards); ``CheckpointError`` naming
        the file and entry for anything that cannot be read one way only."""
        root = Path(directory)
        if not root.is_dir():
            expected = f"a checkpoint directory: {CONFIG_NAME} and safetensors files"
            raise CheckpointError(str(root), "directory", "no such directory", expected)
        config_path = root / CONFIG_NAME
        config = read_json(config_path)
        qconfig = config.get(QUANTIZATION_CONFIG)
        layout = None if qconfig is None else read_layout(str(config_path), qconfig, legacy=True)
        stored, headers = read_stored(root)
        files = tuple(
            FileTally(
                h.path.name, h.size, DtypeTally.summed((t.dtype, 1, t.nbytes) for t in h.tensors)
            )
            for h in headers
        )
        aliases = tuple(sorted(stored.aliases.items()))
        if layout is None:
            return cls(str(root), None, None, "", files, (), (), aliases)
        stated = config_dtype(str(config_path), config)
        roles = Roles.read(layout, stored, conv1d_names(config))
        located = located_layers(roles)
        kept = kept_layers(roles, located)
        # After the layers: one refused is a surer answer than the dtype its tensors imply.
        dtype, source = activation_dtype(config_path, stated, layout, stored)
        layers = quantized_layers(layout, located, dtype)
        return cls(str(root), layout, dtype, source, files, layers, kept, aliases)

    def on(self, caps: DeviceCaps, policy: Policy | None = None) -> CheckpointInfo:
        """This checkpoint with ``summary``: each quantized layer decided on ``caps`` under
        ``policy`` (``kp.choose``), and the layers it keeps in high precision."""
        decided = [(layer.name, layer.config, choose(caps, layer.config, policy))
                   for layer in self.layers]  # fmt: skip
        scheme = "none" if self.layout is None else self.layout.scheme.value
        return attrs.evolve(self, summary=ModelSummary.of(scheme, caps, decided, self.kept))

    @property
    def total(self) -> FileTally:
        """Every file's tensors, by dtype, as one ``FileTally`` named "total"."""
        parts = ((t.dtype, t.tensors, t.bytes) for file in self.files for t in file.by_dtype)
        size = sum(file.size for file in self.files)
        return FileTally("total", size, DtypeTally.summed(parts))

    @property
    def shape_source(self) -> str | None:
        """Where each layer's N x K was read: its ``weight``, or (pack-quantized) the
        ``weight_shape`` tensor."""
        if self.layout is None:
            return None
        return "weight_shape" if self.layout.scheme in INTEGER_WEIGHT_ONLY else "weight"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record, stable under ``schema_version``."""
        described, record = _describe(self.layout)
        quantization = None
        if self.layout is not None:
            quantization = {
                "format_version": None, "format": None, **record, "description": described,
                **_settings(self.layout), "ignore": list(self.layout.ignored),
                "activation_dtype": None if self.dtype is None else self.dtype.value,
                "activation_dtype_source": self.dtype_source,
                "shape_source": self.shape_source,
            }  # fmt: skip
        return {
            "schema_version": SCHEMA_VERSION,
            "directory": self.directory,
            "format": described,
            "quantization": quantization,
            "files": [file.to_dict() for file in self.files],
            "total": self.total.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
            "kept": [layer.to_dict() for layer in self.kept],
            "aliases": dict(self.aliases),
            "summary": None if self.summary is None else self.summary.to_dict(),
        }

    def render(self) -> str:
        """A few screens of text: the format, the scheme, the tensors per file, the layers
        grouped by N x K, and (after ``on``) what they run."""
        described, _ = _describe(self.layout)
        lines = [f"checkpoint: {self.directory}", f"format: {described}"]
        if self.layout is not None:
            ignored = ", ".join(self.layout.ignored) or "nothing"
            lines += [f"scheme: {_scheme_words(_settings(self.layout))}",
                      f"kept by the config: {ignored}",
                      f"activations: {self.dtype} ({self.dtype_source})"]  # fmt: skip
        lines += ["", "tensors (bytes: elements x element size):"]
        rows = [["file", "tensors", "bytes", "by dtype"]]
        for file in (*self.files, self.total):
            parts = ", ".join(f"{t.dtype} {t.tensors} ({t.bytes:,})" for t in file.by_dtype)
            rows.append([file.name, str(file.tensors), f"{file.bytes:,}", parts])
        lines += _aligned(rows)
        lines += [f"tied (stored once): {alias} -> {target}" for alias, target in self.aliases]
        if self.layout is not None:
            lines += ["", *self._layer_lines()]
        if self.summary is not None:
            lines += ["", self.summary.render()]
        return "\n".join(lines)

    def _layer_lines(self) -> list[str]:
        source = ("each layer's weight_shape tensor; K is never guessed from the packed width"
                  if self.shape_source == "weight_shape" else "each layer's weight")  # fmt: skip
        lines = [f"quantized layers: {len(self.layers)} (N x K: {source})"]
        shapes: dict[tuple[int, int], list[str]] = {}
        for layer in self.layers:
            shapes.setdefault(layer.config.weight_shape, []).append(layer.name)
        rows = [["layers", "N x K", "names"]]
        rows += [[str(len(names)), f"{n} x {k}", collapse_names(names)]
                 for (n, k), names in shapes.items()]  # fmt: skip
        lines += _aligned(rows) if shapes else []
        for kept in () if self.summary is not None else self.kept:  # the summary lists them
            n, k = kept.weight_shape
            lines.append(f"kept in high precision: {kept.name} ({n} x {k}): {kept.reason}")
        return lines


def inspect_checkpoint(
    directory: str | os.PathLike[str],
    caps: DeviceCaps | None = None,
    policy: Policy | None = None,
) -> CheckpointInfo:
    """What the checkpoint in ``directory`` holds (``CheckpointInfo.read``) and, given
    ``caps``, what each of its quantized layers would run there (``CheckpointInfo.on``)."""
    info = CheckpointInfo.read(directory)
    return info if caps is None else info.on(caps, policy)
