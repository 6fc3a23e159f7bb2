"""Integer weight-only layers (int4, int8) through the vLLM plugin and vLLM's real parallel
layers (0.33.0, CPU): quantized on load, and pre-quantized from pack-quantized tensors
through vLLM's packed parameter classes, fused q/k/v and gate/up shards included, each
against a float64 dequantization of the tensors it loaded; two gloo ranks equal one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import layer_state, weight_loader_of
from kernelpick.kernels import pack_zero_points, quantize_int
from tests.engines import vllm_workers as workers
from tests.support.int_emulation import dequantize_fp64

workers.require_vllm()

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND = 1e-4  # fp32 against fp64 of the same integer weights: summation order only


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _packed(
    weight: torch.Tensor, scheme: str, group_size: int, symmetric: bool
) -> dict[str, torch.Tensor]:
    """A checkpoint's pack-quantized tensors of ``weight``, by their format names."""
    n, k = weight.shape
    config = kp.quant_config(
        scheme, weight_shape=(n, k), group_size=group_size, symmetric=symmetric,
        out_dtype="float32",
    )  # fmt: skip
    packed, scale, zero = quantize_int(weight, config)
    tensors = {"weight_packed": packed, "weight_scale": scale,
               "weight_shape": torch.tensor([n, k])}  # fmt: skip
    if zero is not None:
        tensors["weight_zero_point"] = pack_zero_points(zero, config.weight.dtype.bits)
    return tensors


def _load(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], shard: Any = None) -> None:
    for name, tensor in tensors.items():
        param = layer.get_parameter(name)
        weight_loader_of(param)(param, tensor, shard)


GROUPINGS = [
    ("int4_weight_only", 64, True),
    ("int4_weight_only", 32, False),
    ("int8_weight_only", -1, True),
    ("int8_weight_only", -1, False),  # one column of zero points, on a row-parallel layer too
    ("int8_weight_only", 64, False),
]


@pytest.mark.usefixtures("vllm_tp1")
@pytest.mark.parametrize(("scheme", "group_size", "symmetric"), GROUPINGS)
def test_pre_quantized_layers_load_through_vllm_and_match_their_tensors(
    scheme: str, group_size: int, symmetric: bool
) -> None:
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.parameter import PackedvLLMParameter

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig(
        scheme, group_size=group_size, symmetric=symmetric, checkpoint_format="pre_quantized"
    )
    k, x = workers.K, workers.peaked_x(world=1)
    row = RowParallelLinear(k, 64, bias=False, params_dtype=torch.float32, quant_config=config,
                            prefix="m.0.down")  # fmt: skip
    qkv = QKVParallelLinear(k, 32, 4, 2, bias=False, params_dtype=torch.float32,
                            quant_config=config, prefix="m.0.qkv")  # fmt: skip
    gate_up = MergedColumnParallelLinear(k, [64, 64], bias=False, params_dtype=torch.float32,
                                         quant_config=config, prefix="m.0.gate_up")  # fmt: skip
    for layer in (row, qkv, gate_up):
        assert isinstance(layer.get_parameter("weight_packed"), PackedvLLMParameter)
        assert layer_state(layer).decision.kernel.startswith("cpu_")
    whole = _packed(workers.weight(64, k, 1), scheme, group_size, symmetric)
    _load(row, whole)
    shards = {sid: _packed(workers.weight(rows, k, seed), scheme, group_size, symmetric)
              for sid, rows, seed in zip("qkv", (128, 64, 64), (3, 4, 5), strict=True)}  # fmt: skip
    for sid, tensors in shards.items():
        _load(qkv, tensors, sid)
    halves = [
        _packed(workers.weight(64, k, seed), scheme, group_size, symmetric) for seed in (6, 7)
    ]
    for index, tensors in enumerate(halves):
        _load(gate_up, tensors, index)
    for layer, parts in ((row, [whole]), (qkv, list(shards.values())), (gate_up, halves)):
        layer.quant_method.process_weights_after_loading(layer)
        cfg = layer_state(layer).config
        dense = torch.cat([
            dequantize_fp64(part, attrs_evolve(cfg, part["weight_packed"].shape[0]))
            for part in parts
        ])  # fmt: skip
        out, _ = layer(x)
        assert _relative(out, x.double() @ dense.T) < BOUND, layer.prefix


@pytest.mark.usefixtures("vllm_tp1")
def test_a_fused_shard_of_a_partial_zero_point_word_is_refused() -> None:
    # vLLM places a shard's packed zero points by rows // 8: a last shard of 36 rows would
    # leave its fifth word unloaded.
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig(
        "int4_weight_only", group_size=32, symmetric=False, checkpoint_format="pre_quantized"
    )
    with pytest.raises(kp.InvalidValueError, match="words of packed zero points"):
        MergedColumnParallelLinear(128, [64, 36], bias=False, params_dtype=torch.float32,
                                   quant_config=config, prefix="m.3.gate_up")  # fmt: skip


@pytest.mark.usefixtures("vllm_tp1")
def test_shards_of_another_column_order_are_refused_not_overwritten() -> None:
    from vllm.model_executor.layers.linear import QKVParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig(
        "int4_weight_only", group_size=32, act_order=True, checkpoint_format="pre_quantized"
    )
    qkv = QKVParallelLinear(128, 32, 4, 2, bias=False, params_dtype=torch.float32,
                            quant_config=config, prefix="m.4.qkv")  # fmt: skip
    order = (torch.arange(128) % 4).to(torch.int32)
    param = qkv.get_parameter("weight_g_idx")
    weight_loader_of(param)(param, order, "q")
    with pytest.raises(kp.KernelInputError, match="share one column order"):
        weight_loader_of(param)(param, order.flip(0), "k")
    assert torch.equal(param, order)


def attrs_evolve(config: kp.QuantConfig, rows: int) -> kp.QuantConfig:
    import attrs

    return attrs.evolve(config, weight_shape=(rows, config.k))


@pytest.mark.usefixtures("vllm_tp1")
def test_a_weight_shape_of_another_layer_is_refused() -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig("int4_weight_only", checkpoint_format="pre_quantized")
    layer = ColumnParallelLinear(workers.K, 64, bias=False, params_dtype=torch.float32,
                                 quant_config=config, prefix="m.1.up")  # fmt: skip
    param = layer.get_parameter("weight_shape")
    with pytest.raises(kp.KernelInputError, match="weight_shape"):
        weight_loader_of(param)(param, torch.tensor([64, workers.K + 8]))


@pytest.mark.usefixtures("vllm_tp1")
@pytest.mark.parametrize("scheme", ["int4_weight_only", "int8_weight_only"])
def test_integer_schemes_quantize_on_load_through_vllm_layers(scheme: str) -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    layer = ColumnParallelLinear(
        workers.K, workers.N, bias=False, params_dtype=torch.float32,
        quant_config=KernelpickConfig(scheme, group_size=64), prefix="m.2.up",
    )  # fmt: skip
    w, x = workers.weight(), workers.peaked_x(world=1)
    layer.weight.weight_loader(layer.weight, w)
    layer.quant_method.process_weights_after_loading(layer)
    assert "weight" not in dict(layer.named_parameters())
    expected = _packed(w, scheme, 64, True)
    assert torch.equal(layer.get_parameter("weight_packed"), expected["weight_packed"])
    dense = dequantize_fp64(expected, layer_state(layer).config)
    out, _ = layer(x)
    assert _relative(out, x.double() @ dense.T) < BOUND


def test_a_compressed_tensors_w4a16_config_reads_its_grouping() -> None:
    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.integration.formats import compressed_tensors as _ct_config

    checkpoint = _ct_config.to_config(
        kp.Scheme.INT4_WEIGHT_ONLY, ["lm_head"], group_size=32, symmetric=False
    )
    config = KernelpickConfig.from_config(checkpoint)
    assert config.recipe.group_size == 32
    assert config.recipe.symmetric is False
    assert config.checkpoint_format.value == "pre_quantized"


@pytest.mark.usefixtures("vllm_tp1")
def test_two_ranks_equal_one(tmp_path: Path) -> None:
    """Two gloo ranks of pre-quantized int4 and int8 layers: a row-parallel rank holds
    whole groups of K (and whole words of them), a column-parallel one its rows and its
    words of packed zero points; online per-channel row-parallel layers quantize each
    rank's part on the whole row's bounds. Each equals the single-rank layer, and a group
    the split would cut is refused on every rank."""
    from tests.engines import vllm_int_workers as int_workers

    port = workers.free_port()

    def spawn(rank: int) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "tests.engines.vllm_int_workers", str(rank), str(port),
                   str(tmp_path)]  # fmt: skip
        return subprocess.Popen(  # this interpreter, this repository's module
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    ranks = [spawn(rank) for rank in range(workers.WORLD)]
    results = []
    for process in ranks:
        out, _ = process.communicate(timeout=240)
        assert process.returncode == 0, out
        results.append(json.loads(out.rsplit("RESULT ", 1)[1]))
    for result in results:
        assert result["straddling"].startswith("InvalidValueError"), result
        assert "K per rank a multiple of the scale block, 96" in result["straddling"], result
    single = int_workers.integer_row_and_column()  # this process's TP = 1 group
    for rank in range(workers.WORLD):
        shard = torch.load(tmp_path / f"int_rank{rank}.pt")
        for key, value in single.items():
            assert _relative(shard[key], value) < 1e-5, (rank, key)
