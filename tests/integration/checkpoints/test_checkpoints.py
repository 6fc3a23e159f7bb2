"""Quantized weights are data: one canonical layout whatever the kernel, checkpoints out and
in, and no tensor that could be misread is ever taken."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import safetensors.torch
import torch

import kernelpick as kp
from kernelpick.core import Dtype, evaluate
from kernelpick.integration import (
    CheckpointError,
    ModelConversionError,
    QuantizedLinear,
    layer_state,
    load_quantized,
    quantize_model,
    save_quantized,
)
from kernelpick.integration.layer import LayerState, LayerSteps, Recipe, accept_float, install
from kernelpick.kernels import LAUNCHES, Launch, ReferenceW8A16
from tests.support.emulation import BOUND, emulated, on_cpu, relative_error
from tests.support.snapshots import snapshot
from tests.support.tiny_llama import llama

CPU = kp.device_profile("cpu")
# (in, out) of each linear: square and non-square, multiples of 16 for _scaled_mm.
WIDTHS = ((64, 64), (64, 96), (96, 32))


def _model(seed: int = 0, bias: bool = True) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for k, n in WIDTHS:
        layers += [torch.nn.Linear(k, n, bias=bias), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _as_if_on(model: torch.nn.Module, scheme: str, caps: kp.DeviceCaps) -> list[str]:
    """Quantize ``model``'s linears with the kernel selected for ``caps``, its family run on
    CPU tensors (as the CUDA kernel tests do), so a layer runs a GPU kernel's math here."""
    steps = LayerSteps.create(Recipe.of(scheme), caps, kp.Policy())
    kernels = []
    for name, linear in list(model.named_children()):
        if not isinstance(linear, torch.nn.Linear):
            continue
        config = steps.config(linear.out_features, linear.in_features, torch.float32, bias=True)
        state = LayerState(steps.plan(config, (linear.out_features,), torch.float32, name))
        kernel = on_cpu(state.decision.kernel, config, caps)  # a GPU family on CPU tensors
        layer = QuantizedLinear(linear.in_features, linear.out_features, steps, linear.bias)
        install(layer, state, kernel, accept_float(state.config, state.label, linear.weight))
        setattr(model, name, layer)
        kernels.append(state.decision.kernel)
    return kernels


def _expected(x: torch.Tensor, source: torch.nn.Module, model: torch.nn.Module) -> torch.Tensor:
    """The emulated output of ``model``'s kernels on the unquantized ``source`` weights."""
    out = x
    for original, layer in zip(source.children(), model.children(), strict=True):
        if not isinstance(layer, QuantizedLinear):
            out = layer(out)
            continue
        state = layer_state(layer)
        weight_only = "w8a16" in state.decision.kernel
        weight, bias = original.get_parameter("weight"), original.get_parameter("bias")
        out = emulated(out, weight.detach(), state.config, Dtype.FLOAT8_E4M3FN, bias=bias,
                      weight_only=weight_only).out  # fmt: skip
    return out


def _cpu_kernels(scheme: str) -> list[str]:
    config = kp.quant_config(scheme, weight_shape=(64, 64))
    return [v.kernel for v in evaluate(CPU, config) if v.ok]


PAIRS = [
    (scheme, saved, loaded)
    for scheme in ("fp8_per_channel", "fp8_per_tensor", "fp8_weight_only")
    for saved in _cpu_kernels(scheme)
    for loaded in _cpu_kernels(scheme)
]


def _run_layers(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(x)
    return out


@pytest.mark.parametrize(("scheme", "saved", "loaded"), PAIRS)
def test_a_checkpoint_saved_under_one_cpu_kernel_loads_under_any_other(
    tmp_path: Path, scheme: str, saved: str, loaded: str
) -> None:
    source, model = _model(), _model()
    quantize_model(model, scheme, CPU, kp.Policy(force=saved))
    save_quantized(model, tmp_path)
    skeleton = _model(seed=1)  # other weights: everything must come from the checkpoint
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy(force=loaded))
    assert {layer.kernel for layer in report.layers} == {loaded}
    x = torch.randn(5, 64)
    got = _run_layers(skeleton, x)
    assert relative_error(got, _expected(x, source, skeleton)) <= BOUND["float32"]
    if "w8a16" not in saved + loaded or saved == loaded:
        assert relative_error(got, _run_layers(model, x)) <= BOUND["float32"]


def test_a_checkpoint_loads_onto_a_kernel_of_ones_own(tmp_path: Path) -> None:
    # A new catalog id for the weight-only reference family: the load selects and binds it.
    spec = kp.KernelSpec("cpu_my_w8a16", "cpu", kp.KernelKind.W8A16, ())
    catalog = kp.Catalog((spec, *kp.default_catalog()))
    launches = {**LAUNCHES, spec.id: Launch(ReferenceW8A16)}
    model = _model()
    # Saved under the built-in row of the same family, so the two runs below do the same
    # math and compare bit for bit: only the checkpoint's bytes could make them differ.
    quantize_model(model, "fp8_weight_only", CPU, kp.Policy(force="cpu_w8a16_reference"))
    save_quantized(model, tmp_path)
    skeleton = _model(seed=1)
    report = load_quantized(
        skeleton, tmp_path, CPU, kp.Policy(), catalog=catalog, launches=launches
    )
    assert {layer.kernel for layer in report.layers} == {"cpu_my_w8a16"}
    x = torch.randn(5, 64)
    assert torch.equal(_run_layers(skeleton, x), _run_layers(model, x))


@pytest.mark.parametrize(
    ("profile", "scheme"),
    [("h100", "fp8_per_channel"), ("h100", "fp8_per_tensor"), ("a100", "fp8_per_tensor"),
     ("a100", "fp8_weight_only")],
)  # fmt: skip
def test_a_layer_run_by_a_gpu_kernel_saves_what_a_cpu_kernel_loads(
    tmp_path: Path, profile: str, scheme: str
) -> None:
    caps = attrs.evolve(kp.device_profile(profile), libraries=frozenset())  # torch-op kernels
    source, gpu, cpu = _model(), _model(), _model()
    kernels = _as_if_on(gpu, scheme, caps)
    assert all(kernel.startswith("cuda_") for kernel in kernels)
    quantize_model(cpu, scheme, CPU, kp.Policy())
    for key, tensor in gpu.state_dict().items():  # one layout, whatever the kernel
        assert torch.equal(tensor.view(torch.uint8), cpu.state_dict()[key].view(torch.uint8)), key
    save_quantized(gpu, tmp_path)
    skeleton = _model(seed=1)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    x = torch.randn(7, 64)
    got = _run_layers(skeleton, x)
    assert relative_error(got, _expected(x, source, skeleton)) <= BOUND["float32"]
    assert relative_error(_run_layers(gpu, x), _expected(x, source, gpu)) <= BOUND["float32"]


def test_the_state_dict_is_canonical_and_safetensors_takes_it(tmp_path: Path) -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    state = model.state_dict()
    for index, (k, n) in zip((0, 2, 4), WIDTHS, strict=True):
        weight, scale = state[f"{index}.weight"], state[f"{index}.weight_scale"]
        assert (weight.dtype, tuple(weight.shape), weight.is_contiguous()) == (
            torch.float8_e4m3fn, (n, k), True
        )  # fmt: skip
        assert (scale.dtype, tuple(scale.shape)) == (torch.float32, (n, 1))
        assert not bool((weight.view(torch.uint8) == 0x80).any())  # +0 only
    safetensors.torch.save_file(state, str(tmp_path / "plain.safetensors"))
    again = safetensors.torch.load_file(str(tmp_path / "plain.safetensors"))
    assert all(
        torch.equal(again[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items()
    )


def test_save_writes_the_compressed_tensors_config_beside_the_weights(tmp_path: Path) -> None:
    model = torch.nn.ModuleDict(
        {"attn": torch.nn.MultiheadAttention(32, 4), "fc": torch.nn.Linear(32, 32),
         "keep": torch.nn.Linear(32, 16)}
    )  # fmt: skip
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), skip=lambda n, _: n == "keep")
    save_quantized(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["format"] == "float-quantized"
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    assert (
        group["weights"] | {"type": "float", "num_bits": 8, "strategy": "channel"}
        == group["weights"]
    )
    assert group["input_activations"]["strategy"] == "token"
    assert group["input_activations"]["dynamic"] is True
    # Everything a reader would match as "Linear" but that stays in high precision.
    assert config["ignore"] == ["attn.out_proj", "keep"]


def test_save_merges_into_a_transformers_config(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16,
    )  # fmt: skip
    model = torch.nn.Module.eval(BertModel(config))
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "bert"
    assert written["hidden_size"] == 32
    assert written["quantization_config"]["quant_method"] == "compressed-tensors"
    skeleton = torch.nn.Module.eval(BertModel(config))
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        assert torch.equal(skeleton(ids).last_hidden_state, model(ids).last_hidden_state)


def _written_config(directory: Path, model: torch.nn.Module) -> dict[str, object]:
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, directory)
    written: dict[str, object] = json.loads((directory / "config.json").read_text())
    return written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_save_writes_the_architectures_and_the_dtype_save_pretrained_writes(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    model = llama(seed=0, dtype=dtype)
    model.config.dtype = torch.float64  # stale: the weights' dtype is what is written
    written = _written_config(tmp_path, model)
    assert written["architectures"] == ["LlamaForCausalLM"]
    assert written["dtype"] == Dtype.parse(dtype).value
    assert "torch_dtype" not in written


def test_save_writes_no_dtype_for_layers_of_several(tmp_path: Path) -> None:
    model = llama(seed=0)
    model.model.layers[0].mlp.down_proj.to(torch.bfloat16)
    model.config.dtype = torch.float32  # what from_pretrained would have set
    written = _written_config(tmp_path, model)
    assert ("dtype" in written, written["architectures"]) == (False, ["LlamaForCausalLM"])


def test_save_of_a_model_without_a_config_writes_its_dtype_and_quantization_config(
    tmp_path: Path,
) -> None:
    """No class to name, but the dtype its layers compute in, which inspect reads."""
    written = _written_config(tmp_path, _model())
    assert sorted(written) == ["dtype", "quantization_config"]
    assert written["dtype"] == "float32"


def test_a_meta_skeleton_loads_without_a_high_precision_weight(tmp_path: Path) -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    with torch.device("meta"):
        skeleton = _model()
    before = [id(p) for p in skeleton.parameters()]
    nominal = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    # The skeleton held no data: it counts at the size it would take, not as nothing (a
    # report of "0.0 MiB -> 0.2 MiB (1.00x)" said the load cost nothing).
    assert report.bytes_before == nominal
    assert f"({report.bytes_after / nominal:.2f}x)" in report.render()
    assert report.bytes_after == sum(
        t.numel() * t.element_size() for t in model.state_dict().values()
    )
    assert not any(p.is_meta for p in skeleton.parameters())
    assert not set(before) & {id(p) for p in skeleton.parameters()}
    x = torch.randn(3, 64)
    assert torch.equal(_run_layers(skeleton, x), _run_layers(model, x))


def test_a_meta_buffer_no_checkpoint_holds_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    with torch.device("meta"):
        skeleton = _model()
        skeleton.register_buffer("table", torch.ones(4), persistent=False)
    with pytest.raises(CheckpointError, match="table"):
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert all(type(m) is not QuantizedLinear for m in skeleton.modules())


def _saved(tmp_path: Path, scheme: str = "fp8_per_channel") -> torch.nn.Module:
    model = _model()
    quantize_model(model, scheme, CPU, kp.Policy())
    save_quantized(model, tmp_path)
    return model


def _rewrite(tmp_path: Path, change: Callable[[dict[str, torch.Tensor]], object]) -> None:
    path = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    change(tensors)
    safetensors.torch.save_file(tensors, str(path))


def _set(key: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], object]:
    return lambda tensors: tensors.__setitem__(key, value)


def _nan_byte(tensors: dict[str, torch.Tensor]) -> None:
    weight = tensors["2.weight"].clone()
    weight.view(torch.uint8)[3, 4] = 0x7F
    tensors["2.weight"] = weight


CORRUPT: list[tuple[str, Callable[[dict[str, torch.Tensor]], object], str]] = [
    ("missing scale", lambda t: t.pop("2.weight_scale"), "2.weight_scale"),
    ("extra tensor", _set("9.weight", torch.ones(2)), "9.weight"),
    ("float weight", _set("0.weight", torch.ones(64, 64)), "float8_e4m3fn"),
    ("transposed", _set("2.weight", torch.zeros(64, 96, dtype=torch.float8_e4m3fn)), "[96, 64]"),
    ("nan byte", _nan_byte, "NaN byte"),
    ("zero scale", _set("4.weight_scale", torch.zeros(32, 1)), "positive, finite"),
    ("fp8 where floats go", _set("0.bias", torch.zeros(64, dtype=torch.float8_e4m3fn)), "0.bias"),
]


@pytest.mark.parametrize(("case", "change", "named"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_a_checkpoint_that_could_be_misread_is_refused_and_the_model_is_unchanged(
    tmp_path: Path, case: str, change: Callable[[dict[str, torch.Tensor]], object], named: str
) -> None:
    _saved(tmp_path)
    _rewrite(tmp_path, change)
    skeleton = _model(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(kp.KernelpickError, match=named.replace("[", r"\[")):
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert snapshot(skeleton) == before


UNSUPPORTED = [
    ("block", lambda c: c["config_groups"]["group_0"]["weights"].update(strategy="block")),
    ("int8", lambda c: c["config_groups"]["group_0"]["weights"].update(type="int")),
    ("kv cache", lambda c: c.update(kv_cache_scheme={"num_bits": 8})),
    ("two groups", lambda c: c["config_groups"].update(group_1={})),
    ("a preset", lambda c: c["config_groups"].update(group_0=["Linear"])),
    ("dense", lambda c: c.update(format="dense")),
    ("other method", lambda c: c.update(quant_method="fp8")),
    ("4 bits", lambda c: c["config_groups"]["group_0"]["input_activations"].update(num_bits=4)),
]


@pytest.mark.parametrize(("case", "change"), UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
def test_a_config_kernelpick_does_not_read_is_named_and_nothing_changes(
    tmp_path: Path, case: str, change: Callable[[dict[str, object]], None]
) -> None:
    _saved(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    change(config["quantization_config"])
    path.write_text(json.dumps(config))
    skeleton = _model(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(CheckpointError) as info:
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert "config.json" in str(info.value)
    assert snapshot(skeleton) == before


def test_no_kernel_for_the_checkpoint_names_every_layer_once_and_changes_nothing(
    tmp_path: Path,
) -> None:
    _saved(tmp_path)
    skeleton = _model(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(ModelConversionError) as info:
        load_quantized(
            skeleton,
            tmp_path,
            CPU,
            # Every CPU kernel for the per-channel checkpoint's W8A8 layers.
            kp.Policy(disabled=("cpu_fp8_gemm", "cpu_rowwise_scaled_mm", "cpu_dequant_reference")),
        )
    assert [name for name, _ in info.value.failures] == ["0", "2", "4"]
    assert snapshot(skeleton) == before


def test_an_interrupted_load_puts_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelpick.integration.convert import _swap as swap

    _saved(tmp_path)
    skeleton = _model(seed=1)
    before = snapshot(skeleton)
    real = swap.Swaps.replace
    calls = []

    def interrupted(self: swap.Swaps, path: str, new: torch.nn.Module) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, path, new)

    monkeypatch.setattr(swap.Swaps, "replace", interrupted)
    with pytest.raises(ModelConversionError) as info:
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert snapshot(skeleton) == before
    monkeypatch.setattr(swap.Swaps, "replace", real)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert sum(type(m) is QuantizedLinear for m in skeleton.modules()) == 3


def test_static_schemes_load_their_input_scale(tmp_path: Path) -> None:
    model = _model()
    quantize_model(model, "fp8_per_tensor", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = (
        False
    )
    config_path.write_text(json.dumps(config))
    scales = {f"{i}.input_scale": torch.tensor([0.02]) for i in (0, 2, 4)}
    _rewrite(tmp_path, lambda tensors: tensors.update(scales))
    skeleton = _model(seed=1)
    report = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert report.scheme == "fp8_per_tensor_static"
    layer = skeleton.get_submodule("2")
    assert float(layer.get_parameter("input_scale")) == pytest.approx(0.02)
    assert _run_layers(skeleton, torch.randn(2, 64)).shape == (2, 32)


def test_a_sharded_checkpoint_loads_through_its_index(tmp_path: Path) -> None:
    model = _saved(tmp_path)
    single = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(single))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    for file, keys in shards.items():
        safetensors.torch.save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    weight_map = {key: file for file, keys in shards.items() for key in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    single.unlink()
    skeleton = _model(seed=1)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    x = torch.randn(3, 64)
    assert torch.equal(_run_layers(skeleton, x), _run_layers(model, x))


def test_save_refuses_a_model_with_no_or_mixed_schemes(tmp_path: Path) -> None:
    with pytest.raises(kp.InvalidValueError, match="no quantized layer"):
        save_quantized(_model(), tmp_path)
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), skip=lambda n, _: n == "4")
    quantize_model(model, "fp8_per_tensor", CPU, kp.Policy())
    with pytest.raises(kp.InvalidValueError, match="fp8_per_channel', 'fp8_per_tensor"):
        save_quantized(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_skeleton_that_ties_weights_the_checkpoint_stores_apart_is_refused(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(32, 32), "b": torch.nn.Linear(32, 32)})
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    skeleton = torch.nn.ModuleDict({"a": torch.nn.Linear(32, 32), "b": torch.nn.Linear(32, 32)})
    skeleton["b"].weight = skeleton["a"].weight
    before = snapshot(skeleton)
    with pytest.raises(CheckpointError, match="which the skeleton ties to b"):
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert snapshot(skeleton) == before


class _WithBuffer(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.register_buffer("table", torch.zeros(4, dtype=dtype))


@pytest.mark.parametrize(
    ("saved", "skeleton", "value", "error"),
    [
        (torch.int64, torch.uint8, 300.0, r"uint8 \[4\], as the model"),  # would wrap around
        (torch.float32, torch.float16, 1e6, "values out of range of float16"),  # would be inf
        (torch.float32, torch.bfloat16, 1e6, None),  # a float cast that fits: loaded
    ],
)
def test_other_tensors_load_into_the_skeletons_dtype_only_when_their_values_fit(
    tmp_path: Path, saved: torch.dtype, skeleton: torch.dtype, value: float, error: str | None
) -> None:
    model = _WithBuffer(saved)
    model.get_buffer("table").fill_(value)
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    target = _WithBuffer(skeleton)
    if error is None:
        load_quantized(target, tmp_path, CPU, kp.Policy())
        assert float(target.get_buffer("table")[0]) == pytest.approx(value, rel=1e-2)
        return
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=error):
        load_quantized(target, tmp_path, CPU, kp.Policy())
    assert snapshot(target) == before


def test_an_index_is_followed_and_a_key_it_lists_must_be_in_its_file(tmp_path: Path) -> None:
    model = _saved(tmp_path)
    single = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(str(single))
    stale = {key: torch.zeros_like(tensor) for key, tensor in tensors.items()}
    safetensors.torch.save_file(tensors, str(tmp_path / "a.safetensors"))
    safetensors.torch.save_file(stale, str(tmp_path / "b.safetensors"))  # not in the index
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(tensors, "a.safetensors")}))
    single.unlink()
    skeleton = _model(seed=1)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    x = torch.randn(3, 64)
    assert torch.equal(_run_layers(skeleton, x), _run_layers(model, x))
    index.write_text(json.dumps({"weight_map": {**dict.fromkeys(tensors, "a.safetensors"),
                                                "0.weight": "c.safetensors"}}))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"c\.safetensors"):
        load_quantized(_model(seed=1), tmp_path, CPU, kp.Policy())
    safetensors.torch.save_file({"x": torch.ones(1)}, str(tmp_path / "c.safetensors"))
    with pytest.raises(CheckpointError, match=r"none for 0\.weight; expected what the index"):
        load_quantized(_model(seed=1), tmp_path, CPU, kp.Policy())


def test_a_single_file_beside_an_index_naming_other_shards_is_refused(tmp_path: Path) -> None:
    """vLLM reads the shards the index names, other readers model.safetensors: two
    checkpoints in one directory, unless the index names the single file alone."""
    model = _saved(tmp_path)
    tensors = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    safetensors.torch.save_file(tensors, str(tmp_path / "a.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(tensors, "a.safetensors")}))
    with pytest.raises(CheckpointError, match=r"index\.json: .*beside a model\.safetensors"):
        load_quantized(_model(seed=1), tmp_path, CPU, kp.Policy())
    index.write_text(json.dumps({"weight_map": dict.fromkeys(tensors, "model.safetensors")}))
    skeleton = _model(seed=1)
    load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    x = torch.randn(3, 64)
    assert torch.equal(_run_layers(skeleton, x), _run_layers(model, x))


@pytest.mark.parametrize(("value", "skeleton", "named"), [
    (1e6, torch.float16, "values out of range of float16"),
    (float("nan"), torch.float32, "NaN or Inf"),
])  # fmt: skip
def test_a_quantized_layers_bias_must_load_finite(
    tmp_path: Path, value: float, skeleton: torch.dtype, named: str
) -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    with torch.no_grad():
        model.get_submodule("2").get_parameter("bias")[0] = value
    save_quantized(model, tmp_path)
    target = _model(seed=1).to(skeleton)
    before = snapshot(target)
    with pytest.raises(kp.KernelpickError, match=named):
        load_quantized(target, tmp_path, CPU, kp.Policy())
    assert snapshot(target) == before


def test_a_scale_stored_across_input_channels_is_not_read_as_per_output_channel(
    tmp_path: Path,
) -> None:
    _saved(tmp_path)
    _rewrite(tmp_path, lambda t: t.__setitem__("0.weight_scale", t["0.weight_scale"].t()))
    skeleton = _model(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(ModelConversionError, match=r"0\.weight_scale: got shape \[1, 64\]"):
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert snapshot(skeleton) == before


class _Derived(torch.nn.Module):
    """A module that saves a tensor computed from its parameter, not the parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.gain = torch.nn.Parameter(torch.ones(32))

    def _save_to_state_dict(self, destination: dict[str, object], prefix: str, keep: bool) -> None:
        destination[prefix + "gain"] = self.gain * 1


def test_a_tensor_the_skeleton_derives_when_saving_is_refused(tmp_path: Path) -> None:
    model = _Derived()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(model, tmp_path)
    with pytest.raises(CheckpointError, match="gain: found a tensor the model derives"):
        load_quantized(_Derived(), tmp_path, CPU, kp.Policy())


def test_a_linear_holding_more_than_weight_and_bias_is_kept_and_not_loaded_into(
    tmp_path: Path,
) -> None:
    model = _model()
    model.get_submodule("2").register_buffer("mask", torch.ones(96))
    report = quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    assert report.skipped[0].name == "2"
    assert "mask, which a QuantizedLinear would drop" in report.skipped[0].reason
    assert type(model.get_submodule("2")) is torch.nn.Linear
    plain = _model()
    quantize_model(plain, "fp8_per_channel", CPU, kp.Policy())
    save_quantized(plain, tmp_path)
    skeleton = _model(seed=1)
    skeleton.get_submodule("2").register_buffer("mask", torch.ones(96))
    with pytest.raises(ModelConversionError, match="Linear holding mask"):
        load_quantized(skeleton, tmp_path, CPU, kp.Policy())


def test_save_refuses_a_directory_holding_another_checkpoint(tmp_path: Path) -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy())
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json"):
        save_quantized(model, tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    save_quantized(model, tmp_path)
    save_quantized(model, tmp_path)  # its own file is replaced
