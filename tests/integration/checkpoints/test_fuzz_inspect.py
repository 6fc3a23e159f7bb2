"""Fuzzing inspect_checkpoint with hypothesis: any config and any safetensors bytes, a
header of wrong types, sizes and offsets among them, give a CheckpointInfo or a
CheckpointError naming a file of the checkpoint, and never anything else.

The only allowed outcomes are a correct result or a documented kernelpick error. Any other
exception (TypeError, KeyError, an error from torch) is a bug of the reader, so nothing
here catches more than ``CheckpointError``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import Scheme
from kernelpick.integration import CheckpointError, CheckpointInfo, inspect_checkpoint
from kernelpick.integration.formats import compressed_tensors
from tests.support.fuzzing import fuzz

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

NAMES = ["layer.weight", "layer.weight_scale", "layer.weight_packed", "layer.weight_shape",
         "layer.bias", "head.weight", "layer.weight_scale_inv", "__metadata__"]  # fmt: skip
DTYPES = ["F8_E4M3", "F32", "BF16", "I32", "I64", "I8", "U8", "F4", ""]
INTS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31, 2**63, 10**30]))
JSON_JUNK = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=4),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers()),
)  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(DTYPES), st.lists(INTS, max_size=3), JSON_JUNK,
    st.lists(st.one_of(INTS, st.none(), st.booleans(), st.floats(), st.text(max_size=2)),
             max_size=3),
)  # fmt: skip
SIZES = {"F8_E4M3": 1, "F32": 4, "I32": 4, "I64": 8}
# Well-formed checkpoints of one quantized layer and a kept head, which the fuzzer then
# corrupts an entry or two at a time, so that most examples reach the layers' checks.
BASES: dict[str, tuple[dict[str, Any], dict[str, tuple[str, list[int]]]]] = {
    "fp8": (compressed_tensors.to_config(Scheme.FP8_PER_CHANNEL, ["head"]),
            {"layer.weight": ("F8_E4M3", [4, 8]), "layer.weight_scale": ("F32", [4, 1]),
             "head.weight": ("F32", [2, 8])}),
    "int4": (compressed_tensors.to_config(Scheme.INT4_WEIGHT_ONLY, ["head"], group_size=8),
             {"layer.weight_packed": ("I32", [4, 1]), "layer.weight_scale": ("F32", [4, 1]),
              "layer.weight_shape": ("I64", [2]), "head.weight": ("F32", [2, 8])}),
    "finegrained": ({"quant_method": "fp8", "weight_block_size": [4, 4],
                     "modules_to_not_convert": ["head"]},
                    {"layer.weight": ("F8_E4M3", [4, 8]), "layer.weight_scale_inv": ("F32", [1, 2]),
                     "head.weight": ("F32", [2, 8])}),
    "legacy": ({"quant_method": "kernelpick", "scheme": "fp8_per_channel", "format_version": 1,
                "modules_to_not_convert": ["head"]},
               {"layer.weight": ("F8_E4M3", [4, 8]), "layer.weight_scale": ("F32", [4, 1]),
                "head.weight": ("F32", [2, 8])}),
}  # fmt: skip
CORRUPTIONS = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["dtype", "shape", "data_offsets", None]),
              VALUES),
    max_size=2,
)  # fmt: skip


def _header(tensors: dict[str, tuple[str, list[int]]]) -> tuple[dict[str, Any], int]:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = SIZES[dtype]
        for extent in shape:
            size *= extent
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return header, offset


def _corrupted(
    header: dict[str, Any], corruptions: list[tuple[str, str | None, object]]
) -> dict[str, Any]:
    for name, field, value in corruptions:
        if field is None or not isinstance(header.get(name), dict):
            header[name] = value  # the whole entry, or one it did not have
        else:
            header[name][field] = value
    return header


def _bytes(header: dict[str, Any], data: bytes, length_delta: int) -> bytes:
    text = json.dumps(header).encode()
    return (len(text) + length_delta).to_bytes(8, "little", signed=True) + text + data


def _check(directory: Path) -> None:
    refused: CheckpointError | None = None
    try:
        info: CheckpointInfo | None = inspect_checkpoint(directory, kp.device_profile("h100"))
    except CheckpointError as error:
        refused, info = error, None
    if refused is not None:
        assert refused.path.startswith(str(directory)), refused
        assert refused.expected, refused
        return
    assert info is not None
    info.render()
    json.dumps(info.to_dict())


@fuzz(1500)
@given(
    st.sampled_from(sorted(BASES)), CORRUPTIONS, st.one_of(st.none(), JSON_JUNK),
    st.tuples(INTS, INTS), st.sampled_from([0] * 9 + [-1, 1, 10**6]), st.binary(max_size=8),
)  # fmt: skip
def test_a_corrupted_checkpoint_is_read_or_refused_by_name(
    base: str, corruptions: list[tuple[str, str | None, object]], dtype: object,
    shape: tuple[int, int], length_delta: int, extra: bytes,
) -> None:  # fmt: skip
    qconfig, tensors = BASES[base]
    header, size = _header(tensors)
    data = bytearray(size)
    if "layer.weight_shape" in header:  # the layer's N and K, as stored (any int64 values)
        start = header["layer.weight_shape"]["data_offsets"][0]
        for i, value in enumerate(shape):
            data[start + 8 * i : start + 8 * i + 8] = (value % 2**64).to_bytes(8, "little")
    config = {"quantization_config": qconfig, **({} if dtype is None else {"dtype": dtype})}
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / "config.json").write_text(json.dumps(config))
        raw = _bytes(_corrupted(header, corruptions), bytes(data) + extra, length_delta)
        (directory / "model.safetensors").write_bytes(raw)
        _check(directory)


@fuzz(200)
@given(
    st.one_of(st.sampled_from([q for q, _ in BASES.values()]), JSON_JUNK), st.binary(max_size=64)
)
def test_any_bytes_are_read_or_refused_by_name(qconfig: object, raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / "config.json").write_text(json.dumps({"quantization_config": qconfig}))
        (directory / "model.safetensors").write_bytes(raw)
        _check(directory)
