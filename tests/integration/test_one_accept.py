"""One accept: every way a tensor reaches a layer refuses the same bad tensor with the same
error, and a forward pass prepares nothing.

The ingest paths: kernelpick's own loaders, an engine's loader behind them (the seam vLLM
uses; tests/engines/test_vllm_loaders.py runs the real vLLM through it), bytes written into
a layer by anyone and then processed, transformers' loading, ``load_quantized`` and
``load_state_dict``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import kernelpick as kp
from kernelpick.integration import (
    ModelConversionError,
    QuantizedLinear,
    QuantizedLinearMethod,
    layer_state,
    load_quantized,
    quantize_model,
    save_quantized,
    weight_loader_of,
)
from kernelpick.kernels import KernelBase

transformers = pytest.importorskip("transformers")

from tests.engines.hf_models import as_format_v1, load, saved  # noqa: E402

CPU = kp.device_profile("cpu")
N, K, ROW = 96, 64, 3
NAN_BYTE = 0x7F
EXPECTED = f"finite FP8 values; row {ROW} holds a NaN byte"


def _bad(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (e4m3fn) with a NaN byte in row ``ROW``."""
    bad = weight.clone()
    bad.view(torch.uint8)[ROW, 5] = NAN_BYTE
    return bad


def _canonical(n: int = N, k: int = K) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n, k).clamp(-4, 4).to(torch.float8_e4m3fn)


def _refusal(call: Callable[[], object]) -> kp.KernelInputError:
    """The KernelInputError ``call`` raises, itself or as the one failure of a
    ``ModelConversionError`` (the model-level paths name the layer around it)."""
    with pytest.raises((kp.KernelInputError, ModelConversionError)) as caught:
        call()
    error = caught.value
    if isinstance(error, ModelConversionError):
        assert len(error.failures) == 1
        error = error.failures[0][1]
    assert isinstance(error, kp.KernelInputError)
    return error


def _pre_quantized_layer(**kwargs: object) -> torch.nn.Module:
    method = QuantizedLinearMethod("fp8_per_channel", CPU, kp.Policy(),
                                   checkpoint_format="pre_quantized")  # fmt: skip
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, torch.float32, prefix="proj", **kwargs)  # type: ignore[arg-type]
    layer.__dict__["method"] = method
    return layer


def _by_kernelpicks_loader() -> None:
    layer = _pre_quantized_layer()
    weight = layer.get_parameter("weight")
    weight_loader_of(weight)(weight, _bad(_canonical()))


def _by_an_engines_loader() -> None:
    handed: list[torch.Tensor] = []

    def engine(param: torch.Tensor, loaded: torch.Tensor, shard_id: object) -> None:
        handed.append(loaded)
        param.data.copy_(loaded)

    layer = _pre_quantized_layer(weight_loader=engine)
    weight = layer.get_parameter("weight")
    try:
        weight_loader_of(weight)(weight, _bad(_canonical()))
    finally:
        assert handed == []  # the engine is never handed a tensor kernelpick refused


def _written_then_processed() -> None:
    # Bytes any code wrote into the parameters (an engine's loader kernelpick never saw):
    # processing accepts the whole layer before binding it.
    layer = _pre_quantized_layer()
    with torch.no_grad():
        layer.get_parameter("weight").copy_(_bad(_canonical()))
        layer.get_parameter("weight_scale").fill_(0.01)
    layer_state(layer).loaded.update({"weight": {-1}, "weight_scale": {-1}})  # whole tensors
    layer.__dict__["method"].process_weights_after_loading(layer)


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.ReLU(), torch.nn.Linear(N, 32))


def _by_load_state_dict() -> None:
    model = _model()
    quantize_model(model, caps=CPU, policy=kp.Policy())
    state = model.state_dict()
    model.load_state_dict(state | {"0.weight": _bad(state["0.weight"])})


def _by_load_quantized(tmp_path: Path) -> None:
    model = _model()
    quantize_model(model, caps=CPU, policy=kp.Policy())
    save_quantized(model, tmp_path / "saved")
    tensors = load_file(tmp_path / "saved" / "model.safetensors")
    tensors["0.weight"] = _bad(tensors["0.weight"])
    save_file(tensors, tmp_path / "saved" / "model.safetensors", metadata={"format": "pt"})
    load_quantized(_model(), tmp_path / "saved", caps=CPU, policy=kp.Policy())


def _by_transformers(tmp_path: Path) -> None:
    out, _ = saved(tmp_path)
    path = as_format_v1(out)
    tensors = load_file(path / "model.safetensors")
    key = "model.layers.1.mlp.up_proj.weight"
    tensors[key] = _bad(tensors[key])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    load(path)


def test_every_ingest_path_refuses_a_nan_byte_with_the_same_error(tmp_path: Path) -> None:
    paths: dict[str, Callable[[], object]] = {
        "kernelpick's loader": _by_kernelpicks_loader,
        "an engine's loader": _by_an_engines_loader,
        "processing": _written_then_processed,
        "load_state_dict": _by_load_state_dict,
        "load_quantized": lambda: _by_load_quantized(tmp_path / "lq"),
        "transformers": lambda: _by_transformers(tmp_path / "hf"),
    }
    errors = {name: _refusal(call) for name, call in paths.items()}
    assert {name: error.expected for name, error in errors.items()} == dict.fromkeys(
        paths, EXPECTED
    )
    assert {error.dtype for error in errors.values()} == {"float8_e4m3fn"}


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    prepare = KernelBase.prepare_weights

    def counting(self: KernelBase, *args: torch.Tensor | None) -> object:
        calls.append(self.kernel_id)
        return prepare(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(KernelBase, "prepare_weights", counting)
    return calls


def test_a_forward_prepares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counted(monkeypatch)
    model = _model()
    quantize_model(model, caps=CPU, policy=kp.Policy())
    layer = model[0]
    assert isinstance(layer, QuantizedLinear)
    assert len(calls) == 2  # once per layer, when it was installed
    x = torch.randn(4, K)
    first = model(x)
    for _ in range(100):
        assert torch.equal(model(x), first)
    assert len(calls) == 2
    model.to(torch.bfloat16)  # a cast selects again: each layer prepares once more
    for _ in range(100):
        model(x.bfloat16())
    assert len(calls) == 4
    model.to(torch.float32)  # the bias went through bf16: a new reference
    again = model(x)
    state = model.state_dict()
    calls.clear()
    model.load_state_dict(state)  # a reload prepares again, once, on the next forward
    for _ in range(100):
        assert torch.equal(model(x), again)
    assert len(calls) == 2


def test_a_stale_preparation_is_never_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tensors written or replaced behind the layer's back (not through a loader, a cast or
    # load_state_dict) are prepared again before the next forward, not run stale.
    model = _model()
    quantize_model(model, caps=CPU, policy=kp.Policy())
    layer = model[0]
    x = torch.randn(4, K)
    bias = layer.get_parameter("bias").detach()
    before = layer(x).detach() - bias
    with torch.no_grad():
        layer.get_parameter("weight_scale").mul_(2)
    assert torch.allclose(layer(x).detach() - bias, 2 * before, rtol=1e-5, atol=1e-5)
    state = layer_state(layer)
    held = state.prepared
    layer.weight_scale = torch.nn.Parameter(layer.get_parameter("weight_scale") / 2, False)
    assert torch.allclose(layer(x).detach() - bias, before, rtol=1e-5, atol=1e-5)
    assert state.prepared is not held
