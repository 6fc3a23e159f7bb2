"""The linear method's loaders, kernelpick's own and an engine's behind kernelpick's checks:
an engine's loader is handed only tensors that passed the same checks, against the whole
layer's checkpoint shape, and once a layer is processed every loader of it refuses."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import QuantizedLinearMethod, layer_state, weight_loader_of
from kernelpick.kernels import quantize_canonical

CPU = kp.device_profile("cpu")
K = 64


class Recording:
    """An engine's loader as vLLM's are: it narrows a whole tensor to this rank's rows (a
    column-parallel split of each shard alike) and copies, checking nothing."""

    def __init__(self, world: int = 1, rank: int = 0) -> None:
        self.calls: list[tuple[tuple[int, ...], torch.dtype, object]] = []
        self.world, self.rank = world, rank

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
        self.calls.append((tuple(loaded.shape), loaded.dtype, shard_id))
        rows = loaded.shape[0] // self.world
        part = loaded.narrow(0, self.rank * rows, rows) if param.dim() and rows else loaded
        with torch.no_grad():
            param.reshape(-1)[: part.numel()].copy_(part.reshape(-1))


def _method(scheme: str = "fp8_per_channel", checkpoint: str = "high_precision") -> Any:
    return QuantizedLinearMethod(scheme, CPU, kp.Policy(), checkpoint_format=checkpoint)


def _load(layer: torch.nn.Module, name: str, tensor: object, shard: object = None) -> None:
    param = layer.get_parameter(name)
    weight_loader_of(param)(param, tensor, shard)  # type: ignore[arg-type]


def _quantized(scheme: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    return quantize_canonical(w, kp.quant_config(scheme, weight_shape=(n, k)))


# -- an engine's loader sees only checked tensors ----------------------------------------


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8, torch.uint8])
def test_an_engines_loader_never_sees_a_quantized_tensor_for_a_float_weight(
    dtype: torch.dtype,
) -> None:
    engine = Recording()
    layer = torch.nn.Module()
    _method().create_weights(layer, K, [32], K, 32, torch.float32, weight_loader=engine)
    with pytest.raises(kp.KernelInputError, match="high-precision float"):
        _load(layer, "weight", torch.zeros(32, K).to(dtype))
    assert engine.calls == []


def test_an_engines_loader_is_handed_the_checked_canonical_scale() -> None:
    """A ``[rows]`` bf16 scale reaches the engine as the fp32 ``[rows, 1]`` its parameter
    holds, so the engine's copy casts and reshapes nothing."""
    engine = Recording()
    layer = torch.nn.Module()
    method = _method(checkpoint="pre_quantized")
    method.create_weights(layer, K, [32], K, 32, torch.float32, weight_loader=engine)
    fp8, scale = _quantized("fp8_per_channel", torch.randn(32, K))
    _load(layer, "weight", fp8)
    _load(layer, "weight_scale", scale.reshape(32).bfloat16())
    assert engine.calls[1] == ((32, 1), torch.float32, None)
    with pytest.raises(kp.KernelInputError, match=r"weight_scale.*shape \[32, 1\]"):
        _load(layer, "weight_scale", scale.reshape(1, 32))
    assert len(engine.calls) == 2


def test_an_engines_loader_is_checked_against_the_whole_layers_shape() -> None:
    """Column-parallel over two ranks: the engine narrows the whole tensor, so kernelpick
    checks the whole one (and refuses a rank's part, which the engine would misplace)."""
    engine = Recording(world=2, rank=1)
    layer = torch.nn.Module()
    _method().create_weights(layer, K, [16, 8], K, 48, torch.float32, weight_loader=engine)
    q, k = torch.randn(32, K), torch.randn(16, K)
    with pytest.raises(kp.KernelInputError, match=r"shape \[32, 64\]"):
        _load(layer, "weight", q[:16], 0)  # the rank's part, not the whole q
    _load(layer, "weight", q, 0)
    _load(layer, "weight", k, 1)
    assert [call[0] for call in engine.calls] == [(32, K), (16, K)]


def test_checkpoint_shards_give_a_replicated_shard_its_own_rows() -> None:
    """vLLM's K and V heads, replicated when the world is larger than their count: each
    rank holds all of them, so the checkpoint's rows are not the part's times the world."""
    engine = Recording(world=1)
    layer = torch.nn.Module()
    _method().create_weights(
        layer, K, [16, 8, 8], K, 64, torch.float32, weight_loader=engine,
        checkpoint_shards=[32, 8, 8],
    )  # fmt: skip
    _load(layer, "weight", torch.randn(8, K), "k")
    with pytest.raises(kp.KernelInputError, match=r"shape \[8, 64\]"):
        _load(layer, "weight", torch.randn(16, K), "v")


@pytest.mark.parametrize(
    ("output_size", "shards", "match"),
    [
        (50, None, "output_size"),
        (48, [32, 16, 8], "checkpoint_shards"),
        (48, [0], "checkpoint_shards"),
        (48, None, "input_size"),
    ],
)
def test_a_whole_shape_that_cannot_be_read_one_way_is_refused(
    output_size: int, shards: list[int] | None, match: str
) -> None:
    layer = torch.nn.Module()
    whole_k = 0 if match == "input_size" else K
    with pytest.raises(kp.InvalidValueError, match=match):
        _method().create_weights(
            layer, K, [16, 8], whole_k, output_size, torch.float32, weight_loader=Recording(),
            checkpoint_shards=shards,
        )  # fmt: skip
    assert list(layer.parameters()) == []


# -- a processed layer takes nothing more ------------------------------------------------

SCHEMES = ["fp8_per_channel", "fp8_per_tensor", "fp8_weight_only", "fp8_block", "int8_per_channel"]


@pytest.mark.parametrize("engine", [False, True])
@pytest.mark.parametrize("checkpoint", ["high_precision", "pre_quantized"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_loader_refuses_once_the_layer_is_processed(
    scheme: str, checkpoint: str, engine: bool
) -> None:
    """Whoever holds a loader (the parameter registered at first, or the one processing
    installed), a late write is refused and the output stays as it was."""
    layer = torch.nn.Module()
    method = _method(scheme, checkpoint)
    n, w = 256, torch.randn(256, 128)
    loader = Recording() if engine else None
    method.create_weights(layer, 128, [n], 128, n, torch.float32, weight_loader=loader)
    first = dict(layer.named_parameters())
    tensors = {"weight": w}
    if checkpoint == "pre_quantized":
        fp8, scale = _quantized(scheme, w)
        tensors = {"weight": fp8, "weight_scale": scale}
    for name, tensor in tensors.items():
        _load(layer, name, tensor)
    method.process_weights_after_loading(layer)
    x = torch.randn(3, 128)
    out = method.apply(layer, x)
    assert layer_state(layer).bound is not None
    for params in (first, dict(layer.named_parameters())):
        for name, param in params.items():
            with pytest.raises(kp.InvalidValueError, match="after process_weights_after_loading"):
                weight_loader_of(param)(param, tensors.get(name, w))
    assert torch.equal(method.apply(layer, x), out)


def test_a_shape_whose_bytes_overflow_is_refused_before_allocating() -> None:
    layer = torch.nn.Module()
    with pytest.raises(kp.InvalidValueError, match=r"2\*\*63 - 1 bytes") as caught:
        _method().create_weights(layer, 4096, [2**62], 4096, 2**62, torch.float32)
    assert "needs" in str(caught.value)
    assert list(layer.parameters()) == []
    assert "kernelpick_decision" not in layer.__dict__


@pytest.mark.parametrize(
    ("sizes", "k", "whole_k", "output_size", "refused"),
    [
        ([192], 128, 128, 384, "each shard's N"),  # N split: rank 1 starts mid-block
        ([128], 192, 384, 128, "K"),  # K split: rank 1 starts mid-block
        ([128], 128, 128, 256, None),  # whole blocks on every rank
        ([192], 128, 128, 192, None),  # not split: a ragged last block is the layer's own
    ],
)
def test_an_engine_split_that_would_straddle_scale_blocks_is_refused(
    sizes: list[int], k: int, whole_k: int, output_size: int, refused: str | None
) -> None:
    """An engine that splits a block-FP8 layer itself would hand a rank whose part starts
    inside a block the scales of other rows: no loader can fill it right."""
    layer = torch.nn.Module()
    method = _method("fp8_block", "pre_quantized")

    def create() -> None:
        method.create_weights(
            layer, k, sizes, whole_k, output_size, torch.float32, weight_loader=Recording()
        )

    if refused is None:
        create()
        return
    with pytest.raises(kp.InvalidValueError, match=f"{refused} per rank a multiple of the scale"):
        create()
    assert list(layer.parameters()) == []
