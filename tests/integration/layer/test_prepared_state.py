"""The prepared state and the load paths around it: what a review found the first design
missed (a compiled forward, inference mode, deep copies, partial and multi-layer state
dicts, assign=True, an engine's parameter classes)."""

from __future__ import annotations

import copy

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import (
    ModelConversionError,
    QuantizedLinearMethod,
    layer_state,
    quantize_model,
    weight_loader_of,
)
from kernelpick.integration.layer import Param, WeightLoader

CPU = kp.device_profile("cpu")
K, N = 64, 96


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.ReLU(), torch.nn.Linear(N, 32))
    quantize_model(model, caps=CPU, policy=kp.Policy())
    return model


def _bytes(model: torch.nn.Module) -> dict[str, bytes]:
    return {
        name: bytes(t.detach().contiguous().view(-1).view(torch.uint8).tolist())
        for name, t in model.state_dict().items()
    }


def test_a_compiled_forward_reads_the_live_parameters() -> None:
    model = _model()
    layer = model[0]
    x = torch.randn(3, K)
    bias = layer.get_parameter("bias").detach()
    with torch.no_grad():
        compiled = torch.compile(lambda t: layer(t), fullgraph=True)
        before = compiled(x) - bias
        layer.weight_scale = torch.nn.Parameter(layer.get_parameter("weight_scale") * 2, False)
        assert torch.allclose(compiled(x) - bias, 2 * before, rtol=1e-4, atol=1e-4)
        model.to(torch.bfloat16)  # nothing prepared yet: the trace prepares, and stores nothing
        assert torch.compile(model)(x.bfloat16()).shape == (3, 32)
    assert layer_state(layer).prepared is None


def test_a_model_converted_under_inference_mode_runs() -> None:
    with torch.inference_mode():
        model = _model()
        assert model(torch.randn(2, K)).shape == (2, 32)


def test_a_deep_copy_runs_on_its_own_tensors() -> None:
    model = _model()
    x = torch.randn(3, K)
    before = model(x)
    twin = copy.deepcopy(model)
    assert torch.equal(twin(x), before)
    with torch.no_grad():
        twin[0].get_parameter("weight_scale").mul_(2)
    assert not torch.equal(twin(x), before)
    assert torch.equal(model(x), before)


def test_a_refused_state_dict_leaves_every_layer_as_it_was() -> None:
    # torch loads module by module: without accepting every layer first, layer 0 would be
    # overwritten before layer 2's NaN byte is refused.
    model = _model()
    state = model.state_dict()
    before = _bytes(model)
    bad = state["2.weight"].clone()
    bad.view(torch.uint8)[1, 1] = 0x7F
    changed = state | {"0.weight": torch.zeros_like(state["0.weight"]), "2.weight": bad}
    with pytest.raises(kp.KernelInputError, match="row 1 holds a NaN byte"):
        model.load_state_dict(changed)
    assert _bytes(model) == before


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"0.bias": torch.full((N,), float("nan"))}, "finite values"),
        ({"0.bias": torch.zeros(N + 1)}, rf"a high-precision float tensor of shape \[{N}\]"),
    ],
    ids=["NaN bias", "bias of another shape"],
)
def test_a_partial_state_dict_meets_the_same_laws(
    given: dict[str, torch.Tensor], expected: str
) -> None:
    model = _model()
    before = _bytes(model)
    with pytest.raises(kp.KernelInputError, match=expected):
        model.load_state_dict(given, strict=False)
    assert _bytes(model) == before


def test_a_partial_weight_has_its_negative_zeros_made_positive_without_touching_the_dict() -> None:
    model = _model()
    weight = model.state_dict()["0.weight"].clone()
    weight.view(torch.uint8)[0, :4] = 0x80
    given = {"0.weight": weight}
    model.load_state_dict(given, strict=False)
    assert not bool((model[0].get_parameter("weight").view(torch.uint8) == 0x80).any())
    assert bool((given["0.weight"].view(torch.uint8)[0, :4] == 0x80).all())


def test_parameters_assigned_by_load_state_dict_still_refuse_loads() -> None:
    model = _model()
    model.load_state_dict(model.state_dict(), assign=True)
    weight = model[0].get_parameter("weight")
    with pytest.raises(kp.InvalidValueError, match="after process_weights_after_loading"):
        weight_loader_of(weight)(weight, torch.zeros_like(weight))


def test_an_online_layer_of_an_unsupported_dtype_is_refused_by_name() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8).double())
    with pytest.raises(ModelConversionError, match="one of bfloat16, float16, float32"):
        quantize_model(model, caps=CPU, policy=kp.Policy())


class _EngineParameter(torch.nn.Parameter):
    """An engine's parameter class (vLLM's carry their loaders and dims)."""


def _engine_parameter(spec: Param, data: torch.Tensor, loader: WeightLoader) -> torch.nn.Parameter:
    param = _EngineParameter(data, requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


def test_processing_keeps_an_engines_parameter_classes() -> None:
    method = QuantizedLinearMethod("fp8_per_channel", CPU, kp.Policy(),
                                   checkpoint_format="pre_quantized")  # fmt: skip
    layer = torch.nn.Module()

    def engine(param: torch.Tensor, loaded: torch.Tensor, shard_id: object) -> None:
        param.data.copy_(loaded.reshape(param.shape))

    method.create_weights(
        layer, K, [N], K, N, torch.float32, weight_loader=engine, parameter=_engine_parameter
    )
    weights = kp.quant_config("fp8_per_channel", weight_shape=(N, K), out_dtype="float32")
    from kernelpick.kernels import quantize_canonical

    fp8, scale = quantize_canonical(torch.randn(N, K), weights)
    for name, value in (("weight", fp8), ("weight_scale", scale)):
        param = layer.get_parameter(name)
        weight_loader_of(param)(param, value)
    method.process_weights_after_loading(layer)
    assert type(layer.get_parameter("weight")) is _EngineParameter
    assert type(layer.get_parameter("weight_scale")) is _EngineParameter
    assert method.apply(layer, torch.randn(2, K)).shape == (2, N)
