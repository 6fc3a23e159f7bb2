"""Casting a converted model keeps the quantization: the FP8 weight and its fp32 scales stay
as they are, the activations and output take the new dtype, and the kernel is chosen again.
Anything else is refused before the layer changes."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch

import kernelpick as kp
from kernelpick.core import Dtype
from kernelpick.integration import (
    KernelSelectionError,
    QuantizedLinear,
    layer_state,
    quantize_model,
)
from tests.support.emulation import BOUND, emulated, relative_error

CPU = kp.device_profile("cpu")


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32))
    return model


def _quantized(
    catalog: kp.Catalog | None = None,
) -> tuple[torch.nn.Sequential, torch.nn.Sequential]:
    original, model = _model(), _model()
    quantize_model(model, caps=CPU, policy=kp.Policy(), catalog=catalog)
    return original, model


def _canonical_bytes(model: torch.nn.Module) -> dict[str, bytes]:
    return {
        name: tensor.detach().view(torch.uint8).numpy().tobytes()
        for name, tensor in model.state_dict().items()
        if not name.endswith("bias")
    }


CASTS: list[tuple[str, Callable[[torch.nn.Module], object], torch.dtype]] = [
    ("half", lambda m: m.half(), torch.float16),
    ("bfloat16", lambda m: m.bfloat16(), torch.bfloat16),
    ("to(float16)", lambda m: m.to(torch.float16), torch.float16),
    ("to(cpu, bfloat16)", lambda m: m.to("cpu", torch.bfloat16), torch.bfloat16),
    ("half then float", lambda m: m.half().float(), torch.float32),
]


@pytest.mark.parametrize(("case", "cast", "dtype"), CASTS, ids=[c[0] for c in CASTS])
def test_a_cast_keeps_the_fp8_weight_and_scales_and_changes_the_activation_dtype(
    case: str, cast: Callable[[torch.nn.Module], object], dtype: torch.dtype
) -> None:
    original, model = _quantized()
    before = _canonical_bytes(model)
    weight = model[0].get_parameter("weight")
    cast(model)
    assert _canonical_bytes(model) == before
    assert model[0].get_parameter("weight") is weight  # the same parameter, not a copy
    assert model[0].get_parameter("weight").dtype == torch.float8_e4m3fn
    assert model[0].get_parameter("weight_scale").dtype == torch.float32
    assert model[0].get_parameter("bias").dtype == dtype
    config = layer_state(model[0]).config
    assert str(config.input_dtype) == str(config.out_dtype) == str(dtype).removeprefix("torch.")
    x = torch.randn(5, 64)
    with torch.no_grad():
        got = model[0](x.to(dtype))
    assert got.dtype == dtype
    bias = model[0].get_parameter("bias").detach()  # cast by torch, as any bias
    weight = original[0].get_parameter("weight")
    want = emulated(x.to(dtype), weight, config, Dtype.FLOAT8_E4M3FN, bias=bias).out
    assert relative_error(got, want) <= BOUND[str(dtype).removeprefix("torch.")]


def test_a_cast_chooses_the_kernel_again_when_the_dtype_changes_the_choice() -> None:
    rows = [
        _fp32_only("cpu_rowwise_scaled_mm"),
        kp.default_catalog().kernel("cpu_dequant_reference"),
    ]  # fmt: skip
    _, model = _quantized(kp.Catalog(rows))
    assert layer_state(model[0]).decision.kernel == "cpu_rowwise_scaled_mm"
    model.half()
    assert layer_state(model[0]).decision.kernel == "cpu_dequant_reference"
    assert model[0].__dict__["kernelpick_decision"] is layer_state(model[0]).decision
    assert "kernel=cpu_dequant_reference" in repr(model[0])
    assert model(torch.randn(2, 64, dtype=torch.float16)).dtype == torch.float16


def _fp32_only(kernel: str) -> kp.KernelSpec:
    spec = kp.default_catalog().kernel(kernel)
    only = kp.rules.OutDtypes(frozenset({Dtype.FLOAT32}))
    return attrs.evolve(spec, requires=(*spec.requires, only))


REFUSED: list[tuple[str, Callable[[torch.nn.Module], object], type[Exception], str]] = [
    ("double", lambda m: m.double(), kp.InvalidValueError, "float64"),
    ("type(half)", lambda m: m.type(torch.float16), kp.InvalidValueError, "integer tensors"),
    ("to(meta)", lambda m: m.to("meta"), kp.KernelpickError, "meta"),
]


@pytest.mark.parametrize(("case", "cast", "error", "named"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_cast_no_kernel_takes_is_refused_and_the_layer_is_unchanged(
    case: str, cast: Callable[[torch.nn.Module], object], error: type[Exception], named: str
) -> None:
    _, model = _quantized()
    layer = model[0]
    before, state = _canonical_bytes(model), layer_state(layer)
    with pytest.raises(error, match=named):
        cast(layer)
    assert _canonical_bytes(model) == before
    assert layer_state(layer) is state
    assert layer.get_parameter("bias").dtype == torch.float32
    assert layer(torch.randn(2, 64)).dtype == torch.float32


def test_a_cast_with_no_kernel_for_the_new_dtype_raises_the_selection_error() -> None:
    rows = [
        _fp32_only("cpu_rowwise_scaled_mm"),
    ]  # fmt: skip
    _, model = _quantized(kp.Catalog(rows))
    with pytest.raises(KernelSelectionError, match="layer '0'"):
        model.half()
    assert model[0].get_parameter("bias").dtype == torch.float32


def test_a_high_precision_state_dict_is_refused_not_cast_into_fp8() -> None:
    original, model = _quantized()
    before = _canonical_bytes(model)
    state = {k: v for k, v in original.state_dict().items()}
    state |= {f"{i}.weight_scale": model.state_dict()[f"{i}.weight_scale"] for i in (0, 2)}
    with pytest.raises(
        kp.KernelInputError, match=r"0\.weight: got shape \[96, 64\], dtype float32"
    ):
        model.load_state_dict(state)
    assert _canonical_bytes(model) == before


def test_a_quantized_state_dict_loads_and_is_made_canonical() -> None:
    _, model = _quantized()
    _, other = _quantized()
    state = model.state_dict()
    weight = state["0.weight"].clone()
    weight.view(torch.uint8)[0, :4] = 0x80  # -0: the same value, but not canonical
    other.load_state_dict(state | {"0.weight": weight})
    loaded = other[0].get_parameter("weight").detach()
    assert not bool((loaded.view(torch.uint8) == 0x80).any())
    assert torch.equal(loaded.float(), weight.float())


def test_a_layer_whose_weight_was_replaced_by_a_cast_copy_refuses_to_run() -> None:
    _, model = _quantized()
    layer = model[0]
    assert isinstance(layer, QuantizedLinear)
    layer.get_parameter("weight").data = layer.get_parameter("weight").data.half()
    with pytest.raises(kp.KernelInputError, match=r"weight: got shape \[96, 64\], dtype float16"):
        layer(torch.randn(2, 64))


def test_a_state_dict_of_the_old_kernel_layout_is_refused() -> None:
    square = torch.nn.Sequential(torch.nn.Linear(64, 64))
    quantize_model(square, caps=CPU, policy=kp.Policy())
    state = square.state_dict()
    before = _canonical_bytes(square)
    transposed = state | {"0.weight": state["0.weight"].t()}  # what _scaled_mm layers stored
    with pytest.raises(kp.KernelInputError, match="contiguous row-major"):
        square.load_state_dict(transposed)
    metadata = getattr(state, "_metadata")  # noqa: B009
    metadata["0"] = {"version": 1}
    with pytest.raises(kp.InvalidValueError, match="version"):
        square.load_state_dict(state)
    assert _canonical_bytes(square) == before


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_state_dict_scale_that_is_not_positive_and_finite_is_refused(bad: float) -> None:
    _, model = _quantized()
    before = _canonical_bytes(model)
    state = model.state_dict()
    scale = state["2.weight_scale"].clone()
    scale[3] = bad
    with pytest.raises(kp.KernelInputError, match=r"2\.weight_scale.*positive, finite"):
        model.load_state_dict(state | {"2.weight_scale": scale})
    assert _canonical_bytes(model) == before


def test_a_state_dict_scale_of_another_layout_is_refused_before_the_weight_changes() -> None:
    # load_state_dict accepts what every other path accepts (one accept): a [N] per-channel
    # scale loads as [N, 1]; a [1, N] one (per input channel, read per output channel would
    # be wrong) is refused before the weight changes.
    _, model = _quantized()
    state = model.state_dict()
    flat = state | {"0.weight_scale": state["0.weight_scale"].reshape(-1)}
    model.load_state_dict(flat)
    assert torch.equal(model.state_dict()["0.weight_scale"], state["0.weight_scale"])
    before = _canonical_bytes(model)
    changed = state | {"0.weight": torch.zeros(96, 64, dtype=torch.float8_e4m3fn),
                       "0.weight_scale": state["0.weight_scale"].reshape(1, -1)}  # fmt: skip
    with pytest.raises(kp.KernelInputError, match=r"0\.weight_scale: got shape \[1, 96\]"):
        model.load_state_dict(changed)
    assert _canonical_bytes(model) == before
