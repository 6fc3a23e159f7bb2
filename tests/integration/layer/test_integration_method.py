"""The PTPC linear method: select before allocating, load (fused shards too), quantize, run."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.core import ENV_DISABLED
from kernelpick.integration import (
    Fp8PtpcLinearMethod,
    KernelSelectionError,
    QuantizedLinearMethod,
    layer_state,
    weight_loader_of,
)
from tests.support.emulation import emulated, relative_error

CPU = kp.device_profile("cpu")


def _layer(
    method: QuantizedLinearMethod,
    sizes: list[int],
    k: int,
    dtype: torch.dtype = torch.float32,
    prefix: str = "model.layers.0.proj",
) -> torch.nn.Module:
    layer = torch.nn.Module()
    method.create_weights(layer, k, sizes, k, sum(sizes), dtype, prefix=prefix)
    return layer


def _load(layer: torch.nn.Module, weight: torch.Tensor) -> None:
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, weight)


def test_a100_rejects_before_allocating_with_every_reason() -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("a100"), policy=kp.Policy())
    layer = torch.nn.Module()
    with pytest.raises(KernelSelectionError) as info:
        method.create_weights(
            layer, 4096, [4096], 4096, 4096, torch.bfloat16, prefix="model.layers.0.mlp.down"
        )
    text = str(info.value)
    assert text.startswith('quantization="fp8_per_channel": ')
    assert "model.layers.0.mlp.down" in text
    assert "Reasons:" in text
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert f"\n  - {kernel}: " in text
    weight_only = [
        s for s in kp.default_catalog().for_platform("cuda") if s.kind is kp.KernelKind.W8A16
    ]
    assert text.count("cannot honour per-token activation quantization") == len(weight_only) == 4
    assert isinstance(info.value, kp.KernelpickError)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value.rejected, kp.Rejected)
    assert info.value.rejected.render() in text
    assert list(layer.parameters()) == []
    assert list(layer.buffers()) == []
    assert "kernelpick_decision" not in layer.__dict__
    assert "kernelpick_state" not in layer.__dict__


def test_an_unsupported_shape_names_the_layer_and_the_reason() -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("h100"), policy=kp.Policy())
    with pytest.raises(KernelSelectionError, match="layer 'lm_head'") as info:
        _layer(method, [4100], 4096, torch.bfloat16, prefix="lm_head")
    codes = {r.code for r in info.value.rejected.reasons}
    assert kp.RejectCode.SHAPE_ALIGNMENT in codes


def test_cpu_output_matches_the_emulation_and_the_fp32_linear() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    n, k = 192, 256
    layer = _layer(method, [n], k)
    assert layer_state(layer).decision.kernel == "cpu_fp8_gemm"
    assert layer.__dict__["kernelpick_decision"] is layer_state(layer).decision
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(n, k, generator=generator)
    bias = torch.randn(n, generator=generator)
    x = torch.randn(3, 7, k, generator=generator)
    _load(layer, weight)
    method.process_weights_after_loading(layer)
    got = method.apply(layer, x, bias)
    assert got.shape == (3, 7, n)
    config = layer_state(layer).config
    want = emulated(x.reshape(-1, k), weight, config, CPU.fp8_format, bias=bias).out.view(3, 7, n)
    assert relative_error(got, want) <= 1e-5
    exact = torch.nn.functional.linear(x, weight, bias)
    assert relative_error(got, exact) <= 0.06


def test_processing_frees_the_high_precision_weight_and_is_idempotent() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64], 128)
    _load(layer, torch.randn(64, 128))
    method.process_weights_after_loading(layer)
    weight, scale = layer.get_parameter("weight"), layer.get_parameter("weight_scale")
    assert weight.dtype == torch.float8_e4m3fn
    assert weight.shape == (64, 128)  # canonical [N, K]; _scaled_mm reads a transposed view
    assert weight.is_contiguous()
    assert weight.untyped_storage().nbytes() == 64 * 128  # one byte per weight, no fp32 left
    assert (scale.shape, scale.dtype) == ((64, 1), torch.float32)
    assert not weight.requires_grad
    method.process_weights_after_loading(layer)
    assert layer.get_parameter("weight") is weight
    assert layer.get_parameter("weight_scale") is scale


def test_fused_qkv_shards_each_land_in_their_rows() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    sizes, k = [64, 32, 32], 128
    layer = _layer(method, sizes, k, prefix="attn.qkv")
    param = layer.get_parameter("weight")
    shards = [torch.full((rows, k), float(i + 1)) for i, rows in enumerate(sizes)]
    for shard_id, shard in enumerate(shards):
        weight_loader_of(param)(param, shard, shard_id)
    assert torch.equal(param.data, torch.cat(shards))
    method.process_weights_after_loading(layer)
    out = method.apply(layer, torch.ones(1, k))
    assert out.shape == (1, 128)
    expected = torch.cat([torch.full((rows,), k * float(i + 1)) for i, rows in enumerate(sizes)])
    assert relative_error(out[0], expected) <= 0.06


def test_a_shard_that_was_never_loaded_is_an_error() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64, 32, 32], 128, prefix="attn.qkv")
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, torch.randn(64, 128), 0)
    with pytest.raises(kp.InvalidValueError, match=r"attn.qkv.*never loaded: \[1, 2\]"):
        method.process_weights_after_loading(layer)


@pytest.mark.parametrize(
    ("shard_id", "tensor", "error", "match"),
    [
        (1, torch.randn(64, 128), kp.KernelInputError, r"attn.qkv.weight\[shard 1\].*\[32, 128\]"),
        (None, torch.randn(128, 127), kp.KernelInputError, r"shape \[128, 128\]"),
        (3, torch.randn(32, 128), kp.InvalidValueError, "None or 0..2"),
        (0, torch.ones(64, 128, dtype=torch.int32), kp.KernelInputError, "high-precision float"),
    ],
)
def test_the_loader_checks_shapes_dtypes_and_shard_ids(
    shard_id: int | None, tensor: torch.Tensor, error: type[Exception], match: str
) -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64, 32, 32], 128, prefix="attn.qkv")
    param = layer.get_parameter("weight")
    before = param.detach().clone()
    with pytest.raises(error, match=match):
        weight_loader_of(param)(param, tensor, shard_id)
    assert torch.equal(param.detach(), before) or bool(torch.isnan(before).any())


def test_nan_in_a_loaded_weight_is_refused_naming_the_layer() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64], 128, prefix="blocks.3.fc")
    weight = torch.randn(64, 128)
    weight[40, 7] = float("nan")
    _load(layer, weight)
    with pytest.raises(kp.KernelInputError, match=r"blocks\.3\.fc\.weight.*row 40"):
        method.process_weights_after_loading(layer)
    assert layer.get_parameter("weight").dtype == torch.float32  # nothing was replaced


def test_caps_of_another_device_select_but_running_needs_that_device() -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("h100"), policy=kp.Policy())
    layer = _layer(method, [64], 128, torch.bfloat16)
    assert layer_state(layer).decision.kernel == "cuda_rowwise_scaled_mm"
    _load(layer, torch.randn(64, 128, dtype=torch.bfloat16))
    with pytest.raises(
        kp.InvalidValueError, match="a cuda device, since cuda_rowwise_scaled_mm runs on cuda"
    ):
        method.process_weights_after_loading(layer)
    assert layer.get_parameter("weight").dtype == torch.bfloat16


def test_apply_before_processing_is_an_error() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64], 128)
    with pytest.raises(kp.InvalidValueError, match="process_weights_after_loading"):
        method.apply(layer, torch.randn(2, 128))


def test_a_scheme_that_needs_calibration_is_refused() -> None:
    with pytest.raises(kp.InvalidValueError, match="calibrated"):
        QuantizedLinearMethod("fp8_per_tensor_static", caps=CPU)


def test_policy_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both per-token kernels ahead of the reference, so the choice shows the variable was read.
    monkeypatch.setenv(ENV_DISABLED, "cpu_fp8_gemm,cpu_rowwise_scaled_mm")
    method = Fp8PtpcLinearMethod(caps=CPU)
    assert layer_state(_layer(method, [64], 128)).decision.kernel == "cpu_dequant_reference"


def test_apply_compiles_with_fullgraph_on_cpu() -> None:
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy())
    layer = _layer(method, [64, 64], 128)
    _load(layer, torch.randn(128, 128))
    method.process_weights_after_loading(layer)
    x = torch.randn(5, 128)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: method.apply(layer, t), fullgraph=True)
    assert torch.equal(compiled(x), method.apply(layer, x))


def test_the_methods_settings_are_read_only() -> None:
    # Its layers keep the settings they were made with; a change would reach only some.
    method = Fp8PtpcLinearMethod(caps=CPU, policy=kp.Policy(), chunk_rows=64)
    assert (method.scheme, method.caps, method.chunk_rows) == (kp.Scheme.FP8_PER_CHANNEL, CPU, 64)
    with pytest.raises(AttributeError):
        method.chunk_rows = 16  # type: ignore[misc]
    with pytest.raises(AttributeError):
        method.checkpoint_format = "fp8"  # type: ignore[misc,assignment]
    assert method.policy == kp.Policy()
    assert method.catalog is None
    assert method.launches is None
