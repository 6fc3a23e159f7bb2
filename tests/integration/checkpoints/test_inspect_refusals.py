"""A checkpoint is untrusted input: each malformed header, config, index or layer is a
CheckpointError naming the file and the entry, and saying what is valid; nothing is
written. And inspect reads the headers only: no byte of tensor data but a pack-quantized
layer's weight_shape.

The checkpoints are written byte by byte here: one quantized layer ``layer`` (N = 4,
K = 8) and a high-precision ``head`` the config ignores."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kernelpick as kp
from kernelpick.core import Scheme
from kernelpick.integration import CheckpointError, inspect_checkpoint
from kernelpick.integration.checkpoints import _safetensors_io
from kernelpick.integration.formats import compressed_tensors

W = "model.safetensors"
INDEX = "model.safetensors.index.json"
SIZES = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "I8": 1}
Tensors = dict[str, tuple[str, list[int]]]


def _fp8() -> Tensors:
    return {"layer.weight": ("F8_E4M3", [4, 8]), "layer.weight_scale": ("F32", [4, 1]),
            "head.weight": ("F32", [2, 8])}  # fmt: skip


def _int4() -> Tensors:
    return {"layer.weight_packed": ("I32", [4, 1]), "layer.weight_scale": ("F32", [4, 1]),
            "layer.weight_shape": ("I64", [2]), "head.weight": ("F32", [2, 8])}  # fmt: skip


def _header(tensors: Tensors) -> dict[str, Any]:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = SIZES[dtype]
        for extent in shape:
            size *= extent
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return header


def _data(header: dict[str, Any]) -> bytes:
    """Zeros, but each weight_shape holds its layer's [4, 8]."""
    end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    data = bytearray(end)
    for name, entry in header.items():
        if name.endswith("weight_shape"):
            start = entry["data_offsets"][0]
            data[start : start + 16] = (4).to_bytes(8, "little") + (8).to_bytes(8, "little")
    return bytes(data)


def _file(path: Path, header: dict[str, Any] | bytes, data: bytes | None = None,
          length: int | None = None) -> None:  # fmt: skip
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    data = _data(header) if data is None and isinstance(header, dict) else data or b""
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + data)


def _config(directory: Path, qconfig: object, **extra: object) -> None:
    (directory / "config.json").write_text(json.dumps({"quantization_config": qconfig, **extra}))


def _checkpoint(
    directory: Path, tensors: Tensors | None = None, scheme: Scheme = Scheme.FP8_PER_CHANNEL,
    **settings: Any,
) -> dict[str, Any]:  # fmt: skip
    ignore = settings.pop("ignore", ["head"])
    _config(directory, compressed_tensors.to_config(scheme, ignore, **settings))
    header = _header(tensors or (_int4() if scheme is Scheme.INT4_WEIGHT_ONLY else _fp8()))
    _file(directory / W, header)
    return header


def _int4_checkpoint(directory: Path, tensors: Tensors | None = None) -> dict[str, Any]:
    return _checkpoint(directory, tensors or _int4(), Scheme.INT4_WEIGHT_ONLY, group_size=8)


@pytest.mark.parametrize("build", [_checkpoint, _int4_checkpoint], ids=["fp8", "int4"])
def test_a_well_formed_checkpoint_of_each_kind_is_read(
    tmp_path: Path, build: Callable[[Path], object]
) -> None:
    build(tmp_path)
    info = inspect_checkpoint(tmp_path)
    assert [(layer.name, layer.config.weight_shape) for layer in info.layers] == [("layer", (4, 8))]
    assert [(kept.name, kept.weight_shape) for kept in info.kept] == [("head", (2, 8))]


def _edited(
    change: Callable[[dict[str, Any]], object], int4: bool = False
) -> Callable[[Path], None]:
    """A checkpoint whose header ``change`` edits after its data is laid out."""

    def build(directory: Path) -> None:
        header = _int4_checkpoint(directory) if int4 else _checkpoint(directory)
        data = _data(header)
        change(header)
        _file(directory / W, header, data)

    return build


def _entry(name: str, **fields: object) -> Callable[[dict[str, Any]], object]:
    return lambda header: header[name].update(fields)


def _written(change: Callable[[Path], object], int4: bool = False) -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        _int4_checkpoint(directory) if int4 else _checkpoint(directory)
        change(directory)

    return build


def _replaced(
    header: dict[str, Any] | bytes, data: bytes | None = None, length: int | None = None
) -> Callable[[Path], None]:
    """A checkpoint whose model.safetensors is these bytes."""
    return _written(lambda d: _file(d / W, header, data, length))


def _sharded(weight_map: object, shards: dict[str, Tensors]) -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        _checkpoint(directory)
        (directory / W).unlink()
        for name, tensors in shards.items():
            _file(directory / name, _header(tensors))
        (directory / INDEX).write_text(json.dumps({"weight_map": weight_map}))

    return build


def _beside_an_index(directory: Path) -> None:
    """model.safetensors, and an index naming a shard that holds other tensors."""
    _checkpoint(directory)
    _file(directory / A, _header({**_fp8(), "layer.weight_scale": ("F32", [4, 2])}))
    weight_map = dict.fromkeys(_fp8(), A)
    (directory / INDEX).write_text(json.dumps({"weight_map": weight_map}))


def _qconfig(**changes: object) -> Callable[[Path], None]:
    def build(directory: Path) -> None:
        _checkpoint(directory)
        qconfig = compressed_tensors.to_config(Scheme.FP8_PER_CHANNEL, ["head"])
        _config(directory, {**qconfig, **changes})

    return build


LEGACY = {"quant_method": "kernelpick", "scheme": "fp8_per_channel", "format_version": 1}
A, B = "a.safetensors", "b.safetensors"
HALF = {"layer.weight": ("F8_E4M3", [4, 8]), "layer.weight_scale": ("F32", [4, 1])}

# name, what builds the checkpoint, the file named ("" for the directory), the entry named.
CASES: list[tuple[str, Callable[[Path], object], str, str]] = [
    ("a file shorter than its length",
     _written(lambda d: (d / W).write_bytes(b"\1\2")), W, "header"),
    ("a header longer than the file", _replaced(_header(_fp8()), length=10**6), W, "header"),
    ("a header that is not JSON", _replaced(b"{"), W, "header"),
    ("a header that is no object", _replaced(b"[1]"), W, "header"),
    ("a header nested past the recursion limit", _replaced(b"[" * 100_000), W, "header"),
    ("a name twice", _replaced(b'{"t": {"dtype": "I8", "shape": [0], "data_offsets": [0, 0]}, '
                               b'"t": {"dtype": "I8", "shape": [0], "data_offsets": [0, 0]}}'),
     W, "t"),
    ("a dtype it does not know", _edited(_entry("layer.weight", dtype="F4")), W, "layer.weight"),
    ("a shape of a negative extent",
     _edited(_entry("head.weight", shape=[-2, 8])), W, "head.weight"),
    ("offsets before the data",
     _edited(_entry("head.weight", data_offsets=[-16, 48])), W, "head.weight"),
    ("offsets that are no pair",
     _edited(_entry("head.weight", data_offsets=[48])), W, "head.weight"),
    ("a byte range outside the file",
     _edited(_entry("head.weight", shape=[2, 80], data_offsets=[48, 688])), W, "head.weight"),
    ("bytes that are not the shape's",
     _edited(_entry("head.weight", shape=[2, 4])), W, "head.weight"),
    ("an overlap", _edited(_entry("layer.weight_scale", data_offsets=[28, 44])), W,
     "layer.weight_scale"),
    ("bytes after the last tensor",
     lambda d: _file(d / W, h := _checkpoint(d), _data(h) + b"\0" * 5), W, "data"),
    ("metadata that is not strings",
     _edited(lambda h: h.update(__metadata__={"format": 1})), W, "__metadata__"),
    ("aliases nested past the recursion limit", _edited(lambda h: h.update(__metadata__={
        "kernelpick.aliases": "[" * 100_000 + "]" * 100_000})), W, "kernelpick.aliases"),
    ("an alias of nothing", _edited(lambda h: h.update(__metadata__={
        "kernelpick.aliases": json.dumps({"lm_head.weight": "embed.weight"})})), "",
     "kernelpick.aliases"),
    ("a config that is no object",
     _written(lambda d: (d / "config.json").write_text("[]")), "config.json", ""),
    ("a config that is not JSON",
     _written(lambda d: (d / "config.json").write_text("{")), "config.json", ""),
    ("a quantization_config that is no object",
     _written(lambda d: _config(d, "fp8")), "config.json", "quantization_config"),
    ("another quant_method", _qconfig(quant_method="awq"), "config.json", "quant_method"),
    ("a dtype no layer computes in",
     _written(lambda d: _config(d, compressed_tensors.to_config(Scheme.FP8_PER_CHANNEL,
                                                                ["head"]), dtype="int8")),
     "config.json", "dtype"),
    ("two dtypes", _written(lambda d: _config(
        d, compressed_tensors.to_config(Scheme.FP8_PER_CHANNEL, ["head"]), dtype="bfloat16",
        torch_dtype="float16")), "config.json", "dtype/torch_dtype"),
    ("a format_version it does not know",
     _written(lambda d: _config(d, {**LEGACY, "format_version": 2})), "config.json",
     "format_version"),
    ("an index naming a missing shard", _sharded({"layer.weight": A, "head.weight": B},
                                                 {A: {"layer.weight": ("F8_E4M3", [4, 8])}}),
     INDEX, "head.weight"),
    ("an index that maps nothing", _sharded([], {}), INDEX, "weight_map"),
    ("a model.safetensors beside an index naming another shard", _beside_an_index, INDEX,
     "layer.weight"),
    ("an index listing a tensor its shard lacks",
     _sharded({"layer.weight": A, "layer.weight_scale": A, "head.weight": A},
              {A: HALF}), A, "tensors"),
    ("a shard holding a tensor the index maps to another",
     _sharded({"layer.weight": A, "layer.weight_scale": B},
              {A: HALF, B: {"layer.weight_scale": ("F32", [4, 1])}}), A, "layer.weight_scale"),
    ("a scale without its weight", _written(lambda d: _file(d / W, _header(
        {"layer.weight_scale": ("F32", [4, 1])}))), "", "layer.weight"),
    ("a quantized weight of another dtype", _written(lambda d: _file(d / W, _header(
        {**_fp8(), "layer.weight": ("I8", [4, 8])}))), W, "layer.weight"),
    ("a weight that is not 2-D", _written(lambda d: _file(d / W, _header(
        {**_fp8(), "layer.weight": ("F8_E4M3", [32])}))), W, "layer.weight"),
    ("a scale for a module the config ignores",
     lambda d: _checkpoint(d, ignore=["layer"]), W, "layer.weight_scale"),
    ("a scale for a module the config does not quantize", lambda d: _checkpoint(d, {
        **_fp8(), "embed_tokens.weight": ("F32", [2, 8]),
        "embed_tokens.weight_scale": ("F32", [2, 1])}), W, "embed_tokens.weight_scale"),
    ("a module the config quantizes stored without its scale", lambda d: _checkpoint(
        d, {**_fp8(), "other.weight": ("F32", [2, 8])}), W, "other.weight"),
    ("a kept module whose weight is FP8", lambda d: _checkpoint(
        d, {**_fp8(), "head.weight": ("F8_E4M3", [2, 8])}), W, "head.weight"),
    ("no dtype, and high-precision tensors of two", lambda d: _checkpoint(
        d, {**_fp8(), "norm.weight": ("BF16", [8])}), "config.json", "dtype"),
    ("no dtype, and high-precision tensors of one no layer computes in", lambda d: _checkpoint(
        d, {**_fp8(), "head.weight": ("F64", [2, 8])}), "config.json", "dtype"),
    ("no dtype, and no high-precision tensor", lambda d: _checkpoint(
        d, {k: v for k, v in _fp8().items() if k != "head.weight"}), "config.json", "dtype"),
    ("a pack-quantized layer without weight_shape", lambda d: _int4_checkpoint(
        d, {k: v for k, v in _int4().items() if k != "layer.weight_shape"}), "",
     "layer.weight_shape"),
    ("a weight_shape of another dtype", lambda d: _int4_checkpoint(
        d, {**_int4(), "layer.weight_shape": ("F32", [2])}), W, "layer.weight_shape"),
    ("a weight_shape of zeros",
     _written(lambda d: _file(d / W, h := _header(_int4()), b"\0" * len(_data(h))), int4=True),
     W, "layer.weight_shape"),
    ("a packed width that is not weight_shape's K", lambda d: _int4_checkpoint(
        d, {**_int4(), "layer.weight_packed": ("I32", [4, 2])}), W, "layer.weight_packed"),
    ("no directory", lambda d: d.rmdir(), "", "directory"),
]  # fmt: skip


# What each refusal says it found: the check that refused it, where several share a key.
FOUND = {
    "a file shorter than its length": "a file of 2 bytes",
    "a header longer than the file": "a header of 1000000 bytes in a file of",
    "a header that is not JSON": "Expecting property name",
    "a header that is no object": "list",
    "a header nested past the recursion limit": "maximum recursion depth exceeded",
    "aliases nested past the recursion limit": "'[[[",
    "a name twice": "two entries",
    "a dtype it does not know": "dtype 'F4'",
    "a shape of a negative extent": "shape [-2, 8]",
    "offsets before the data": "data_offsets [-16, 48]",
    "offsets that are no pair": "data_offsets [48]",
    "a byte range outside the file": "bytes 48..688 of the data section",
    "bytes that are not the shape's": "64 bytes for F32 [2, 4]",
    "an overlap": "data from byte 28",
    "bytes after the last tensor": "5 bytes after the last tensor",
    "metadata that is not strings": "{'format': 1}",
    "an alias of nothing": "lm_head.weight -> embed.weight, which no file stores",
    "a config that is no object": "list",
    "a config that is not JSON": "text that is not one JSON object",
    "a quantization_config that is no object": "'fp8'",
    "another quant_method": "'awq'",
    "a dtype no layer computes in": "'int8'",
    "two dtypes": "{'dtype': 'bfloat16', 'torch_dtype': 'float16'}",
    "a format_version it does not know": "2",
    "an index naming a missing shard": "b.safetensors, no such file",
    "an index that maps nothing": "[]",
    "a model.safetensors beside an index naming another shard": "a.safetensors, beside a",
    "an index listing a tensor its shard lacks": "none for head.weight",
    "a shard holding a tensor the index maps to another": "a tensor the index maps to another",
    "a scale without its weight": "nothing",
    "a quantized weight of another dtype": "I8 [4, 8]",
    "a weight that is not 2-D": "shape [32]",
    "a scale for a module the config ignores": "a scale for a module the config keeps",
    "a scale for a module the config does not quantize": (
        "a scale for a module the config does not quantize, read by its name as an nn.Embedding"
    ),
    "a module the config quantizes stored without its scale": "F32 [2, 8], and no weight_scale",
    "a kept module whose weight is FP8": "F8_E4M3 [2, 8], and no weight_scale",
    "no dtype, and high-precision tensors of two": (
        "none, and high-precision tensors stored in F32: head.weight; BF16: norm.weight"
    ),
    "no dtype, and high-precision tensors of one no layer computes in": (
        "none, and high-precision tensors stored in F64: head.weight"
    ),
    "no dtype, and no high-precision tensor": "none, and no high-precision tensor stored",
    "a pack-quantized layer without weight_shape": "nothing",
    "a weight_shape of another dtype": "F32 [2]",
    "a weight_shape of zeros": "[0, 0]",
    "a packed width that is not weight_shape's K": "I32 [4, 2]",
    "no directory": "no such directory",
}


def _listing(directory: Path) -> dict[str, tuple[bytes, int]]:
    if not directory.is_dir():
        return {}
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(("case", "build", "file", "entry"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_checkpoint_is_refused_naming_the_file_and_the_entry(
    tmp_path: Path, case: str, build: Callable[[Path], object], file: str, entry: str
) -> None:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    build(directory)
    before = _listing(directory)
    with pytest.raises(CheckpointError) as refused:
        inspect_checkpoint(directory)
    error = refused.value
    assert (error.path, error.key) == (str(directory / file) if file else str(directory), entry)
    assert error.found.startswith(FOUND[case]), error.found
    assert error.expected, case  # what would be valid
    assert _listing(directory) == before  # nothing written


class _Recorder:
    """A file that records the byte ranges read from it."""

    def __init__(self, file: Any, reads: list[tuple[int, int]]) -> None:
        self._file, self._reads = file, reads

    def read(self, size: int = -1) -> bytes:
        start = self._file.tell()
        data: bytes = self._file.read(size)
        self._reads.append((start, start + len(data)))
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def test_only_the_header_and_the_weight_shape_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = _int4_checkpoint(tmp_path)
    text = len(json.dumps(header).encode())
    start, end = header["layer.weight_shape"]["data_offsets"]
    allowed = [(0, 8 + text), (8 + text + start, 8 + text + end)]
    reads: list[tuple[int, int]] = []
    opened = pathlib.Path.open

    def recording(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = opened(path, mode, *args, **kwargs)
        return _Recorder(file, reads) if path.name == W else file

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("safe_open maps the file")

    monkeypatch.setattr(pathlib.Path, "open", recording)
    monkeypatch.setattr(_safetensors_io, "safe_open", refused)
    info = inspect_checkpoint(tmp_path)
    assert [layer.config.weight_shape for layer in info.layers] == [(4, 8)]
    assert reads
    for first, last in reads:
        assert any(low <= first and last <= high for low, high in allowed), (first, last)


@pytest.mark.parametrize(
    ("stored", "dtype"), [("BF16", "bfloat16"), ("F16", "float16"), ("F32", "float32")]
)
def test_with_no_dtype_stated_the_stored_high_precision_tensors_say_it(
    tmp_path: Path, stored: str, dtype: str
) -> None:
    # The layer's fp32 scale is no weight of the model: it is fp32 whatever the model's dtype.
    _checkpoint(tmp_path, {**_fp8(), "layer.bias": (stored, [4]), "head.weight": (stored, [2, 8]),
                           "norm.weight": (stored, [8])})  # fmt: skip
    info = inspect_checkpoint(tmp_path)
    assert info.dtype is not None
    assert info.dtype.value == dtype
    assert info.dtype_source == (
        "config.json states none; the one dtype of the 3 high-precision tensors stored "
        "(head.weight, layer.bias, norm.weight)"
    )


def test_the_root_modules_own_weight_is_no_layer(tmp_path: Path) -> None:
    # Loading decides every module but the root, the model itself, which it never replaces.
    _checkpoint(tmp_path, {**_fp8(), "weight": ("F32", [2, 8])})
    info = inspect_checkpoint(tmp_path)
    assert [(kept.name, kept.weight_shape) for kept in info.kept] == [("head", (2, 8))]


def test_a_stored_bias_makes_the_layer_a_biased_one(tmp_path: Path) -> None:
    _checkpoint(tmp_path, {**_fp8(), "layer.bias": ("F32", [4])})
    assert [layer.config.bias for layer in inspect_checkpoint(tmp_path).layers] == [True]
    _checkpoint(tmp_path)
    assert [layer.config.bias for layer in inspect_checkpoint(tmp_path).layers] == [False]


def test_a_checkpoint_without_a_quantization_config_is_not_quantized(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"dtype": "float64"}')  # no layer computes in it
    info = inspect_checkpoint(tmp_path, kp.device_profile("h100"))
    record = info.to_dict()
    assert (record["format"], record["quantization"]) == (
        "not quantized (config.json has no quantization_config)", None,
    )  # fmt: skip
    assert (info.layers, info.kept) == ((), ())
    assert record["total"]["tensors"] == 3
    assert info.summary is not None
    assert info.summary.layers == 0
