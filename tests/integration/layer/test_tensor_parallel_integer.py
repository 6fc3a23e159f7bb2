"""Integer weight-only layers (int4, int8) split by ``shard_linear`` on two gloo ranks: each
rank's pack-quantized tensors are the single-process layer's for its part, a row-parallel
per-channel layer agrees each row's bounds over the ranks, and a split that would cut a
group is refused before anything is allocated.

The scenarios run in spawned ranks (``tests.support.tp_workers``), one spawn for all; the
single-process references are computed here, from the same seeded weights.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import kernelpick as kp
from kernelpick.integration import QuantizedLinear, layer_state, quantize_model, shard_linear
from kernelpick.kernels import unpack_int, unpack_zero_points
from tests.support.emulation import BOUND, relative_error
from tests.support.tp_workers import Batch, Raised, as_numpy, run_batch, values

pytestmark = [
    pytest.mark.slow,  # a spawn of two processes, each importing torch
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="needs torch.distributed with the gloo backend",
    ),
]

WORLD = 2
N, K = 96, 256  # the whole layer: nn.Linear(K, N); each rank's part is 48 rows or 128 columns
TOKENS = 5
TIMEOUT = datetime.timedelta(seconds=30)
FP32 = BOUND["float32"]  # relative error of a different fp32 summation order

# (name, scheme, group size, symmetric, style): the splits kernelpick makes exactly.
CASES = [
    ("row_int4_g64_asym", "int4_weight_only", 64, False, "row"),
    ("row_int4_g128_sym", "int4_weight_only", 128, True, "row"),
    ("row_int8_channel_sym", "int8_weight_only", -1, True, "row"),  # bounds all-reduced
    ("row_int4_channel_asym", "int4_weight_only", -1, False, "row"),  # min and max both
    ("column_int4_g32_asym", "int4_weight_only", 32, False, "column"),
    ("column_int8_channel_asym", "int8_weight_only", -1, False, "column"),
]
_CASE = {case[0]: case[1:] for case in CASES}


def _linear() -> torch.nn.Linear:
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(K, N)
    with torch.no_grad():
        # Rows of different magnitudes and a skew, so per-row bounds differ between the
        # halves of K (a rank quantizing on its half's bounds would differ) and min != -max.
        rows = torch.linspace(0.5, 4.0, N).unsqueeze(1)
        weight = torch.randn(N, K, generator=generator) * rows + 0.3 * rows
        weight[:, : K // 2] *= torch.linspace(0.2, 1.5, N).unsqueeze(1)
        linear.weight.copy_(weight)
        linear.bias.copy_(torch.randn(N, generator=generator))
    return linear


def _x() -> torch.Tensor:
    return torch.randn(TOKENS, K, generator=torch.Generator().manual_seed(1))


def _tensors(layer: torch.nn.Module) -> dict[str, Any]:
    """A layer's integer values, scales and zero points, unpacked ([N, K], [N, G], [N, G])."""
    config = layer_state(layer).config
    bits, (n, k) = config.weight.dtype.bits, config.weight_shape
    out = {
        "q": as_numpy(unpack_int(layer.get_parameter("weight_packed"), bits, k)),
        "scale": as_numpy(layer.get_parameter("weight_scale")),
    }
    if config.weight.zero_point is not None:
        zero = unpack_zero_points(layer.get_parameter("weight_zero_point"), bits, n)
        out["zero"] = as_numpy(zero)
    return out


def _case(name: str, rank: int, world: int) -> dict[str, Any]:
    scheme, group, symmetric, style = _CASE[name]
    shard = shard_linear(
        _linear(), style, scheme=scheme, caps=kp.probe("cpu"), policy=kp.Policy(),
        group_size=group, symmetric=symmetric, timeout=TIMEOUT, prefix=f"mlp.{name}",
    )  # fmt: skip
    x = _x()
    if style == "row":
        y = shard(x[:, rank * K // world : (rank + 1) * K // world])
        dist.all_reduce(y)
    else:
        part = shard(x)
        parts = [torch.empty_like(part) for _ in range(world)]
        dist.all_gather(parts, part.contiguous())
        y = torch.cat(parts, dim=-1)
    return _tensors(shard) | {"y": as_numpy(y.detach())}


def row_int4_g64_asym(rank: int, world: int) -> dict[str, Any]:
    return _case("row_int4_g64_asym", rank, world)


def row_int4_g128_sym(rank: int, world: int) -> dict[str, Any]:
    return _case("row_int4_g128_sym", rank, world)


def row_int8_channel_sym(rank: int, world: int) -> dict[str, Any]:
    return _case("row_int8_channel_sym", rank, world)


def row_int4_channel_asym(rank: int, world: int) -> dict[str, Any]:
    return _case("row_int4_channel_asym", rank, world)


def column_int4_g32_asym(rank: int, world: int) -> dict[str, Any]:
    return _case("column_int4_g32_asym", rank, world)


def column_int8_channel_asym(rank: int, world: int) -> dict[str, Any]:
    return _case("column_int8_channel_asym", rank, world)


def row_group_straddles_ranks(rank: int, world: int) -> dict[str, Any]:
    """Groups of 256 over a K of 256 split in two: each rank would hold half a group."""
    linear = _linear()
    before = copy.deepcopy(linear.state_dict())
    raised: Raised | None = None
    try:
        shard_linear(
            linear, "row", scheme="int4_weight_only", caps=kp.probe("cpu"),
            policy=kp.Policy(), group_size=256, timeout=TIMEOUT, prefix="mlp.down_proj",
        )  # fmt: skip
    except kp.KernelpickError as error:
        raised = Raised.of(error)
    same = all(torch.equal(before[key], value) for key, value in linear.state_dict().items())
    return {"error": raised, "module_unchanged": same}


SCENARIOS = [
    row_int4_g64_asym,
    row_int4_g128_sym,
    row_int8_channel_sym,
    row_int4_channel_asym,
    column_int4_g32_asym,
    column_int8_channel_asym,
    row_group_straddles_ranks,
]


@pytest.fixture(scope="module")
def batch() -> Batch:
    # Build (or load) the CPU kernels here first, so the ranks only load them.
    warm = torch.nn.Sequential(torch.nn.Linear(64, 64))
    quantize_model(warm, "int4_weight_only", kp.probe("cpu"), kp.Policy(), group_size=32)
    warm(torch.randn(2, 64))
    return run_batch(SCENARIOS, WORLD, timeout_s=180.0)


def _reference(name: str) -> QuantizedLinear:
    scheme, group, symmetric, _ = _CASE[name]
    model = torch.nn.Sequential(_linear())
    quantize_model(
        model, scheme, kp.probe("cpu"), kp.Policy(), progress=False, group_size=group,
        symmetric=symmetric,
    )  # fmt: skip
    layer = model[0]
    assert isinstance(layer, QuantizedLinear)
    return layer


@pytest.mark.parametrize("name", [case[0] for case in CASES])
def test_each_rank_holds_the_single_process_layers_part_and_the_outputs_combine(
    batch: Batch, name: str
) -> None:
    style = _CASE[name][3]
    reference = _reference(name)
    whole = _tensors(reference)
    y_whole = reference(_x()).detach()
    ranks = values(batch[name], name)
    for rank, out in enumerate(ranks):
        if style == "row":
            part = slice(rank * K // WORLD, (rank + 1) * K // WORLD)
            groups = whole["scale"].shape[1]
            # Per channel, every rank holds the row's one scale (its bounds all-reduced).
            half = groups // WORLD
            cols = slice(None) if groups == 1 else slice(rank * half, (rank + 1) * half)
            want = {"q": whole["q"][:, part], "scale": whole["scale"][:, cols]}
            if "zero" in whole:
                want["zero"] = whole["zero"][:, cols]
        else:
            rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
            want = {key: whole[key][rows] for key in ("q", "scale", "zero") if key in whole}
        for key, value in want.items():
            assert np.array_equal(out[key], value), f"rank {rank}'s {key}"
        error = relative_error(torch.from_numpy(out["y"]), y_whole)
        assert error <= 4 * FP32, f"rank {rank}'s combined output: {error}"


def test_a_row_split_through_a_group_is_refused_and_the_module_kept(batch: Batch) -> None:
    for out in values(batch["row_group_straddles_ranks"], "row_group_straddles_ranks"):
        error = out["error"]
        assert isinstance(error, Raised), "a half group on each rank was quantized"
        assert "256" in error.message, error.message
        assert out["module_unchanged"]
