"""Whatever tensor vLLM's own loaders carry into a kernelpick layer is checked before it can
change the layer, against the real vLLM (0.33.0, CPU): a quantized tensor for a
high-precision weight, a high-precision or int8 tensor for an FP8 weight, a scale of a
shape that means something else; and once a layer is processed, every loader refuses.

vLLM's ``param.data.copy_(loaded)`` casts whatever it is handed into the parameter's dtype,
so a tensor of the wrong kind would otherwise arrive as plausible values without its scale.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kernelpick as kp
from tests.engines import vllm_workers as workers

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("vllm_tp1")]

K, N = workers.K, workers.N
FP8_BOUND = 0.1  # as in test_vllm.py: e4m3's rounding of both operands, doubled


def _config(scheme: str, online: bool, block: int | None = None) -> Any:
    from kernelpick.engines.vllm import KernelpickConfig

    if online:
        return KernelpickConfig(scheme, block_size=block)
    saved = {"quant_method": "kernelpick", "scheme": scheme, "format_version": 1}
    return KernelpickConfig.from_config({**saved, "block_size": block})


def _column(config: Any, prefix: str = "m.up") -> Any:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    return ColumnParallelLinear(
        K, N, bias=False, params_dtype=torch.float32, quant_config=config, prefix=prefix
    )


def _quantized(scheme: str, w: torch.Tensor, block: int | None = None) -> list[torch.Tensor]:
    from kernelpick.kernels import quantize_canonical

    n, k = w.shape
    config = kp.quant_config(scheme, weight_shape=(n, k), out_dtype="float32", block_size=block)
    return list(quantize_canonical(w, config))


def _bytes(param: torch.Tensor) -> torch.Tensor:
    return param.detach().reshape(-1).view(torch.uint8).clone()


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _fp8_bytes(rows: int = N) -> torch.Tensor:
    return _quantized("fp8_per_channel", workers.weight(rows))[0]


QUANTIZED = {
    "float8_e4m3fn": lambda rows: _fp8_bytes(rows),
    "float8_e5m2": lambda rows: workers.weight(rows).to(torch.float8_e5m2),
    "int8": lambda rows: torch.randint(-127, 128, (rows, K), dtype=torch.int8),
    "uint8": lambda rows: torch.randint(0, 256, (rows, K), dtype=torch.uint8),
}


@pytest.mark.parametrize("dtype", list(QUANTIZED))
def test_an_online_layer_refuses_quantized_bytes_from_vllms_loader(dtype: str) -> None:
    """Cast into the float weight, FP8 or int8 bytes would be quantized again without their
    scale: an output error of about 150 times the output, silently."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    config = _config("fp8_per_channel", online=True)
    qkv = QKVParallelLinear(K, 32, 4, 2, bias=False, quant_config=config, prefix="m.qkv")
    gate_up = MergedColumnParallelLinear(
        K, [64, 64], bias=False, quant_config=config, prefix="m.gate_up"
    )
    cases = [(_column(config), None, N), (qkv, "k", 64), (gate_up, 1, 64)]
    for layer, shard, rows in cases:
        before = _bytes(layer.weight)
        args = () if shard is None else (shard,)
        with pytest.raises(kp.KernelInputError, match="high-precision float") as caught:
            layer.weight.weight_loader(layer.weight, QUANTIZED[dtype](rows), *args)
        assert f"{layer.prefix}.weight" in str(caught.value)
        assert caught.value.dtype == dtype
        assert torch.equal(_bytes(layer.weight), before), layer.prefix
    # The same layer takes the float weight, and matches it.
    layer = _column(config)
    w, x = workers.weight(), workers.peaked_x(world=1)
    layer.weight.weight_loader(layer.weight, w.to(torch.bfloat16))
    layer.quant_method.process_weights_after_loading(layer)
    assert _relative(layer(x)[0], x @ w.bfloat16().float().T) < FP8_BOUND


@pytest.mark.parametrize(
    ("scheme", "tensor", "expected"),
    [
        ("fp8_per_channel", "dequantized_bf16", "dtype float8_e4m3fn"),
        ("fp8_per_channel", "dequantized_fp32", "dtype float8_e4m3fn"),
        ("fp8_per_channel", "int8", "dtype float8_e4m3fn"),
        ("fp8_per_channel", "e5m2", "dtype float8_e4m3fn"),
        ("int8_per_channel", "fp8", "dtype int8"),
        ("int8_per_channel", "dequantized_bf16", "dtype int8"),
    ],
)
def test_a_pre_quantized_layer_refuses_a_weight_of_another_kind(
    scheme: str, tensor: str, expected: str
) -> None:
    w = workers.weight()
    fp8, scale = _quantized("fp8_per_channel", w)
    made = {
        "dequantized_bf16": (fp8.float() * scale).bfloat16(),
        "dequantized_fp32": fp8.float() * scale,
        "int8": _quantized("int8_per_channel", w)[0],
        "e5m2": w.to(torch.float8_e5m2),
        "fp8": fp8,
    }[tensor]
    layer = _column(_config(scheme, online=False))
    before = _bytes(layer.weight)
    with pytest.raises(kp.KernelInputError, match=expected) as caught:
        layer.weight.weight_loader(layer.weight, made)
    assert "m.up.weight" in str(caught.value)
    assert torch.equal(_bytes(layer.weight), before)


def test_a_scale_is_checked_for_its_layout_before_vllms_loader_sees_it() -> None:
    """``[1, N]`` would be one scale per input channel: refused with kernelpick's error,
    not vLLM's. ``[N]`` is the same per-channel scale as ``[N, 1]``: it loads, to the same
    output, though vLLM's own loader would take only ``[N, 1]``."""
    w, x = workers.weight(), workers.peaked_x(world=1)
    fp8, scale = _quantized("fp8_per_channel", w)
    outs = []
    for stored in (scale, scale.reshape(N)):
        layer = _column(_config("fp8_per_channel", online=False))
        layer.weight.weight_loader(layer.weight, fp8)
        before = _bytes(layer.weight_scale)
        for wrong in (scale.reshape(1, N), scale[: N // 2], -scale, scale.double()):
            with pytest.raises(kp.KernelInputError, match=r"m\.up\.weight_scale"):
                layer.weight_scale.weight_loader(layer.weight_scale, wrong)
            assert torch.equal(_bytes(layer.weight_scale), before)
        layer.weight_scale.weight_loader(layer.weight_scale, stored)
        layer.quant_method.process_weights_after_loading(layer)
        outs.append(layer(x)[0])
    assert torch.equal(outs[0], outs[1])
    assert _relative(outs[0], x @ w.T) < FP8_BOUND


SCHEMES = [
    ("fp8_per_channel", True, None),
    ("fp8_per_tensor", True, None),
    ("fp8_weight_only", True, None),
    ("fp8_block", True, 64),
    ("int8_per_channel", True, None),
    ("fp8_per_channel", False, None),
    ("fp8_per_tensor", False, None),
    ("fp8_per_tensor_static", False, None),
    ("fp8_weight_only", False, None),
    ("fp8_block", False, 64),
    ("int8_per_channel", False, None),
]


@pytest.mark.parametrize(("scheme", "online", "block"), SCHEMES)
def test_every_loader_refuses_once_the_layer_is_processed(
    scheme: str, online: bool, block: int | None
) -> None:
    """A late write would change the output past every check; a late ``0x80`` byte would
    never become +0, and on an e4m3fnuz device it reads as NaN."""
    w, x = workers.weight(), workers.peaked_x(world=1)
    layer = _column(_config(scheme, online, block))
    tensors = {"weight": w}
    if not online:
        weight, scale = _quantized(scheme, w, block)
        tensors = {"weight": weight, "weight_scale": scale}
        if scheme == "fp8_per_tensor_static":
            tensors["input_scale"] = torch.tensor([0.05])
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor)
    layer.quant_method.process_weights_after_loading(layer)
    out = layer(x)[0]
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        late = tensor.clone()
        if late.dtype == torch.float8_e4m3fn:
            late.view(torch.uint8)[0, :4] = 0x80
        with pytest.raises(kp.InvalidValueError, match="after process_weights_after_loading"):
            param.weight_loader(param, late)
    assert torch.equal(layer(x)[0], out)
    if layer.weight.dtype == torch.float8_e4m3fn:
        assert not bool((layer.weight.detach().view(torch.uint8) == 0x80).any())


@pytest.mark.usefixtures("vllm_tp1")
def test_vllms_loader_refuses_a_nan_byte_as_every_path_does() -> None:
    """The same refusal as kernelpick's loaders, processing, load_quantized,
    load_state_dict and transformers' loading (tests/integration/test_one_accept.py): the
    one accept's, before vLLM's loader is handed the tensor."""
    layer = _column(_config("fp8_per_channel", online=False))
    bad = _quantized("fp8_per_channel", workers.weight())[0].clone()
    bad.view(torch.uint8)[3, 5] = 0x7F
    before = _bytes(layer.weight).clone()
    with pytest.raises(kp.KernelInputError) as caught:
        layer.weight.weight_loader(layer.weight, bad)
    assert caught.value.expected == "finite FP8 values; row 3 holds a NaN byte"
    assert torch.equal(_bytes(layer.weight), before)
