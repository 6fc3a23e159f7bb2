"""Where each shard of a fused pre-quantized layer (q/k/v, gate/up) goes: its rows of the
weight, and the rows of the weight scale that hold its scales.

A checkpoint stores each shard as a layer of its own: per channel, one scale row per
weight row; per block, one scale row per ``b`` weight rows, counted from the shard's own
first row; per tensor, one value. A fused layer's block scales can hold a shard's only
when the shard starts on a block boundary, so every shard but the last must have a whole
number of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelpick.core import InvalidValueError, QuantConfig
from kernelpick.integration.layer._int_form import values_per_word

__all__ = ["check_shards", "per_tensor", "scale_rows", "scale_shape", "zero_point_rows"]


def per_tensor(config: QuantConfig) -> bool:
    """Whether ``config`` has one weight scale for the whole tensor."""
    return config.weight_scale_shape == (1,)


def scale_shape(config: QuantConfig, sizes: Sequence[int]) -> tuple[int, ...]:
    """The ``weight_scale`` a pre-quantized layer of ``sizes`` shards registers: one value
    per shard per tensor (processing merges them), else the config's own shape."""
    return (len(sizes),) if per_tensor(config) else config.weight_scale_shape


def _rows_per_scale(config: QuantConfig) -> int:
    return config.weight_block[0]


def scale_rows(config: QuantConfig, start: int, rows: int) -> tuple[int, int]:
    """(first row, rows) of the weight scale for weight rows ``start .. start + rows``
    (not per tensor). ``start`` is on a block boundary: ``check_shards`` saw to it."""
    size = _rows_per_scale(config)
    return start // size, -(-rows // size)


def zero_point_rows(config: QuantConfig, start: int, rows: int) -> tuple[int, int]:
    """(first row, rows) of an asymmetric integer layer's packed ``weight_zero_point`` for
    weight rows ``start .. start + rows``; ``start`` is on a word: ``check_shards``."""
    size = values_per_word(config)  # zero points are packed along N, a row a value
    return start // size, -(-rows // size)


def check_shards(config: QuantConfig, sizes: Sequence[int], layer: str) -> None:
    """Refuse shards a layer cannot hold apart: one whose rows are not a whole number of
    blocks (or, for packed zero points, of words), followed by another shard, would share
    a block of scales (a word of zero points) with it, though the checkpoint quantized
    each on its own."""
    if per_tensor(config):
        return
    size = _rows_per_scale(config)
    what = "blocks (the block size is {size})"
    checked = sizes[:-1]
    if config.weight.zero_point is not None and config.activation is None:
        size = max(size, values_per_word(config))
        what = "words of packed zero points ({size} rows a word)"
        # An engine places each shard's words by rows // (rows a word): a last shard's
        # partial word would never be loaded.
        checked = sizes if len(sizes) > 1 else ()
    for index, rows in enumerate(checked):
        if rows % size:
            raise InvalidValueError(
                f"output_partition_sizes of {layer}", list(sizes),
                f"shards of whole {size}-row " + what.format(size=size) + " for every "
                f"shard (but the last, for block scales): shard {index} has {rows} rows, so "
                "one of them would span it and the next, which the checkpoint quantized apart",
            )  # fmt: skip
