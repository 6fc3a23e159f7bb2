"""Integer weight-only layers (int4, int8) through the linear method and QuantizedLinear:
their pack-quantized parameters planned before allocating, loaded shard by shard with
every tensor checked, and run against the fp64 emulation; a split, a misaligned fused
shard or a g_idx that differs between shards is refused before anything is read two ways."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import (
    ParallelStyle,
    QuantizedLinearMethod,
    TensorParallel,
    layer_state,
    quantize_model,
    weight_loader_of,
)
from kernelpick.kernels import pack_int, pack_zero_points
from tests.support.int_emulation import dequantize_fp64

CPU = kp.device_profile("cpu")
N, K = 48, 128


def _method(scheme: str, **grouping: object) -> QuantizedLinearMethod:
    return QuantizedLinearMethod(
        scheme,
        CPU,
        kp.Policy(),
        checkpoint_format="pre_quantized",
        **grouping,  # type: ignore[arg-type]
    )


def _tensors(seed: int, n: int, bits: int, groups: int, symmetric: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    half = 1 << (bits - 1)
    q = torch.randint(-half, half, (n, K), dtype=torch.int8, generator=generator)
    tensors = {
        "weight_packed": pack_int(q, bits),
        "weight_scale": torch.rand(n, groups, generator=generator) / 16 + 1e-3,
    }
    if not symmetric:
        zero = torch.randint(-half, half, (n, groups), dtype=torch.int8, generator=generator)
        tensors["weight_zero_point"] = pack_zero_points(zero, bits)
    return tensors


def _load(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], shard: object = None) -> None:
    for name, tensor in tensors.items():
        param = layer.get_parameter(name)
        weight_loader_of(param)(param, tensor, shard)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scheme", "bits", "group_size", "symmetric"),
    [("int4_weight_only", 4, 32, True), ("int4_weight_only", 4, 64, False),
     ("int4_weight_only", 4, -1, True), ("int8_weight_only", 8, -1, True),
     ("int8_weight_only", 8, 32, False)],
)  # fmt: skip
def test_the_method_runs_a_pre_quantized_layer_as_the_emulation_reads_it(
    scheme: str, bits: int, group_size: int, symmetric: bool
) -> None:
    method = _method(scheme, group_size=group_size, symmetric=symmetric)
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, torch.float32)
    groups = 1 if group_size == -1 else K // group_size
    expected = {"weight_packed": (N, K * bits // 32), "weight_scale": (N, groups)}
    if not symmetric:
        expected["weight_zero_point"] = (N * bits // 32, groups)
    assert {name: tuple(p.shape) for name, p in layer.named_parameters()} == expected
    tensors = _tensors(0, N, bits, groups, symmetric)
    _load(layer, tensors)
    method.process_weights_after_loading(layer)
    config = layer_state(layer).config
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(1))
    reference = x.double() @ dequantize_fp64(tensors, config).T
    torch.testing.assert_close(method.apply(layer, x).double(), reference, rtol=1e-4, atol=1e-4)


def test_fused_shards_load_their_own_zero_point_words() -> None:
    method = _method("int4_weight_only", group_size=32, symmetric=False)
    layer = torch.nn.Module()
    method.create_weights(layer, K, [16, 32], K, 48, torch.float32)
    parts = [_tensors(seed, rows, 4, 4, False) for seed, rows in ((2, 16), (3, 32))]
    for index, part in enumerate(parts):
        _load(layer, part, index)
    method.process_weights_after_loading(layer)
    whole = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(4))
    reference = x.double() @ dequantize_fp64(whole, layer_state(layer).config).T
    torch.testing.assert_close(method.apply(layer, x).double(), reference, rtol=1e-4, atol=1e-4)


def test_a_fused_shard_that_splits_a_word_of_zero_points_is_refused() -> None:
    method = _method("int4_weight_only", group_size=32, symmetric=False)
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError, match="words of packed zero points"):
        method.create_weights(layer, K, [12, 36], K, 48, torch.float32)
    assert not list(layer.parameters())


def test_shards_with_different_g_idx_are_refused_not_overwritten() -> None:
    method = _method("int4_weight_only", group_size=32, act_order=True)
    layer = torch.nn.Module()
    method.create_weights(layer, K, [16, 32], K, 48, torch.float32)
    g_idx = (torch.arange(K) % 4).to(torch.int32)
    param = layer.get_parameter("weight_g_idx")
    weight_loader_of(param)(param, g_idx, 0)
    with pytest.raises(kp.KernelInputError, match="share one column order"):
        weight_loader_of(param)(param, g_idx.flip(0), 1)
    assert torch.equal(param, g_idx)


def test_a_split_pre_quantized_integer_layer_is_refused_by_name() -> None:
    method = _method("int4_weight_only").with_tensor_parallel(
        TensorParallel(ParallelStyle.COLUMN, 0, 2)
    )
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError, match="own loaders do not narrow pack-quantized"):
        method.create_weights(layer, K, [N // 2], K, N, torch.float32)
    assert not list(layer.parameters())


def test_state_dict_holds_the_format_and_load_state_dict_checks_it() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(K, N))
    quantize_model(model, "int4_weight_only", CPU, kp.Policy(), group_size=32, symmetric=False)
    state = model.state_dict()
    assert sorted(state) == ["0.bias", "0.weight_packed", "0.weight_scale", "0.weight_shape",
                             "0.weight_zero_point"]  # fmt: skip
    assert state["0.weight_shape"].tolist() == [N, K]
    model.load_state_dict(state)  # its own state dict, weight_shape and all
    before = {name: tensor.clone() for name, tensor in state.items()}
    refused = [({"0.weight_shape": torch.tensor([N, K + 1])}, "weight_shape"),
               ({"0.weight_packed": state["0.weight_packed"].float()}, "int32")]  # fmt: skip
    for bad, match in refused:
        with pytest.raises(kp.KernelpickError, match=match):
            model.load_state_dict({**state, **bad})
        after = model.state_dict()
        assert all(torch.equal(before[name], after[name]) for name in before)


def test_spare_bits_past_k_are_refused() -> None:
    method = _method("int4_weight_only", group_size=-1)
    layer = torch.nn.Module()
    method.create_weights(layer, 100, [N], 100, N, torch.float32)  # 13 words, 4 values spare
    tensors = {"weight_packed": torch.zeros(N, 13, dtype=torch.int32) | (1 << 28),
               "weight_scale": torch.ones(N, 1)}  # fmt: skip
    _load(layer, tensors)
    with pytest.raises(kp.KernelInputError, match="zero bits past value 100"):
        method.process_weights_after_loading(layer)


def test_a_state_dict_with_a_zero_point_the_layer_lacks_is_refused_before_any_write() -> None:
    symmetric = torch.nn.Sequential(torch.nn.Linear(K, N))
    asymmetric = torch.nn.Sequential(torch.nn.Linear(K, N))
    for model, zero in ((symmetric, True), (asymmetric, False)):
        quantize_model(model, "int4_weight_only", CPU, kp.Policy(), group_size=32, symmetric=zero)
    before = {name: tensor.clone() for name, tensor in symmetric.state_dict().items()}
    for strict in (True, False):  # torch would skip the zero point as unexpected
        with pytest.raises(kp.KernelInputError, match="weight_zero_point"):
            symmetric.load_state_dict(asymmetric.state_dict(), strict=strict)
        after = symmetric.state_dict()
        assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_g_idx_outside_int32_is_refused_before_the_copy_wraps_it() -> None:
    method = _method("int4_weight_only", group_size=32, act_order=True)
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, torch.float32)
    param = layer.get_parameter("weight_g_idx")
    wrapped = (torch.arange(K) % 4) + 2**32  # int64: an int32 copy would read 0..3
    with pytest.raises(kp.KernelInputError, match=r"each group 0\.\.3"):
        weight_loader_of(param)(param, wrapped)


@pytest.mark.parametrize("kernel", ["cpu_wna16_reference", "cpu_int4_gemm"])
def test_an_integer_layer_compiles_with_fullgraph(kernel: str) -> None:
    # The layer's accepted tensors are prepared inside the graph: their value checks,
    # which read data, ran when the layer accepted them.
    dtype = torch.bfloat16 if kernel == "cpu_int4_gemm" else torch.float32
    policy = kp.Policy(force=kernel)
    probe = kp.probe("cpu")
    method = QuantizedLinearMethod(
        "int4_weight_only", probe, policy, checkpoint_format="pre_quantized", group_size=32,
        symmetric=False, act_order=True,
    )  # fmt: skip
    layer = torch.nn.Module()
    try:
        method.create_weights(layer, K, [N], K, N, dtype)
    except kp.KernelpickError as error:  # cpu_int4_gemm needs AVX512-BF16
        pytest.skip(f"{kernel} is not selected on this CPU: {error}")
    tensors = _tensors(5, N, 4, K // 32, False)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[torch.randperm(K, generator=torch.Generator().manual_seed(6))] = (
        torch.arange(K) // 32
    ).to(torch.int32)
    _load(layer, {**tensors, "weight_g_idx": g_idx})
    method.process_weights_after_loading(layer)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(7)).to(dtype)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: method.apply(layer, t), fullgraph=True)
    got, eager = compiled(x).float(), method.apply(layer, x).float()
    torch.testing.assert_close(got, eager, rtol=8e-3, atol=8e-3)  # one bf16 rounding apart
