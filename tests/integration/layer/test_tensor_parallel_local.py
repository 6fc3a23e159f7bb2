"""Tensor-parallel shards checked in one process: the values, the partition checks, the
loaders' narrowing and shard ids, and the amax reduction hook.

A ``TensorParallel`` built with an explicit rank needs no process group until a layer's
scales must be all-reduced, so everything that involves no collective (column-parallel
per-channel layers, pre-quantized checkpoints) runs here as rank 1 of 2. The collectives
themselves run with two gloo processes in ``test_tensor_parallel.py``."""

from __future__ import annotations

import copy
import datetime
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.integration import (
    KernelSelectionError,
    ParallelStyle,
    QuantizedLinear,
    QuantizedLinearMethod,
    TensorParallel,
    TensorParallelError,
    layer_state,
    save_quantized,
    shard_linear,
    weight_loader_of,
)
from kernelpick.kernels._canonical import quantize_canonical
from kernelpick.kernels._quantize import quantize, quantize_in_chunks

CPU = kp.device_profile("cpu")
RANK, WORLD = 1, 2


def _tp(style: str) -> TensorParallel:
    return TensorParallel(style, RANK, WORLD)


def _method(
    scheme: str = "fp8_per_channel", style: str | None = None, **kw: object
) -> QuantizedLinearMethod:
    tp = None if style is None else _tp(style)
    return QuantizedLinearMethod(scheme, CPU, kp.Policy(), tensor_parallel=tp, **kw)  # type: ignore[arg-type]


def _load(layer: torch.nn.Module, name: str, tensor: torch.Tensor, shard: object = None) -> None:
    param = layer.get_parameter(name)
    weight_loader_of(param)(param, tensor, shard)  # type: ignore[arg-type]


# -- the values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("diagonal", 0, 2), "diagonal"),
        (("row", 2, 2), "2"),
        (("row", -1, 2), "-1"),
        (("row", True, 2), "True"),
        (("column", 0, 0), "world_size 0"),  # named, not the rank it leaves no room for
        (("column", 0, 2.0), "world_size 2.0"),
    ],
)
def test_tensor_parallel_refuses_what_no_group_has(args: tuple[object, ...], named: str) -> None:
    with pytest.raises(kp.KernelpickError, match=named):
        TensorParallel(*args)  # type: ignore[arg-type]


def test_tensor_parallel_refuses_a_timeout_that_is_not_positive() -> None:
    for timeout in (datetime.timedelta(0), datetime.timedelta(seconds=-1), 30):
        with pytest.raises(kp.InvalidValueError, match="timedelta"):
            TensorParallel("row", 0, 2, timeout=timeout)  # type: ignore[arg-type]


def test_the_style_parses_from_its_name() -> None:
    assert TensorParallel(" Row ", 0, 2).style is ParallelStyle.ROW
    assert TensorParallel(ParallelStyle.COLUMN, 0, 2).split_dim == "output_dim"
    assert TensorParallel("row", 0, 2).split_dim == "input_dim"


def test_of_needs_an_initialized_process_group() -> None:
    with pytest.raises(kp.InvalidValueError, match="init_process_group"):
        TensorParallel.of("row")


def test_the_method_refuses_a_tensor_parallel_of_another_type() -> None:
    with pytest.raises(kp.InvalidValueError, match="TensorParallel"):
        QuantizedLinearMethod(tensor_parallel="row")  # type: ignore[arg-type]


# -- partition checks, before anything is allocated ------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "style", "sizes", "k", "input_size", "output_size", "named"),
    [
        # A row-parallel rank holds input_size / world inputs: 64 of 100 is no such part.
        ("fp8_per_channel", "row", [32], 64, 100, 32, "input_size"),
        # A column-parallel rank holds an equal part of every shard's outputs.
        ("fp8_per_channel", "column", [32, 16], 64, 64, 64, "output_size"),
        # 48-wide K parts split the 32-wide blocks between ranks.
        ("fp8_block", "row", [64], 48, 96, 64, "scale block"),
        # A 16-row v shard splits a 32-row block of scales between ranks.
        ("fp8_block", "column", [32, 16], 64, 64, 96, "scale block"),
    ],
)
def test_a_partition_the_group_could_not_have_made_is_refused_before_allocation(
    scheme: str,
    style: str,
    sizes: list[int],
    k: int,
    input_size: int,
    output_size: int,
    named: str,
) -> None:
    block = {"block_size": 32} if scheme == "fp8_block" else {}
    method = _method(scheme, style, **block)
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError, match=named) as caught:
        method.create_weights(layer, k, sizes, input_size, output_size, torch.float32, prefix="p")
    assert "p" in str(caught.value)
    assert list(layer.parameters()) == []


def test_a_row_parallel_per_channel_layer_needs_its_group_before_allocation() -> None:
    # Its amax is all-reduced when it is processed; finding no group then would be late.
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError, match="init_process_group"):
        _method("fp8_per_channel", "row").create_weights(layer, 32, [16], 64, 16, torch.float32)
    assert list(layer.parameters()) == []


def test_a_rejection_names_the_rank() -> None:
    method = QuantizedLinearMethod(
        "fp8_per_channel", kp.device_profile("h100"), kp.Policy(), tensor_parallel=_tp("column")
    )
    layer = torch.nn.Module()
    with pytest.raises(KernelSelectionError) as caught:
        method.create_weights(layer, 1028, [64], 1028, 128, torch.bfloat16, prefix="mlp.up")
    error = caught.value
    assert "layer 'mlp.up' on tensor-parallel rank 1 of 2 (column-parallel):" in str(error)
    assert error.partition == "on tensor-parallel rank 1 of 2 (column-parallel)"
    assert list(layer.parameters()) == []
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.partition, copy.layer) == (str(error), error.partition, error.layer)


def test_tensor_parallel_error_pickles_and_says_who_failed() -> None:
    failed = TensorParallelError("down", 0, 2, failed=(1,))
    assert "rank(s) 1 failed" in str(failed)
    assert "layer 'down' on tensor-parallel rank 0 of 2" in str(failed)
    silent = TensorParallelError(
        "down", 1, 2, cause="no answer within 3 s (RuntimeError: timed out)"
    )
    assert "no answer" in str(silent)
    assert "timed out" in str(silent)
    for error in (failed, silent):
        copy = pickle.loads(pickle.dumps(error))
        assert (str(copy), copy.failed, copy.cause) == (str(error), error.failed, error.cause)


# -- parameters engines narrow by ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "scale_dims"),
    [
        ("fp8_per_channel", {"output_dim": 0}),
        ("fp8_block", {"output_dim": 0, "input_dim": 1}),
        ("fp8_per_tensor", {}),
    ],
)
def test_parameters_carry_the_dimensions_engines_narrow_them_by(
    scheme: str, scale_dims: dict[str, int]
) -> None:
    method = _method(scheme, checkpoint_format="pre_quantized")
    layer = torch.nn.Module()
    method.create_weights(layer, 128, [128], 128, 128, torch.float32)
    for name, dims in (("weight", {"output_dim": 0, "input_dim": 1}), ("weight_scale", scale_dims)):
        param = layer.get_parameter(name)
        assert {
            d: getattr(param, d) for d in ("output_dim", "input_dim") if hasattr(param, d)
        } == dims


# -- the loaders narrow a whole checkpoint tensor ------------------------------------------


def test_a_column_parallel_shard_equals_its_rows_of_the_whole_layer() -> None:
    # Per-channel scales are each channel's own: no collective, so no group is needed.
    sizes, k = [32, 16, 16], 64
    full = [torch.randn(2 * rows, k) for rows in sizes]
    whole = _method()
    reference = torch.nn.Module()
    whole.create_weights(reference, k, [2 * r for r in sizes], k, 2 * sum(sizes), torch.float32)
    shard = torch.nn.Module()
    method = _method(style="column")
    method.create_weights(shard, k, sizes, k, 2 * sum(sizes), torch.float32, prefix="qkv")
    for index, (tensor, name) in enumerate(zip(full, "qkv", strict=True)):
        _load(reference, "weight", tensor, index)
        _load(shard, "weight", tensor, name)
    whole.process_weights_after_loading(reference)
    method.process_weights_after_loading(shard)
    starts = [0, 64, 96]  # each shard's first row in the whole fused layer
    rows = torch.cat(
        [torch.arange(s + RANK * r, s + (RANK + 1) * r) for s, r in zip(starts, sizes, strict=True)]
    )
    for name in ("weight", "weight_scale"):
        got, want = shard.get_parameter(name).detach(), reference.get_parameter(name).detach()[rows]
        assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), name
    x = torch.randn(3, k)
    torch.testing.assert_close(
        method.apply(shard, x), whole.apply(reference, x)[:, rows], rtol=0, atol=0
    )


def test_a_loader_refuses_a_tensor_that_is_not_the_whole_layers() -> None:
    method = _method(style="column")
    layer = torch.nn.Module()
    method.create_weights(layer, 64, [32], 64, 64, torch.float32, prefix="up")
    before = layer.get_parameter("weight").detach().clone()  # as allocated: any bits
    with pytest.raises(kp.KernelInputError, match=r"shape \[64, 64\].*rank 1") as caught:
        _load(layer, "weight", torch.randn(32, 64))  # already this rank's part
    assert "up.weight" in str(caught.value)
    after = layer.get_parameter("weight").detach()
    assert torch.equal(after.view(torch.int32), before.view(torch.int32))  # NaN bits too
    assert layer_state(layer).loaded == {}


def _prequantized(scheme: str, n: int, k: int, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    config = kp.quant_config(scheme, weight_shape=(n, k), **kw)  # type: ignore[arg-type]
    return quantize_canonical(torch.randn(n, k), config)


@pytest.mark.parametrize(
    ("scheme", "style", "block"),
    [
        ("fp8_per_channel", "row", None),
        ("fp8_per_channel", "column", None),
        ("fp8_per_tensor", "row", None),
        ("fp8_per_tensor", "column", None),
        ("fp8_block", "row", 32),
        ("fp8_block", "column", 32),
    ],
)
def test_a_pre_quantized_shard_holds_its_part_of_the_weight_and_scales(
    scheme: str, style: str, block: int | None
) -> None:
    n, k = 128, 128
    kw = {} if block is None else {"block_size": block}
    fp8, scale = _prequantized(scheme, n, k, **kw)
    column = style == "column"
    n_part, k_part = (n // WORLD, k) if column else (n, k // WORLD)
    method = _method(scheme, style, checkpoint_format="pre_quantized", **kw)
    layer = torch.nn.Module()
    method.create_weights(
        layer, k_part, [n_part], k, n_part * (WORLD if column else 1), torch.float32
    )
    _load(layer, "weight", fp8)
    _load(layer, "weight_scale", scale)
    method.process_weights_after_loading(layer)
    if column:
        want_weight = fp8[RANK * n_part : (RANK + 1) * n_part]
    else:
        want_weight = fp8[:, RANK * k_part : (RANK + 1) * k_part]
    assert torch.equal(
        layer.get_parameter("weight").view(torch.uint8), want_weight.view(torch.uint8)
    )
    got_scale = layer.get_parameter("weight_scale").detach()
    if scheme == "fp8_per_tensor" or (scheme == "fp8_per_channel" and not column):
        want_scale = scale.reshape(got_scale.shape)  # replicated
    elif column:
        rows = n_part // (block or 1)
        want_scale = scale[RANK * rows : (RANK + 1) * rows]
    else:
        cols = k_part // (block or 1)
        want_scale = scale[:, RANK * cols : (RANK + 1) * cols]
    assert torch.equal(got_scale, want_scale)


# -- shard ids -----------------------------------------------------------------------------


def test_q_k_v_name_the_three_shards_of_a_qkv_layer() -> None:
    sizes, k = [32, 16, 16], 32
    tensors = [torch.randn(rows, k) for rows in sizes]
    layers = []
    for ids in ((0, 1, 2), ("q", "k", "v")):
        method = _method()
        layer = torch.nn.Module()
        method.create_weights(layer, k, sizes, k, sum(sizes), torch.float32)
        for shard, tensor in zip(ids, tensors, strict=True):
            _load(layer, "weight", tensor, shard)
        assert layer_state(layer).loaded == {"weight": {0, 1, 2}}
        method.process_weights_after_loading(layer)
        layers.append(layer.get_parameter("weight").detach().view(torch.uint8))
    assert torch.equal(layers[0], layers[1])


@pytest.mark.parametrize(
    ("sizes", "shard"), [([32, 32], "q"), ([16, 16, 16], "o"), ([16, 16, 16], "Q")]
)
def test_a_shard_name_the_layer_has_not_is_refused(sizes: list[int], shard: str) -> None:
    method = _method()
    layer = torch.nn.Module()
    method.create_weights(layer, 16, sizes, 16, sum(sizes), torch.float32)
    with pytest.raises(kp.InvalidValueError, match="shard_id") as caught:
        _load(layer, "weight", torch.randn(sizes[0], 16), shard)
    assert ("'q', 'k' or 'v'" in str(caught.value)) == (len(sizes) == 3)


def test_an_engines_own_loader_records_q_k_v_as_their_shards() -> None:
    sizes, k = [32, 16, 16], 32
    calls: list[object] = []

    def engine_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        calls.append(shard_id)
        start = {"q": 0, "k": 32, "v": 48}[str(shard_id)]
        with torch.no_grad():
            param[start : start + loaded_weight.shape[0]].copy_(loaded_weight)

    method = _method()
    layer = torch.nn.Module()
    method.create_weights(
        layer, k, sizes, k, sum(sizes), torch.float32, weight_loader=engine_loader
    )
    for name, rows in zip("qkv", sizes, strict=True):
        _load(layer, "weight", torch.randn(rows, k), name)
    assert calls == ["q", "k", "v"]
    assert layer_state(layer).loaded == {"weight": {0, 1, 2}}
    method.process_weights_after_loading(layer)  # every shard counted as loaded


def test_an_engines_own_loader_is_not_called_with_an_unknown_shard() -> None:
    calls: list[object] = []
    method = _method()
    layer = torch.nn.Module()
    method.create_weights(
        layer, 16, [16, 16], 16, 32, torch.float32, weight_loader=lambda *a: calls.append(a)
    )
    with pytest.raises(kp.InvalidValueError, match="shard_id"):
        _load(layer, "weight", torch.randn(16, 16), "v")
    assert calls == []


# -- the amax reduction hook ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "shape"),
    [
        ((1, -1), (40, 24)),
        ((-1, -1), (40, 24)),
        ((16, 16), (40, 24)),
        ((1, 8), (40, 24)),
        ((-1, 8), (40, 24)),
    ],
)
@pytest.mark.parametrize("chunk_rows", [7, 16, 512])
def test_an_identity_reduction_changes_nothing(
    group: tuple[int, int], shape: tuple[int, int], chunk_rows: int
) -> None:
    w = torch.randn(*shape) * torch.linspace(0.1, 10, shape[0]).unsqueeze(1)
    want_q, want_scale = quantize(w, group, Dtype.FLOAT8_E4M3FN)
    seen: list[torch.Tensor] = []

    def identity(amax: torch.Tensor) -> torch.Tensor:
        seen.append(amax.clone())
        return amax

    q, scale = quantize_in_chunks(
        w, group, Dtype.FLOAT8_E4M3FN, chunk_rows=chunk_rows, reduce_amax=identity
    )
    assert len(seen) == 1  # one reduction for the whole weight, whatever the chunking
    assert tuple(seen[0].shape) == tuple(want_scale.shape)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)


def test_the_reduced_amax_is_the_one_the_scales_come_from() -> None:
    w = torch.randn(8, 16)
    config = kp.quant_config("fp8_per_channel", weight_shape=(8, 16))
    local_q, local_scale = quantize_canonical(w, config)
    q, scale = quantize_canonical(w, config, reduce_amax=lambda amax: amax * 4)
    torch.testing.assert_close(scale, local_scale * 4, rtol=0, atol=0)
    assert not torch.equal(q.view(torch.uint8), local_q.view(torch.uint8))


@pytest.mark.parametrize(
    "result", [torch.ones(3, 1), torch.ones(8, 1, dtype=torch.float64), "amax"]
)
def test_a_reduction_returning_another_shape_is_refused(result: object) -> None:
    config = kp.quant_config("fp8_per_channel", weight_shape=(8, 16))
    with pytest.raises(kp.InvalidValueError, match=r"reduce_amax.*\[8, 1\]"):
        quantize_canonical(torch.randn(8, 16), config, reduce_amax=lambda amax: result)  # type: ignore[arg-type,return-value]


def test_a_model_holding_a_shard_is_not_saved_as_a_whole_checkpoint(tmp_path: Path) -> None:
    # Its tensors are rank 1's part: saved as the layer's, they would load as a smaller one.
    method = _method(style="column")
    model = torch.nn.Sequential(torch.nn.Module())
    method.create_weights(model[0], 32, [16], 32, 32, torch.float32, prefix="0")
    _load(model[0], "weight", torch.randn(32, 32))
    method.process_weights_after_loading(model[0])
    with pytest.raises(kp.InvalidValueError, match="rank 1 of 2"):
        save_quantized(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_shards_repr_says_which_part_it_is() -> None:
    method = _method(style="column")
    layer = QuantizedLinear(32, 16, method._steps)
    method.create_weights(layer, 32, [16], 32, 32, torch.float32, prefix="up")
    _load(layer, "weight", torch.randn(32, 32))
    method.process_weights_after_loading(layer)
    assert repr(layer).endswith(
        "kernel=cpu_fp8_gemm, tensor-parallel rank 1 of 2 (column-parallel))"
    ), repr(layer)


@pytest.mark.parametrize(
    ("scheme", "checkpoint", "block"),
    [
        ("fp8_per_channel", "high_precision", None),
        ("fp8_per_channel", "pre_quantized", None),
        ("fp8_block", "pre_quantized", 16),
    ],
)
def test_a_whole_fused_tensor_is_narrowed_shard_by_shard(
    scheme: str, checkpoint: str, block: int | None
) -> None:
    # [q; k; v] whole, loaded with no shard id: a column-parallel rank holds its part of
    # each shard, not a run of rows of the fused tensor.
    sizes, k = [32, 16, 16], 32
    kw = {} if block is None else {"block_size": block}
    whole_shards = [_prequantized(scheme, 2 * rows, k, **kw) for rows in sizes]
    if checkpoint == "high_precision":
        whole_shards = [(torch.randn(2 * rows, k), torch.empty(0)) for rows in sizes]
    layers = []
    for fused in (True, False):
        method = _method(scheme, "column", checkpoint_format=checkpoint, **kw)
        layer = torch.nn.Module()
        method.create_weights(layer, k, sizes, k, 2 * sum(sizes), torch.float32, prefix="qkv")
        names = ["weight"] if checkpoint == "high_precision" else ["weight", "weight_scale"]
        for index, name in enumerate(names):
            if fused:
                _load(layer, name, torch.cat([shard[index] for shard in whole_shards]))
            else:
                for shard_id, shard in zip("qkv", whole_shards, strict=True):
                    _load(layer, name, shard[index], shard_id)
        method.process_weights_after_loading(layer)
        layers.append(layer)
    for name in ("weight", "weight_scale"):
        fused_part, by_shard = (layer.get_parameter(name).detach() for layer in layers)
        assert torch.equal(fused_part.view(torch.uint8), by_shard.view(torch.uint8)), name


def test_a_group_of_one_refuses_no_block_layer_the_whole_method_takes() -> None:
    # With one rank no block can straddle two: N = 200 is not a multiple of 128, and is
    # taken as a whole layer is.
    for style in ("row", "column"):
        method = QuantizedLinearMethod(
            "fp8_block", CPU, kp.Policy(), tensor_parallel=TensorParallel(style, 0, 1)
        )
        layer = torch.nn.Module()
        method.create_weights(layer, 200, [200], 200, 200, torch.float32, prefix="p")
        assert tuple(layer.get_parameter("weight").shape) == (200, 200)


def test_a_deep_copy_shares_the_process_group() -> None:
    tp = TensorParallel("row", 0, 2, group=object())  # type: ignore[arg-type]
    assert copy.deepcopy(tp) is tp


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    """A real gloo group of one process, torn down after the test."""
    store = f"file://{tmp_path}/rendezvous"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("world_of_one")
def test_shard_linear_makes_the_shard_on_the_modules_device() -> None:
    linear = torch.nn.Linear(64, 32)
    with torch.device("meta"):  # an engine's default device is not the module's
        shard = shard_linear(linear, "row", policy=kp.Policy(), prefix="down")
    assert {p.device.type for p in shard.parameters()} == {"cpu"}
    x = torch.randn(3, 64)
    torch.testing.assert_close(shard(x), linear(x), rtol=0.1, atol=0.1)


@pytest.mark.usefixtures("world_of_one")
def test_shard_linear_refuses_a_bias_that_is_not_finite_before_anything_else() -> None:
    linear = torch.nn.Linear(64, 32)
    with torch.no_grad():
        linear.bias[5] = float("nan")
    with pytest.raises(kp.KernelInputError, match=r"down\.bias"):
        shard_linear(linear, "row", policy=kp.Policy(), prefix="down")
