"""The linear method with fp8_block and int8_per_channel: online from high-precision
weights, and pre-quantized from checkpoint shards (q/k/v), whose block scales shard along
N by whole blocks."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.integration import (
    CheckpointFormat,
    QuantizedLinearMethod,
    layer_state,
    weight_loader_of,
)
from kernelpick.kernels._canonical import quantize_canonical
from tests.support.emulation import BOUND, dynamic_scale, emulated, fake_quant, relative_error

CPU = kp.device_profile("cpu")
K = 192  # one and a half blocks of 128


def _layer(
    method: QuantizedLinearMethod, sizes: list[int], prefix: str = "attn.qkv"
) -> torch.nn.Module:
    layer = torch.nn.Module()
    method.create_weights(layer, K, sizes, K, sum(sizes), torch.float32, prefix=prefix)
    return layer


def _load(layer: torch.nn.Module, name: str, tensor: torch.Tensor, shard: int | None) -> None:
    param = layer.get_parameter(name)
    weight_loader_of(param)(param, tensor, shard)


def _weights(sizes: list[int], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, K, generator=generator) * (i + 1) for i, rows in enumerate(sizes)]


@pytest.mark.parametrize("scheme", ["fp8_block", "int8_per_channel"])
def test_online_fused_shards_match_the_emulation(scheme: str) -> None:
    method = QuantizedLinearMethod(scheme, CPU, kp.Policy())
    sizes = [128, 64, 64]  # online, the fused weight is quantized whole: any sizes do
    layer = _layer(method, sizes)
    weights = _weights(sizes)
    for shard, weight in enumerate(weights):
        _load(layer, "weight", weight, shard)
    method.process_weights_after_loading(layer)
    config = layer_state(layer).config
    assert tuple(layer.get_parameter("weight_scale").shape) == config.weight_scale_shape
    x = torch.randn(5, K)
    want = emulated(x, torch.cat(weights), config, Dtype.FLOAT8_E4M3FN).out
    assert relative_error(method.apply(layer, x), want) <= BOUND["float32"]


@pytest.mark.parametrize(("scheme", "sizes"), [("fp8_block", [128, 256, 64]),
                                               ("int8_per_channel", [64, 32, 96])])  # fmt: skip
def test_pre_quantized_shards_each_keep_their_own_scales(scheme: str, sizes: list[int]) -> None:
    """Each shard was quantized as a layer of its own, as a checkpoint stores q, k and v:
    the fused layer's output rows are each shard's."""
    method = QuantizedLinearMethod(scheme, CPU, kp.Policy(), checkpoint_format="pre_quantized")
    layer = _layer(method, sizes)
    weight = layer.get_parameter("weight")
    assert weight.dtype == (torch.int8 if scheme.startswith("int8") else torch.float8_e4m3fn)
    weights = _weights(sizes)
    x = torch.randn(4, K)
    want = []
    for shard, original in enumerate(weights):
        config = kp.quant_config(scheme, weight_shape=(sizes[shard], K))
        quantized, scale = quantize_canonical(original, config)
        _load(layer, "weight", quantized, shard)
        _load(layer, "weight_scale", scale, shard)
        want.append(emulated(x, original, config, Dtype.FLOAT8_E4M3FN).out)
    method.process_weights_after_loading(layer)
    assert relative_error(method.apply(layer, x), torch.cat(want, dim=-1)) <= BOUND["float32"]


def test_block_shards_that_would_share_a_block_of_scales_are_refused_before_allocating() -> None:
    method = QuantizedLinearMethod("fp8_block", CPU, kp.Policy(), checkpoint_format="fp8")
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError) as info:
        method.create_weights(layer, K, [64, 128], K, 192, torch.float32, prefix="attn.qkv")
    text = str(info.value)
    for named in ("attn.qkv", "[64, 128]", "block size is 128", "shard 0 has 64 rows"):
        assert named in text
    assert list(layer.parameters()) == []
    assert "kernelpick_state" not in layer.__dict__
    # The last shard may end inside a block, as a layer of its own may.
    _layer(method, [128, 64])


def test_a_block_scale_shard_of_the_wrong_shape_is_refused_and_nothing_is_written() -> None:
    method = QuantizedLinearMethod("fp8_block", CPU, kp.Policy(), checkpoint_format="pre_quantized")
    layer = _layer(method, [128, 64])
    scale = layer.get_parameter("weight_scale")
    assert tuple(scale.shape) == (2, 2)  # [ceil(192 / 128), ceil(192 / 128)]
    before = scale.detach().clone()
    with pytest.raises(kp.KernelInputError, match=r"weight_scale\[shard 1\].*shape \[1, 2\]"):
        _load(layer, "weight_scale", torch.ones(2, 1), 1)  # transposed
    assert torch.equal(scale.detach(), before) or bool(torch.isnan(before).any())
    assert layer_state(layer).loaded == {}


def test_int8_weights_load_whole_range_and_other_dtypes_are_refused() -> None:
    method = QuantizedLinearMethod("int8_per_channel", CPU, kp.Policy(), checkpoint_format="fp8")
    layer = _layer(method, [64])
    weight = torch.randint(-128, 128, (64, K), dtype=torch.int8)
    weight[0, 0] = -128  # compressed-tensors' symmetric int8 reaches it
    fp8 = torch.zeros(64, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(kp.KernelInputError, match=r"dtype int8 \(an int8 scheme's weight\)$"):
        _load(layer, "weight", fp8, None)
    with pytest.raises(kp.KernelInputError, match="checkpoint_format='high_precision'"):
        _load(layer, "weight", weight.float(), None)
    _load(layer, "weight", weight, None)
    scale = torch.rand(64, 1) + 0.01
    _load(layer, "weight_scale", scale, None)
    method.process_weights_after_loading(layer)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    # The weight as loaded (-128 included), times x through per-token int8.
    x_int8 = fake_quant(x, dynamic_scale(x, True, Dtype.INT8), Dtype.INT8)
    want = x_int8 @ (weight.float() * scale).t()
    assert relative_error(method.apply(layer, x), want) <= BOUND["float32"]


def test_the_pre_quantized_format_has_one_member_under_both_names() -> None:
    assert CheckpointFormat["FP8"] is CheckpointFormat.PRE_QUANTIZED  # an alias
    for name in ("fp8", "pre_quantized", CheckpointFormat.FP8):
        method = QuantizedLinearMethod("fp8_block", CPU, kp.Policy(), checkpoint_format=name)
        assert method.checkpoint_format is CheckpointFormat.PRE_QUANTIZED
    assert [str(f) for f in CheckpointFormat] == ["high_precision", "pre_quantized"]


def test_block_size_is_fp8_blocks_only_and_sizes_its_scales() -> None:
    method = QuantizedLinearMethod(
        "fp8_block", CPU, kp.Policy(), checkpoint_format="fp8", block_size=64
    )
    assert method.block_size == 64
    layer = _layer(method, [64, 64, 32])  # whole 64-row blocks now
    assert tuple(layer.get_parameter("weight_scale").shape) == (3, 3)
    with pytest.raises(kp.InvalidValueError, match="block_size 64: expected None: only fp8_block"):
        QuantizedLinearMethod("int8_per_channel", CPU, kp.Policy(), block_size=64)
    with pytest.raises(kp.InvalidValueError, match="block_size 0"):
        QuantizedLinearMethod("fp8_block", CPU, kp.Policy(), block_size=0)
