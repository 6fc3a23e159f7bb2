"""Tensor-parallel shards on two gloo ranks over loopback (CPU): each rank's quantized shard
matches the single-process layer, loaders narrow whole checkpoint tensors, selection
answers for each rank's partition, and a failed or hung peer is an error, not a hang.

The scenarios below run in spawned ranks (``tests.support.tp_workers``): three spawns in all, one
for the healthy scenarios (each in a process group of its own, so one failing cannot
hide another) and one each for a peer that hangs and a peer that dies. Each scenario
returns plain data; the single-process references are computed here, in the test
process, from the same seeded tensors.
"""

from __future__ import annotations

import copy
import datetime
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import kernelpick as kp
import kernelpick.kernels._quantize as quantize_module
from kernelpick.integration import (
    KernelSelectionError,
    QuantizedLinear,
    QuantizedLinearMethod,
    TensorParallel,
    layer_state,
    quantize_model,
    shard_linear,
    weight_loader_of,
)
from kernelpick.kernels import quantize_canonical
from tests.support.emulation import BOUND, relative_error
from tests.support.tp_workers import (
    Batch,
    Missing,
    Raised,
    as_numpy,
    fp8_bytes,
    run_batch,
    run_ranks,
    scratch_dir,
    values,
)

pytestmark = [
    pytest.mark.slow,  # about 10 s: three spawns of two processes, each importing torch
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="needs torch.distributed with the gloo backend",
    ),
]

WORLD = 2
N, K = 128, 256  # the whole layer: nn.Linear(K, N), weight [N, K]
N_PART, K_PART = N // WORLD, K // WORLD
TOKENS = 6
BLOCK = 32  # fp8_block's block size here: each rank holds whole blocks either way
QKV = (128, 64, 64)  # a QKV layer's whole q, k and v rows
FP32 = BOUND["float32"]  # relative error of a different fp32 summation order
# A healthy scenario's collectives finish in milliseconds: this only bounds a broken one.
TIMEOUT = datetime.timedelta(seconds=30)
HUNG_TIMEOUT = datetime.timedelta(seconds=3)  # the timeout a hung peer is detected by
HUNG_SLEEP_LIMIT_S = 30.0  # the hung peer stays alive until rank 0 gives up, or this long


# -- tensors both sides build from the same seeds -----------------------------------------


def _caps() -> kp.DeviceCaps:
    return kp.probe("cpu")


def _linear(bias: bool = True) -> torch.nn.Linear:
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        # Rows of different magnitudes, so that per-channel scales differ from row to row.
        rows = torch.linspace(0.5, 4.0, N).unsqueeze(1)
        linear.weight.copy_(torch.randn(N, K, generator=generator) * rows)
        if linear.bias is not None:
            linear.bias.copy_(torch.randn(N, generator=generator))
    return linear


def _random_x(seed: int = 1) -> torch.Tensor:
    return torch.randn(TOKENS, K, generator=torch.Generator().manual_seed(seed))


def _peaked_x() -> torch.Tensor:
    """Activations whose every row has its amax (the same |value|) in each rank's K slice,
    so each rank's per-token (and per-tensor) activation scale is the whole row's."""
    x = _random_x(2)
    peak = x.abs().amax(dim=1) + 1.0
    x[:, 3] = peak
    x[:, K_PART + 5] = -peak
    return x


def _k_slice(rank: int) -> slice:
    return slice(rank * K_PART, (rank + 1) * K_PART)


def _n_slice(rank: int) -> slice:
    return slice(rank * N_PART, (rank + 1) * N_PART)


def _qkv_checkpoint() -> list[torch.Tensor]:
    """The whole q, k and v weights, as a checkpoint stores them."""
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(rows, K, generator=generator) * (i + 1) for i, rows in enumerate(QKV)]


def _qkv_rows(rank: int) -> list[int]:
    """The fused single-process layer's rows that rank ``rank``'s QKV shard holds: its
    part of q, then of k, then of v."""
    rows: list[int] = []
    start = 0
    for size in QKV:
        part = size // WORLD
        rows.extend(range(start + rank * part, start + (rank + 1) * part))
        start += size
    return rows


def _checkpoint(scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-quantized checkpoint of ``_linear``'s weight: canonical FP8 weight and scale."""
    block = BLOCK if scheme == "fp8_block" else None
    config = kp.quant_config(scheme, weight_shape=(N, K), block_size=block)
    return quantize_canonical(_linear().weight.detach(), config)


def _block_size(scheme: str) -> int | None:
    return BLOCK if scheme == "fp8_block" else None


# -- the ranks' side ----------------------------------------------------------------------


def _tp(style: str, timeout: datetime.timedelta = TIMEOUT) -> TensorParallel:
    return TensorParallel.of(style, timeout=timeout)


def _shard(linear: torch.nn.Linear, style: str, scheme: str) -> QuantizedLinear:
    return shard_linear(
        linear, style, scheme=scheme, caps=_caps(), policy=kp.Policy(),
        block_size=_block_size(scheme), timeout=TIMEOUT, prefix=f"mlp.{style}",
    )  # fmt: skip


def _layer_out(layer: torch.nn.Module) -> dict[str, Any]:
    return {
        "weight": fp8_bytes(layer.get_parameter("weight")),
        "scale": as_numpy(layer.get_parameter("weight_scale")),
        "kernel": layer_state(layer).decision.kernel,
    }


def _row(scheme: str, x: torch.Tensor, rank: int, alone: bool) -> dict[str, Any]:
    """A row-parallel shard of ``_linear`` run on this rank's slice of ``x``, summed over
    the ranks; with ``alone``, the same slice quantized as a layer of its own (no amax
    all-reduce), summed the same way."""
    linear = _linear()
    shard = _shard(linear, "row", scheme)
    y = shard(x[:, _k_slice(rank)])
    dist.all_reduce(y)
    out = _layer_out(shard) | {"y": as_numpy(y)}
    if alone:
        part = torch.nn.Linear(K_PART, N, bias=rank == 0)
        with torch.no_grad():
            part.weight.copy_(linear.weight[:, _k_slice(rank)])
            if part.bias is not None:
                part.bias.copy_(linear.bias)
        model = torch.nn.Sequential(part)
        quantize_model(model, scheme, _caps(), kp.Policy(), progress=False)
        y_alone = model(x[:, _k_slice(rank)])
        dist.all_reduce(y_alone)
        out |= {f"alone_{key}": value for key, value in _layer_out(model[0]).items()}
        out["alone_y"] = as_numpy(y_alone)
    return out


def _column(scheme: str, x: torch.Tensor) -> dict[str, Any]:
    """A column-parallel shard of ``_linear`` run on all of ``x``, gathered over the ranks."""
    shard = _shard(_linear(), "column", scheme)
    y = shard(x)
    parts = [torch.empty_like(y) for _ in range(WORLD)]
    dist.all_gather(parts, y.contiguous())
    return _layer_out(shard) | {"y": as_numpy(torch.cat(parts, dim=-1))}


def row_ptpc_peaked(rank: int, world: int) -> dict[str, Any]:
    return _row("fp8_per_channel", _peaked_x(), rank, alone=True)


def row_ptpc_random(rank: int, world: int) -> dict[str, Any]:
    return _row("fp8_per_channel", _random_x(), rank, alone=False)


def row_weight_only_random(rank: int, world: int) -> dict[str, Any]:
    return _row("fp8_weight_only", _random_x(), rank, alone=False)


def row_per_tensor_peaked(rank: int, world: int) -> dict[str, Any]:
    return _row("fp8_per_tensor", _peaked_x(), rank, alone=True)


def row_block_random(rank: int, world: int) -> dict[str, Any]:
    return _row("fp8_block", _random_x(), rank, alone=False)


def column_ptpc_random(rank: int, world: int) -> dict[str, Any]:
    return _column("fp8_per_channel", _random_x())


def column_per_tensor_random(rank: int, world: int) -> dict[str, Any]:
    return _column("fp8_per_tensor", _random_x())


def column_block_random(rank: int, world: int) -> dict[str, Any]:
    return _column("fp8_block", _random_x())


def qkv_column_load(rank: int, world: int) -> dict[str, Any]:
    """A QKV layer made column-parallel by the method, loaded shard by shard ("q", "k",
    "v") from the whole checkpoint tensors."""
    method = QuantizedLinearMethod(
        "fp8_per_channel", _caps(), kp.Policy(), tensor_parallel=_tp("column")
    )
    layer = torch.nn.Module()
    parts = [size // world for size in QKV]
    method.create_weights(layer, K, parts, K, sum(QKV), torch.float32, prefix="attn.qkv")
    param = layer.get_parameter("weight")
    dims = {name: getattr(param, name) for name in ("output_dim", "input_dim")}
    for shard_id, tensor in zip("qkv", _qkv_checkpoint(), strict=True):
        weight_loader_of(param)(param, tensor, shard_id)
    method.process_weights_after_loading(layer)
    y = method.apply(layer, _random_x())
    return _layer_out(layer) | {"y": as_numpy(y), "dims": dims}


def _pre_quantized(scheme: str, style: str, rank: int, world: int) -> dict[str, Any]:
    """A pre-quantized ``scheme`` layer split ``style``-wise, loaded from the whole
    checkpoint's weight and scale, run and combined over the ranks."""
    method = QuantizedLinearMethod(
        scheme, _caps(), kp.Policy(), checkpoint_format="pre_quantized",
        block_size=_block_size(scheme), tensor_parallel=_tp(style),
    )  # fmt: skip
    layer = torch.nn.Module()
    column = style == "column"
    k_part, n_part = (K, N // world) if column else (K // world, N)
    method.create_weights(layer, k_part, [n_part], K, N, torch.float32, prefix=f"mlp.{style}")
    scale_param = layer.get_parameter("weight_scale")
    dims = {name: getattr(scale_param, name, None) for name in ("output_dim", "input_dim")}
    for name, tensor in zip(("weight", "weight_scale"), _checkpoint(scheme), strict=True):
        param = layer.get_parameter(name)
        weight_loader_of(param)(param, tensor)
    method.process_weights_after_loading(layer)
    if column:
        y = method.apply(layer, _random_x())
        parts = [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(parts, y.contiguous())
        y = torch.cat(parts, dim=-1)
    else:
        x = _peaked_x() if scheme == "fp8_per_channel" else _random_x()
        y = method.apply(layer, x[:, _k_slice(rank)])
        dist.all_reduce(y)
    return _layer_out(layer) | {"y": as_numpy(y), "scale_dims": dims}


def pre_quantized_ptpc_column(rank: int, world: int) -> dict[str, Any]:
    return _pre_quantized("fp8_per_channel", "column", rank, world)


def pre_quantized_ptpc_row(rank: int, world: int) -> dict[str, Any]:
    return _pre_quantized("fp8_per_channel", "row", rank, world)


def pre_quantized_block_column(rank: int, world: int) -> dict[str, Any]:
    return _pre_quantized("fp8_block", "column", rank, world)


def pre_quantized_block_row(rank: int, world: int) -> dict[str, Any]:
    return _pre_quantized("fp8_block", "row", rank, world)


# A row-parallel layer whose whole K (2064 = 129 x 16) suits H100's kernels, but whose
# part on each rank (1032 = 64 x 16 + 8) does not.
H100_K, H100_N = 2064, 256


def h100_rejects_partition(rank: int, world: int) -> dict[str, Any]:
    method = QuantizedLinearMethod(
        "fp8_per_channel", kp.device_profile("h100"), kp.Policy(), tensor_parallel=_tp("row")
    )
    layer = torch.nn.Module()
    raised: Raised | None = None
    try:
        method.create_weights(
            layer, H100_K // world, [H100_N], H100_K, H100_N, torch.bfloat16,
            prefix="model.layers.0.mlp.down_proj",
        )  # fmt: skip
    except KernelSelectionError as error:
        raised = Raised.of(error)
    return {
        "error": raised,
        "parameters": [name for name, _ in layer.named_parameters()],
        "buffers": [name for name, _ in layer.named_buffers()],
        "decision": "kernelpick_decision" in layer.__dict__,
    }


def shard_linear_keeps_module(rank: int, world: int) -> dict[str, Any]:
    """Both styles of shard from one module, which must come out as it went in; and each
    row-parallel shard's output for zero input, summed (the bias, added once)."""
    linear = _linear()
    weight, bias = linear.weight, linear.bias
    before = {name: tensor.clone() for name, tensor in linear.state_dict().items()}
    row = _shard(linear, "row", "fp8_per_channel")
    column = _shard(linear, "column", "fp8_per_channel")
    y = row(torch.zeros(TOKENS, K_PART))
    dist.all_reduce(y)
    after = linear.state_dict()
    return {
        "unchanged": sorted(before) == sorted(after)
        and all(torch.equal(before[name], after[name]) for name in before),
        "same_parameters": linear.weight is weight and linear.bias is bias,
        "dtypes": (str(linear.weight.dtype), str(linear.bias.dtype)),
        "requires_grad": (linear.weight.requires_grad, linear.bias.requires_grad),
        "type": type(linear).__name__,
        "row_bias": None if row.bias is None else as_numpy(row.bias),
        "column_bias": None if column.bias is None else as_numpy(column.bias),
        "zero_input_sum": as_numpy(y),
    }


def _nan_layer(tp: TensorParallel, rank: int) -> tuple[QuantizedLinearMethod, torch.nn.Module]:
    """A row-parallel PTPC layer loaded from a checkpoint holding a NaN in rank 1's part."""
    method = QuantizedLinearMethod("fp8_per_channel", _caps(), kp.Policy(), tensor_parallel=tp)
    layer = torch.nn.Module()
    method.create_weights(layer, K_PART, [N], K, N, torch.float32, prefix="mlp.down")
    weight = _linear().weight.detach().clone()
    weight[7, K_PART + 3] = float("nan")  # rank 1's row 7, its column 3
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, weight)
    return method, layer


def _process_timed(method: QuantizedLinearMethod, layer: torch.nn.Module) -> dict[str, Any]:
    start = time.monotonic()
    try:
        method.process_weights_after_loading(layer)
    except Exception as error:
        raised: Raised | None = Raised.of(error)
    else:
        raised = None
    return {
        "error": raised,
        "elapsed": time.monotonic() - start,
        "processed": layer_state(layer).bound is not None,
        "weight_dtype": str(layer.get_parameter("weight").dtype),
    }


def _processed_or_error(name: str, n: int, seed: int) -> str:
    """Process a row-parallel PTPC layer ``name`` of ``n`` outputs; "" or the error's
    type and cause."""
    method = QuantizedLinearMethod(
        "fp8_per_channel", _caps(), kp.Policy(), tensor_parallel=_tp("row")
    )
    layer = torch.nn.Module()
    method.create_weights(layer, K_PART, [n], K, n, torch.float32, prefix=name)
    param = layer.get_parameter("weight")
    weight = torch.randn(n, K, generator=torch.Generator().manual_seed(seed))
    weight_loader_of(param)(param, weight)
    try:
        method.process_weights_after_loading(layer)
    except Exception as error:
        return f"{type(error).__name__}: {getattr(error, 'cause', error)}"
    return ""


def layers_out_of_order(rank: int, world: int) -> dict[str, Any]:
    """Ranks at different layers: two of the same shape in swapped order (whose amaxes an
    all-reduce alone would combine silently), then two of different shapes."""
    swapped = ["a", "b"] if rank == 0 else ["b", "a"]
    return {
        "swapped": [_processed_or_error(f"mlp.{name}", N, ord(name)) for name in swapped],
        "shapes": _processed_or_error("mlp.c" if rank == 0 else "mlp.d", N // (rank + 1), 0),
    }


def quantize_fails_on_rank_1(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's quantization raises before its amax is all-reduced (out of memory in the
    fp32 working copy, simulated): it must still tell rank 0, which must not wait."""
    original = quantize_module._group_amax

    def out_of_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise torch.OutOfMemoryError("simulated: the fp32 working copy did not fit")

    if rank == 1:
        quantize_module._group_amax = out_of_memory
    try:
        method = QuantizedLinearMethod(
            "fp8_per_channel", _caps(), kp.Policy(), tensor_parallel=_tp("row")
        )
        layer = torch.nn.Module()
        method.create_weights(layer, K_PART, [N], K, N, torch.float32, prefix="mlp.down")
        param = layer.get_parameter("weight")
        weight_loader_of(param)(param, _linear().weight.detach())
        return _process_timed(method, layer)
    finally:
        quantize_module._group_amax = original


def nan_on_rank_1(rank: int, world: int) -> dict[str, Any]:
    method, layer = _nan_layer(_tp("row"), rank)
    return _process_timed(method, layer)


def hung_peer(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 fails in code of its own before processing, and stays alive (as a process
    stuck elsewhere would) until rank 0 has given up on it."""
    method, layer = _nan_layer(_tp("row", HUNG_TIMEOUT), rank)
    given_up = Path(scratch_dir()) / "rank-0-gave-up"
    if rank == 1:
        try:
            raise RuntimeError("rank 1's own code failed before processing its layers")
        finally:
            deadline = time.monotonic() + HUNG_SLEEP_LIMIT_S
            while not given_up.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    try:
        return _process_timed(method, layer)
    finally:
        given_up.touch()


def dead_peer(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's process ends before processing; rank 0 waits with a long timeout."""
    method, layer = _nan_layer(_tp("row", datetime.timedelta(seconds=60)), rank)
    if rank == 1:
        import os

        os._exit(3)
    return _process_timed(method, layer)


HEALTHY = [
    row_ptpc_peaked,
    row_ptpc_random,
    row_weight_only_random,
    row_per_tensor_peaked,
    row_block_random,
    column_ptpc_random,
    column_per_tensor_random,
    column_block_random,
    qkv_column_load,
    pre_quantized_ptpc_column,
    pre_quantized_ptpc_row,
    pre_quantized_block_column,
    pre_quantized_block_row,
    h100_rejects_partition,
    shard_linear_keeps_module,
    # Last, about failures: each leaves the group usable, unless the library regresses
    # (gloo aborts a rank that meets a collective of another size), and then only these.
    nan_on_rank_1,
    quantize_fails_on_rank_1,
    layers_out_of_order,
]


# -- the test process's side --------------------------------------------------------------


def _warm() -> None:
    """Build (or load) the CPU kernels here first, so the ranks only load them."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    quantize_model(model, "fp8_per_channel", _caps(), kp.Policy(), progress=False)
    model(torch.randn(2, 64))


@pytest.fixture(scope="module")
def healthy() -> Batch:
    _warm()
    return run_batch(HEALTHY, WORLD, timeout_s=180.0)


@pytest.fixture(scope="module")
def hung() -> list[object]:
    _warm()
    return run_ranks(hung_peer, WORLD, timeout_s=60.0)


@pytest.fixture(scope="module")
def dead() -> list[object]:
    _warm()
    return run_ranks(dead_peer, WORLD, timeout_s=60.0)


def _ranks(batch: Batch, scenario: str) -> list[dict[str, Any]]:
    return values(batch[scenario], scenario)


def _reference(scheme: str) -> QuantizedLinear:
    """The single-process quantized layer: ``quantize_model`` on a copy of ``_linear``."""
    model = torch.nn.Sequential(copy.deepcopy(_linear()))
    quantize_model(
        model, scheme, _caps(), kp.Policy(), progress=False, block_size=_block_size(scheme)
    )
    layer = model[0]
    assert isinstance(layer, QuantizedLinear)
    return layer


def _t(array: np.ndarray[Any, Any]) -> torch.Tensor:
    return torch.from_numpy(array)


def _block_slice(part: slice, block: int = BLOCK) -> slice:
    assert part.start % block == 0
    assert part.stop % block == 0
    return slice(part.start // block, part.stop // block)


def _assert_row_matches(scenario: str, healthy: Batch, scheme: str, x: torch.Tensor) -> None:
    """Each rank's row-parallel shard holds the single-process layer's bytes for its
    columns and its whole scales, and the summed output is the layer's to fp32 rounding."""
    ref = _reference(scheme)
    weight = fp8_bytes(ref.get_parameter("weight"))
    scale = as_numpy(ref.get_parameter("weight_scale"))
    y_ref = ref(x).detach()
    ranks = _ranks(healthy, scenario)
    for rank, out in enumerate(ranks):
        assert out["kernel"] == layer_state(ref).decision.kernel
        assert np.array_equal(out["weight"], weight[:, _k_slice(rank)]), f"rank {rank}'s bytes"
        want_scale = scale[:, _block_slice(_k_slice(rank))] if scheme == "fp8_block" else scale
        assert np.array_equal(out["scale"], want_scale), f"rank {rank}'s scales"
        assert relative_error(_t(out["y"]), y_ref) <= FP32, f"rank {rank}'s sum"
    assert np.array_equal(ranks[0]["y"], ranks[1]["y"])


def _assert_column_matches(scenario: str, healthy: Batch, scheme: str) -> None:
    ref = _reference(scheme)
    weight = fp8_bytes(ref.get_parameter("weight"))
    scale = as_numpy(ref.get_parameter("weight_scale"))
    y_ref = ref(_random_x()).detach()
    for rank, out in enumerate(_ranks(healthy, scenario)):
        rows = _n_slice(rank)
        assert np.array_equal(out["weight"], weight[rows]), f"rank {rank}'s bytes"
        want_scale = {
            "fp8_per_tensor": scale,  # one scale: the all-reduced amax's
            "fp8_block": scale[_block_slice(rows)],
        }.get(scheme, scale[rows])
        assert np.array_equal(out["scale"], want_scale), f"rank {rank}'s scales"
        assert relative_error(_t(out["y"]), y_ref) <= FP32, f"rank {rank}'s gathered output"


# 1. Row-parallel numerics ----------------------------------------------------------------


def test_row_parallel_sum_equals_the_single_process_layer(healthy: Batch) -> None:
    _assert_row_matches("row_ptpc_peaked", healthy, "fp8_per_channel", _peaked_x())


def test_row_parallel_without_the_amax_all_reduce_differs(healthy: Batch) -> None:
    """The control: each rank quantizing its K slice as a layer of its own scales each
    channel by that slice's amax, not the row's; bytes, scales and output differ."""
    ref = _reference("fp8_per_channel")
    scale = as_numpy(ref.get_parameter("weight_scale"))
    weight = fp8_bytes(ref.get_parameter("weight"))
    y_ref = ref(_peaked_x()).detach()
    ranks = _ranks(healthy, "row_ptpc_peaked")
    differs = [out["alone_scale"] != scale for out in ranks]
    for rank, out in enumerate(ranks):
        assert differs[rank].any(), f"rank {rank}: every slice amax was the row's"
        assert (out["alone_scale"] <= scale).all()  # a slice's amax is at most the row's
        assert not np.array_equal(out["alone_weight"], weight[:, _k_slice(rank)])
    # A row's amax lies in one rank's slice, so the other rank's scale differs.
    assert (differs[0] | differs[1]).all()
    error = relative_error(_t(ranks[0]["alone_y"]), y_ref)
    assert error > 100 * FP32, error  # FP8's rounding of the weights, not fp32's


def test_row_parallel_weight_only_matches_for_any_input(healthy: Batch) -> None:
    # No activation quantization: nothing is scaled per rank, so any x matches.
    _assert_row_matches("row_weight_only_random", healthy, "fp8_weight_only", _random_x())


def test_row_parallel_random_input_stays_within_fp8_activation_rounding(healthy: Batch) -> None:
    """With activations whose row amax lies in one slice, the other rank's per-token scale
    is smaller than the whole row's, so its FP8 activations round differently.

    The bound: e4m3 rounds a normal value to within 2^-4 of it (3 mantissa bits: half an
    ulp of 2^-3 relative) and a subnormal one (below 2^-6, spacing 2^-9) to within 2^-10,
    in units of the scale. Both the single-process activation and a rank's are within
    2^-4 |x| + 2^-10 s of x, s the single-process per-token scale (the row's amax / 448,
    at least a rank's), so they differ by at most 2^-3 |x| + 2^-9 s. Through the same
    dequantized weight W (the bytes are the same: the amax is all-reduced):
        |y_tp - y_ref| <= 2^-3 |x| @ |W|^T + 2^-9 s sum_k |W| + fp32 accumulation,
    the last at most 2 K 2^-24 (|x| @ |W|^T + |bias|) for the two summations."""
    x = _random_x()
    ref = _reference("fp8_per_channel")
    w = ref.get_parameter("weight").detach().float() * ref.get_parameter("weight_scale").detach()
    assert ref.bias is not None
    y_ref = ref(x).detach()
    s = (x.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    magnitude = x.abs() @ w.abs().T
    bound = (
        2.0**-3 * magnitude
        + 2.0**-9 * s * w.abs().sum(dim=1)
        + 2 * K * 2.0**-24 * (magnitude + ref.bias.detach().abs())
    )
    weight = fp8_bytes(ref.get_parameter("weight"))
    for rank, out in enumerate(_ranks(healthy, "row_ptpc_random")):
        assert np.array_equal(out["weight"], weight[:, _k_slice(rank)])
        diff = (_t(out["y"]) - y_ref).abs()
        assert (diff <= bound).all(), float((diff - bound).max())
        assert float(diff.max()) > 0.0  # the per-rank activation scales do differ here
        assert relative_error(_t(out["y"]), y_ref) <= 0.05


# 2. Column-parallel and per-tensor ---------------------------------------------------------


def test_column_parallel_gather_equals_the_single_process_layer(healthy: Batch) -> None:
    _assert_column_matches("column_ptpc_random", healthy, "fp8_per_channel")


def test_column_parallel_per_tensor_shares_the_whole_layers_scale(healthy: Batch) -> None:
    _assert_column_matches("column_per_tensor_random", healthy, "fp8_per_tensor")


def test_row_parallel_per_tensor_shares_the_whole_layers_scale(healthy: Batch) -> None:
    _assert_row_matches("row_per_tensor_peaked", healthy, "fp8_per_tensor", _peaked_x())
    # Without the all-reduce, a rank's one scale is its slice's amax: smaller on one rank.
    scale = float(_reference("fp8_per_tensor").get_parameter("weight_scale"))
    alone = [
        float(out["alone_scale"].reshape(())) for out in _ranks(healthy, "row_per_tensor_peaked")
    ]
    assert max(alone) == scale
    assert min(alone) < scale


def test_block_scales_stay_each_ranks_own_in_both_styles(healthy: Batch) -> None:
    # Blocks lie inside a rank's part and activation groups (1 x 32) inside its K slice:
    # nothing is shared, and any x matches.
    _assert_column_matches("column_block_random", healthy, "fp8_block")
    _assert_row_matches("row_block_random", healthy, "fp8_block", _random_x())


# 3. Loading whole checkpoint tensors ---------------------------------------------------------


def test_qkv_shards_load_narrowed_from_whole_checkpoint_tensors(healthy: Batch) -> None:
    method = QuantizedLinearMethod("fp8_per_channel", _caps(), kp.Policy())
    layer = torch.nn.Module()
    method.create_weights(layer, K, list(QKV), K, sum(QKV), torch.float32, prefix="attn.qkv")
    param = layer.get_parameter("weight")
    for shard_id, tensor in enumerate(_qkv_checkpoint()):
        weight_loader_of(param)(param, tensor, shard_id)
    method.process_weights_after_loading(layer)
    weight = fp8_bytes(layer.get_parameter("weight"))
    scale = as_numpy(layer.get_parameter("weight_scale"))
    y_ref = method.apply(layer, _random_x()).detach()
    for rank, out in enumerate(_ranks(healthy, "qkv_column_load")):
        rows = _qkv_rows(rank)
        assert out["dims"] == {"output_dim": 0, "input_dim": 1}
        assert out["weight"].shape == (sum(QKV) // WORLD, K)
        assert np.array_equal(out["weight"], weight[rows]), f"rank {rank}'s bytes"
        assert np.array_equal(out["scale"], scale[rows]), f"rank {rank}'s scales"
        assert relative_error(_t(out["y"]), y_ref[:, rows]) <= FP32, f"rank {rank}'s output"


def _pre_quantized_reference(scheme: str, x: torch.Tensor) -> tuple[Any, Any, torch.Tensor]:
    """The single-process pre-quantized layer's bytes, scales and output for ``x``."""
    method = QuantizedLinearMethod(
        scheme, _caps(), kp.Policy(), checkpoint_format="pre_quantized",
        block_size=_block_size(scheme),
    )  # fmt: skip
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, torch.float32, prefix="mlp")
    for name, tensor in zip(("weight", "weight_scale"), _checkpoint(scheme), strict=True):
        param = layer.get_parameter(name)
        weight_loader_of(param)(param, tensor)
    method.process_weights_after_loading(layer)
    out = _layer_out(layer)
    return out["weight"], out["scale"], method.apply(layer, x).detach()


def test_pre_quantized_per_channel_loads_sharded_in_both_styles(healthy: Batch) -> None:
    weight, scale, y_ref = _pre_quantized_reference("fp8_per_channel", _random_x())
    for rank, out in enumerate(_ranks(healthy, "pre_quantized_ptpc_column")):
        assert out["scale_dims"] == {"output_dim": 0, "input_dim": None}
        assert np.array_equal(out["weight"], weight[_n_slice(rank)]), f"rank {rank}'s bytes"
        assert np.array_equal(out["scale"], scale[_n_slice(rank)]), "column: scales split"
        assert relative_error(_t(out["y"]), y_ref) <= FP32
    _, _, y_ref = _pre_quantized_reference("fp8_per_channel", _peaked_x())
    for rank, out in enumerate(_ranks(healthy, "pre_quantized_ptpc_row")):
        assert np.array_equal(out["weight"], weight[:, _k_slice(rank)]), f"rank {rank}'s bytes"
        assert np.array_equal(out["scale"], scale), "row: scales replicated"
        assert relative_error(_t(out["y"]), y_ref) <= FP32


def test_pre_quantized_block_loads_sharded_by_blocks_in_both_styles(healthy: Batch) -> None:
    weight, scale, y_ref = _pre_quantized_reference("fp8_block", _random_x())
    assert scale.shape == (N // BLOCK, K // BLOCK)
    for rank, out in enumerate(_ranks(healthy, "pre_quantized_block_column")):
        rows = _n_slice(rank)
        assert out["scale_dims"] == {"output_dim": 0, "input_dim": 1}
        assert np.array_equal(out["weight"], weight[rows]), f"rank {rank}'s bytes"
        assert np.array_equal(out["scale"], scale[_block_slice(rows)])
        assert relative_error(_t(out["y"]), y_ref) <= FP32
    for rank, out in enumerate(_ranks(healthy, "pre_quantized_block_row")):
        columns = _k_slice(rank)
        assert np.array_equal(out["weight"], weight[:, columns]), f"rank {rank}'s bytes"
        assert np.array_equal(out["scale"], scale[:, _block_slice(columns)])
        assert relative_error(_t(out["y"]), y_ref) <= FP32


# 4. Selection answers for each rank's partition -----------------------------------------------


def test_each_rank_selects_for_its_own_partition_before_allocating(healthy: Batch) -> None:
    # The whole layer would be accepted: only the partition's K is misaligned.
    whole = torch.nn.Module()
    QuantizedLinearMethod("fp8_per_channel", kp.device_profile("h100"), kp.Policy()).create_weights(
        whole, H100_K, [H100_N], H100_K, H100_N, torch.bfloat16
    )
    assert layer_state(whole).decision.kernel == "cuda_rowwise_scaled_mm"
    ranks = _ranks(healthy, "h100_rejects_partition")
    errors = [out["error"] for out in ranks]
    for rank, (out, error) in enumerate(zip(ranks, errors, strict=True)):
        assert isinstance(error, Raised), f"rank {rank} selected a kernel"
        assert error.type_name == "KernelSelectionError"
        where = f"on tensor-parallel rank {rank} of {WORLD} (row-parallel)"
        assert error.attributes["partition"] == where
        assert where in error.message
        assert error.attributes["layer"] == "model.layers.0.mlp.down_proj"
        assert f"K={H100_K // WORLD}" in error.message
        codes = error.attributes["reason_codes"]
        assert isinstance(codes, tuple)
        assert str(kp.RejectCode.SHAPE_ALIGNMENT) in codes
        assert (out["parameters"], out["buffers"], out["decision"]) == ([], [], False)
    assert errors[0].attributes["rejected"] == errors[1].attributes["rejected"]
    assert errors[0].attributes["reason_codes"] == errors[1].attributes["reason_codes"]


# shard_linear ------------------------------------------------------------------------------


def test_shard_linear_leaves_the_module_and_puts_the_row_bias_on_rank_0(healthy: Batch) -> None:
    bias = _linear().bias
    assert bias is not None
    bias_np = as_numpy(bias)
    ranks = _ranks(healthy, "shard_linear_keeps_module")
    for rank, out in enumerate(ranks):
        assert out["unchanged"]
        assert out["same_parameters"]
        assert out["dtypes"] == ("torch.float32", "torch.float32")
        assert out["requires_grad"] == (True, True)
        assert out["type"] == "Linear"
        assert np.array_equal(out["column_bias"], bias_np[_n_slice(rank)])
        # Zero input quantizes to zero: the sum is the bias, added once.
        assert np.array_equal(out["zero_input_sum"], np.broadcast_to(bias_np, (TOKENS, N)))
    assert np.array_equal(ranks[0]["row_bias"], bias_np)
    assert ranks[1]["row_bias"] is None


# 5. A failed, hung or dead peer ------------------------------------------------------------


def _rank_1_named_at_once(ranks: list[dict[str, Any]], own_error: str) -> Raised:
    """Rank 0 raised TensorParallelError naming rank 1 without waiting, rank 1 its own
    ``own_error`` (returned), and neither processed the layer."""
    first, second = ranks[0]["error"], ranks[1]["error"]
    assert isinstance(first, Raised)
    assert isinstance(second, Raised)
    assert first.type_name == "TensorParallelError", first.message
    assert first.attributes["failed"] == (1,)
    assert (first.attributes["rank"], first.attributes["layer"]) == (0, "mlp.down")
    assert "rank(s) 1 failed while processing" in first.message
    assert ranks[0]["elapsed"] < 5.0  # the collective answered; TIMEOUT is 30 s
    assert second.type_name == own_error, second.message  # its own error, not TP's
    for out in ranks:
        assert (out["processed"], out["weight_dtype"]) == (False, "torch.float32")
    return second


def test_a_peer_that_fails_processing_is_named_at_once(healthy: Batch) -> None:
    own = _rank_1_named_at_once(_ranks(healthy, "nan_on_rank_1"), "KernelInputError")
    assert "mlp.down.weight on tensor-parallel rank 1 of 2" in own.message  # its part


def test_ranks_at_different_layers_are_refused_not_combined(healthy: Batch) -> None:
    for rank, out in enumerate(_ranks(healthy, "layers_out_of_order")):
        for error in [*out["swapped"], out["shapes"]]:
            assert error.startswith("TensorParallelError: "), f"rank {rank}: {error!r}"
            assert "reached different layers" in error


def test_a_peer_whose_quantization_fails_is_named_at_once(healthy: Batch) -> None:
    own = _rank_1_named_at_once(_ranks(healthy, "quantize_fails_on_rank_1"), "OutOfMemoryError")
    assert "simulated" in own.message


def test_a_hung_peer_is_an_error_after_the_timeout(hung: list[object]) -> None:
    waiting, stuck = hung
    assert isinstance(waiting, dict), waiting
    error = waiting["error"]
    assert isinstance(error, Raised)
    assert error.type_name == "TensorParallelError", error.message
    assert error.attributes["failed"] == ()
    assert "the all-reduce with the other ranks failed" in error.message
    assert re.search(r"\b3 s\b", str(error.attributes["cause"])), "the timeout is named"
    seconds = HUNG_TIMEOUT.total_seconds()
    assert seconds - 0.1 <= waiting["elapsed"] < seconds + 15.0
    assert not waiting["processed"]
    # The peer's own failure came back once it woke, after rank 0 had given up.
    assert isinstance(stuck, Raised)
    assert stuck.type_name == "RuntimeError"


def test_a_dead_peer_is_an_error_without_waiting_for_the_timeout(dead: list[object]) -> None:
    waiting, gone = dead
    assert isinstance(gone, Missing)
    assert "exited with code 3" in gone.reason
    assert isinstance(waiting, dict), waiting
    error = waiting["error"]
    assert isinstance(error, Raised)
    assert error.type_name == "TensorParallelError", error.message
    assert "the all-reduce with the other ranks failed" in error.message
    assert waiting["elapsed"] < 10.0  # the connection closed; the timeout is 60 s
    assert not waiting["processed"]
