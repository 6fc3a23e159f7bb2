"""The linear method's two checkpoint formats: pre-quantized FP8 shards with their scales,
and an online loader that refuses anything already quantized."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.integration import QuantizedLinearMethod, layer_state, weight_loader_of
from kernelpick.kernels._canonical import dequantize_weight, quantize_canonical
from kernelpick.kernels._quantize import CHUNK_ROWS
from tests.support.emulation import BOUND, emulated, relative_error

CPU = kp.device_profile("cpu")
SIZES, K = [64, 32, 32], 128


def _method(scheme: str, checkpoint: str, chunk_rows: int = CHUNK_ROWS) -> QuantizedLinearMethod:
    return QuantizedLinearMethod(
        scheme, CPU, kp.Policy(), checkpoint_format=checkpoint, chunk_rows=chunk_rows
    )


def _layer(scheme: str = "fp8_per_channel", checkpoint: str = "fp8") -> torch.nn.Module:
    method = _method(scheme, checkpoint)
    layer = torch.nn.Module()
    method.create_weights(layer, K, SIZES, K, sum(SIZES), torch.float32, prefix="attn.qkv")
    layer.__dict__["method"] = method
    return layer


def _load(layer: torch.nn.Module, name: str, tensor: object, shard: int | None = None) -> None:
    param = layer.get_parameter(name)
    weight_loader_of(param)(param, tensor, shard)  # type: ignore[arg-type]


def _shards(scheme: str, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each shard's high-precision weight and its canonical FP8 weight and scale."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, rows in enumerate(SIZES):
        w = torch.randn(rows, K, generator=generator) * (i + 1)  # scales differ per shard
        fp8, scale = quantize_canonical(w, kp.quant_config(scheme, weight_shape=(rows, K)))
        out.append((w, fp8, scale))
    return out


def _process(layer: torch.nn.Module) -> None:
    layer.__dict__["method"].process_weights_after_loading(layer)


def _apply(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = layer.__dict__["method"].apply(layer, x)
    return out


def test_fused_fp8_shards_load_one_by_one_each_with_its_scale_rows() -> None:
    layer = _layer()
    assert layer.get_parameter("weight").dtype == torch.float8_e4m3fn
    assert tuple(layer.get_parameter("weight_scale").shape) == (128, 1)
    shards = _shards("fp8_per_channel")
    for i, (_, fp8, scale) in enumerate(shards):
        _load(layer, "weight", fp8, i)
        _load(layer, "weight_scale", scale.reshape(-1) if i == 1 else scale, i)  # [rows] too
    _process(layer)
    x = torch.randn(4, K)
    config = layer_state(layer).config
    want = emulated(x, torch.cat([w for w, _, _ in shards]), config, Dtype.FLOAT8_E4M3FN).out
    assert relative_error(_apply(layer, x), want) <= BOUND["float32"]


def test_per_tensor_shards_are_requantized_to_the_largest_scale() -> None:
    layer = _layer("fp8_per_tensor")
    assert tuple(layer.get_parameter("weight_scale").shape) == (3,)  # one per shard
    shards = _shards("fp8_per_tensor")
    for i, (_, fp8, scale) in enumerate(shards):
        _load(layer, "weight", fp8, i)
        _load(layer, "weight_scale", scale.bfloat16().float(), i)
    largest_rows = slice(64 + 32, 128)  # shard 2 has the largest values, so the largest scale
    kept = layer.get_parameter("weight").detach()[largest_rows].clone()
    _process(layer)
    weight, scale = layer.get_parameter("weight"), layer.get_parameter("weight_scale")
    assert tuple(scale.shape) == (1,)
    assert float(scale) == float(shards[2][2].bfloat16().float())
    assert torch.equal(weight.detach()[largest_rows].view(torch.uint8), kept.view(torch.uint8))
    original = torch.cat([w for w, _, _ in shards])
    config = layer_state(layer).config
    # One more FP8 rounding for the smaller shards: within FP8's own accuracy.
    assert relative_error(dequantize_weight(weight, scale, config), original) <= 0.06


def test_static_input_scales_take_the_largest_shard_scale() -> None:
    layer = _layer("fp8_per_tensor_static")
    for i, (_, fp8, scale) in enumerate(_shards("fp8_per_tensor_static")):
        _load(layer, "weight", fp8, i)
        _load(layer, "weight_scale", scale, i)
        _load(layer, "input_scale", torch.tensor(0.01 * (i + 1)), i)
    _process(layer)
    assert float(layer.get_parameter("input_scale")) == pytest.approx(0.03)
    assert _apply(layer, torch.randn(2, K)).shape == (2, 128)


def _engine_layer(
    calls: list[int | None] | None = None,
) -> tuple[QuantizedLinearMethod, torch.nn.Module]:
    """A pre-quantized layer whose parameters load through an engine's own loader, which
    copies rows and checks nothing (recording each shard id in ``calls``)."""
    method = QuantizedLinearMethod("fp8_per_channel", CPU, kp.Policy(), checkpoint_format="fp8")

    def copy_rows(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None:
        if calls is not None:
            calls.append(shard_id)
        start = sum(SIZES[: shard_id or 0])
        with torch.no_grad():
            param[start : start + loaded_weight.shape[0]].copy_(loaded_weight)

    layer = torch.nn.Module()
    method.create_weights(layer, K, SIZES, K, 128, torch.float32, weight_loader=copy_rows)
    return method, layer


@pytest.mark.parametrize("engine_loader", [False, True])
def test_negative_zero_bytes_become_positive_zero_whoever_loads_them(engine_loader: bool) -> None:
    if engine_loader:
        method, layer = _engine_layer()
    else:
        layer = _layer()
        method = layer.__dict__["method"]
    for i, (_, fp8, scale) in enumerate(_shards("fp8_per_channel")):
        fp8 = fp8.clone()
        fp8.view(torch.uint8)[:, :3] = 0x80  # -0 in e4m3fn, NaN in e4m3fnuz
        _load(layer, "weight", fp8, i)
        _load(layer, "weight_scale", scale, i)
    method.process_weights_after_loading(layer)
    weight = layer.get_parameter("weight").detach()
    assert not bool((weight.view(torch.uint8) == 0x80).any())
    assert bool((weight[:, :3].float() == 0).all())


def _nan(fp8: torch.Tensor) -> torch.Tensor:
    out = fp8.clone()
    out.view(torch.uint8)[5, 7] = 0xFF
    return out


FP8_MISUSE: list[tuple[str, str, Callable[[torch.Tensor, torch.Tensor], object], str]] = [
    ("float weight", "weight", lambda w, s: w.float(), "checkpoint_format='high_precision'"),
    ("fnuz weight", "weight", lambda w, s: w.view(torch.float8_e4m3fnuz), "float8_e4m3fn"),
    ("nan byte", "weight", lambda w, s: _nan(w), "row 5 holds a NaN byte"),
    ("meta weight", "weight", lambda w, s: w.to("meta"), "meta"),
    ("scale rows", "weight_scale", lambda w, s: s[:10], "shape [64, 1]"),
    ("zero scale", "weight_scale", lambda w, s: s * 0, "positive, finite"),
    ("int scale", "weight_scale", lambda w, s: s.int(), "float32"),
    ("sparse scale", "weight_scale", lambda w, s: s.to_sparse(), "dense"),
]


@pytest.mark.parametrize(
    ("case", "name", "make", "named"), FP8_MISUSE, ids=[m[0] for m in FP8_MISUSE]
)
def test_the_fp8_loaders_refuse_what_they_could_misread_and_write_nothing(
    case: str, name: str, make: Callable[[torch.Tensor, torch.Tensor], object], named: str
) -> None:
    layer = _layer()
    _, fp8, scale = _shards("fp8_per_channel")[0]
    param = layer.get_parameter(name)
    before = param.detach().clone()
    with pytest.raises(kp.KernelInputError) as info:
        _load(layer, name, make(fp8, scale), 0)
    assert named in str(info.value)
    assert f"attn.qkv.{name}[shard 0]" in str(info.value)
    assert torch.equal(param.detach().view(torch.uint8), before.view(torch.uint8))
    assert layer_state(layer).loaded.get(name, set()) == set()


ONLINE_MISUSE: list[tuple[str, Callable[[], object], str]] = [
    (
        "fp8",
        lambda: torch.zeros(64, K, dtype=torch.float8_e4m3fn),
        "checkpoint_format='pre_quantized'",
    ),
    ("int8", lambda: torch.zeros(64, K, dtype=torch.int8), "checkpoint_format='pre_quantized'"),
    ("meta", lambda: torch.zeros(64, K, device="meta"), "meta"),
    ("sparse", lambda: torch.zeros(64, K).to_sparse(), "dense"),
    ("complex", lambda: torch.zeros(64, K, dtype=torch.complex64), "real floating-point"),
]


@pytest.mark.parametrize(
    ("case", "make", "named"), ONLINE_MISUSE, ids=[m[0] for m in ONLINE_MISUSE]
)
def test_the_online_loader_refuses_quantized_and_dataless_tensors(
    case: str, make: Callable[[], object], named: str
) -> None:
    layer = _layer(checkpoint="high_precision")
    param = layer.get_parameter("weight")
    before = param.detach().clone()
    with pytest.raises(kp.KernelInputError) as info:
        _load(layer, "weight", make(), 0)
    assert named in str(info.value)
    assert "attn.qkv.weight[shard 0]" in str(info.value)
    assert torch.equal(param.detach(), before) or bool(torch.isnan(before).any())
    assert layer_state(layer).loaded == {}


def test_a_loader_called_with_another_parameter_refuses_it() -> None:
    layer, other = _layer(), _layer()
    loader = weight_loader_of(layer.get_parameter("weight_scale"))
    foreign = other.get_parameter("weight_scale")
    before = foreign.detach().clone()
    with pytest.raises(kp.InvalidValueError, match=r"attn\.qkv\.weight_scale, the parameter"):
        loader(foreign, torch.ones(64, 1), 0)
    with pytest.raises(kp.InvalidValueError, match="the parameter this loader was made for"):
        loader(layer.get_parameter("weight"), torch.ones(64, 1), 0)
    assert torch.equal(foreign.detach(), before) or bool(torch.isnan(before).any())


def test_scales_never_loaded_are_an_error() -> None:
    layer = _layer()
    for i, (_, fp8, scale) in enumerate(_shards("fp8_per_channel")):
        _load(layer, "weight", fp8, i)
        if i != 2:
            _load(layer, "weight_scale", scale, i)
    with pytest.raises(kp.InvalidValueError, match=r"attn\.qkv\.weight_scale.*never loaded: \[2\]"):
        _process(layer)


def test_an_engines_own_loader_is_called_and_its_shards_are_counted() -> None:
    calls: list[int | None] = []
    method, layer = _engine_layer(calls)
    for i, (_, fp8, scale) in enumerate(_shards("fp8_per_channel")):
        _load(layer, "weight", fp8, i)
        if i < 2:
            _load(layer, "weight_scale", scale, i)
    assert calls == [0, 0, 1, 1, 2]
    with pytest.raises(kp.InvalidValueError, match=r"weight_scale.*never loaded: \[2\]"):
        method.process_weights_after_loading(layer)


def test_a_bad_scale_never_reaches_an_engines_loader() -> None:
    calls: list[int | None] = []
    _, layer = _engine_layer(calls)
    _, fp8, scale = _shards("fp8_per_channel")[0]
    _load(layer, "weight", fp8, 0)
    with pytest.raises(kp.KernelInputError, match=r"weight_scale.*positive, finite"):
        _load(layer, "weight_scale", -scale, 0)
    assert calls == [0]  # the weight only: the engine never saw the negative scale


def test_scales_written_past_every_loader_are_checked_when_processing() -> None:
    method, layer = _engine_layer()
    for i, (_, fp8, scale) in enumerate(_shards("fp8_per_channel")):
        _load(layer, "weight", fp8, i)
        _load(layer, "weight_scale", scale, i)
    with torch.no_grad():
        layer.get_parameter("weight_scale")[3] = -1.0  # as an engine writing .data would
    with pytest.raises(kp.KernelInputError, match=r"weight_scale.*positive, finite"):
        method.process_weights_after_loading(layer)
    assert layer_state(layer).bound is None


def test_an_interrupted_requantization_leaves_the_weight_for_a_clean_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelpick.kernels import _canonical as canonical
    from kernelpick.kernels._quantize import quantize_static

    def loaded() -> torch.nn.Module:
        layer = _layer("fp8_per_tensor")
        for i, (_, fp8, scale) in enumerate(_shards("fp8_per_tensor")):
            _load(layer, "weight", fp8, i)
            _load(layer, "weight_scale", scale, i)
        return layer

    reference, layer = loaded(), loaded()
    _process(reference)
    real, calls = quantize_static, []

    def interrupted(*args: object) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(canonical, "quantize_static", interrupted)
    with pytest.raises(KeyboardInterrupt):  # several chunks per shard
        _method("fp8_per_tensor", "fp8", chunk_rows=16).process_weights_after_loading(layer)
    monkeypatch.setattr(canonical, "quantize_static", real)
    _process(layer)
    weights = (layer.get_parameter("weight"), reference.get_parameter("weight"))
    assert torch.equal(weights[0].view(torch.uint8), weights[1].view(torch.uint8))
