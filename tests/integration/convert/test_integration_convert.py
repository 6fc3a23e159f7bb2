"""quantize_model: in place, atomic by checking first, and a report of what it did."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import (
    KernelSelectionError,
    ModelConversionError,
    QuantizedLinear,
    QuantizedLinearMethod,
    SkippedLayer,
    layer_state,
    quantize_model,
    weight_loader_of,
)
from kernelpick.kernels import LAUNCHES, Launch
from tests.support.emulation import DequantThenMatmul, relative_error
from tests.support.snapshots import Snapshot, snapshot

CPU = kp.device_profile("cpu")


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.down(torch.relu(self.up(x)))
        return x + hidden


def _model(width: int = 64, depth: int = 3, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Block(width) for _ in range(depth)], torch.nn.Linear(width, 16))


def test_quantize_model_converts_every_linear_in_place_and_reports() -> None:
    model = _model()
    x = torch.randn(4, 64)
    want = model(x)
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    names = [layer.name for layer in report.layers]
    assert names == ["0.up", "0.down", "1.up", "1.down", "2.up", "2.down", "3"]
    assert all(type(module) is not torch.nn.Linear for module in model.modules())
    assert all(layer.kernel == "cpu_fp8_gemm" and not layer.degraded for layer in report.layers)
    assert report.bytes_after < 0.3 * report.bytes_before
    assert relative_error(model(x), want) <= 0.06
    assert "cpu_fp8_gemm" in report.render()
    assert "0.up" in report.render()


def test_each_layer_keeps_its_bias_tensor_and_records_its_decision() -> None:
    model = _model(depth=1)
    bias = model.get_submodule("0.up").get_parameter("bias")
    quantize_model(model, caps=CPU, policy=kp.Policy())
    converted = model.get_submodule("0.up")
    assert isinstance(converted, QuantizedLinear)
    assert converted.bias is bias
    assert converted.get_parameter("weight").dtype == torch.float8_e4m3fn
    assert layer_state(converted).decision.kernel == "cpu_fp8_gemm"
    assert "kernel=cpu_fp8_gemm" in repr(converted)


def _assert_untouched(model: torch.nn.Module, before: Snapshot) -> None:
    after = snapshot(model)
    assert after[0] == before[0]
    assert after[1].keys() == before[1].keys()
    for key in before[1]:
        assert after[1][key] == before[1][key], key


def test_a100_raises_and_leaves_every_module_and_weight_byte_identical() -> None:
    model = _model()
    before = snapshot(model)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=kp.device_profile("a100"), policy=kp.Policy())
    assert len(info.value.failures) == 7
    name, error = info.value.failures[0]
    assert name == "0.up"
    assert isinstance(error, KernelSelectionError)
    assert "nothing was changed" in str(info.value)
    _assert_untouched(model, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_weight_in_the_last_layer_leaves_the_model_untouched(bad: float) -> None:
    model = _model()
    with torch.no_grad():
        model.get_submodule("3").get_parameter("weight")[5, 2] = bad
    before = snapshot(model)
    with pytest.raises(ModelConversionError, match=r"3: 3\.weight: got shape \[16, 64\]") as info:
        quantize_model(model, caps=CPU, policy=kp.Policy())
    assert [name for name, _ in info.value.failures] == ["3"]
    assert "row 5" in str(info.value)
    _assert_untouched(model, before)


def test_an_unsupported_dtype_leaves_the_model_untouched() -> None:
    model = _model().double()
    before = snapshot(model)
    with pytest.raises(ModelConversionError, match="float64"):
        quantize_model(model, caps=CPU, policy=kp.Policy())
    _assert_untouched(model, before)


def test_skip_keeps_chosen_layers_and_the_report_says_so() -> None:
    model = _model(depth=1)
    report = quantize_model(model, caps=CPU, policy=kp.Policy(), skip=lambda name, _: name == "1")
    assert type(model[1]) is torch.nn.Linear
    assert report.skipped == (SkippedLayer("1", "skip() kept it"),)
    assert [layer.name for layer in report.layers] == ["0.up", "0.down"]


def test_weight_only_scheme_selects_the_w8a16_kernel() -> None:
    model = _model(depth=1)
    report = quantize_model(model, "fp8_weight_only", caps=CPU, policy=kp.Policy())
    assert {layer.kernel for layer in report.layers} == {"cpu_fp8_w8a16_gemm"}
    assert model(torch.randn(2, 64)).shape == (2, 16)


def test_a_scheme_that_needs_calibration_is_a_clear_error() -> None:
    model = _model(depth=1)
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match="calibrated"):
        quantize_model(model, "fp8_per_tensor_static", caps=CPU)
    _assert_untouched(model, before)


def test_a_module_reachable_twice_is_swapped_everywhere_once() -> None:
    shared = torch.nn.Linear(32, 32)
    model = torch.nn.ModuleDict({"a": shared, "b": torch.nn.Sequential(shared)})
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    assert len(report.layers) == 1
    assert model.get_submodule("a") is model.get_submodule("b.0")
    assert isinstance(model.get_submodule("a"), QuantizedLinear)


def test_linear_subclasses_owned_by_other_modules_are_left_alone() -> None:
    model = torch.nn.ModuleDict(
        {"attn": torch.nn.MultiheadAttention(32, 4), "fc": torch.nn.Linear(32, 32)}
    )
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    assert [layer.name for layer in report.layers] == ["fc"]
    assert type(model.get_submodule("attn.out_proj")) is not QuantizedLinear


def test_caps_default_to_a_probe_of_the_models_device() -> None:
    report = quantize_model(_model(depth=1), policy=kp.Policy())
    assert report.device == kp.probe("cpu").name


def test_a_bare_linear_cannot_be_replaced_in_place() -> None:
    with pytest.raises(kp.InvalidValueError, match="root"):
        quantize_model(torch.nn.Linear(16, 16), caps=CPU)


def _own_kernel() -> tuple[kp.Catalog, dict[str, Launch]]:
    """A kernel of one's own: its catalog row, first so it is preferred, and its launch row."""
    spec = kp.KernelSpec("cpu_my_w8a16", "cpu", kp.KernelKind.W8A16, ())
    return kp.Catalog((spec, *kp.default_catalog())), {
        **LAUNCHES,
        spec.id: Launch(DequantThenMatmul),
    }


def test_a_kernel_of_ones_own_converts_a_model_through_its_catalog_and_launch_rows() -> None:
    catalog, launches = _own_kernel()
    model, reference = _model(depth=1), _model(depth=1)
    report = quantize_model(
        model, "fp8_weight_only", caps=CPU, policy=kp.Policy(), catalog=catalog, launches=launches
    )
    assert {layer.kernel for layer in report.layers} == {"cpu_my_w8a16"}
    quantize_model(reference, "fp8_weight_only", caps=CPU, policy=kp.Policy())
    assert {
        type(layer_state(m).bound) for m in model.modules() if isinstance(m, QuantizedLinear)
    } == {DequantThenMatmul}
    x = torch.randn(4, 64)
    assert torch.allclose(model(x), reference(x), atol=1e-5)  # the same math as the built-in
    # A cast selects again, from the same tables.
    model.to(torch.bfloat16)
    state = layer_state(model.get_submodule("0.up"))
    assert state.decision.kernel == "cpu_my_w8a16"
    assert isinstance(state.bound, DequantThenMatmul)
    assert model(x.bfloat16()).dtype == torch.bfloat16


def test_a_kernel_of_ones_own_without_its_launch_row_is_refused_before_any_change() -> None:
    catalog, _ = _own_kernel()
    model = _model(depth=1)
    before = snapshot(model)
    # Not a misspelling to correct: the message says which row is missing and how to add it.
    with pytest.raises(kp.InvalidValueError, match="no row for 'cpu_my_w8a16'") as info:
        quantize_model(model, "fp8_weight_only", caps=CPU, policy=kp.Policy(), catalog=catalog)
    assert "{**LAUNCHES, 'cpu_my_w8a16': Launch(<family>)} to launches" in str(info.value)
    assert "did you mean" not in str(info.value)
    _assert_untouched(model, before)


def test_the_linear_method_refuses_a_catalog_id_without_a_row_before_any_layer() -> None:
    # Found when the method is made, not once an engine has allocated and loaded weights.
    catalog, _ = _own_kernel()
    with pytest.raises(kp.InvalidValueError, match="no row for 'cpu_my_w8a16'"):
        QuantizedLinearMethod("fp8_weight_only", CPU, kp.Policy(), catalog=catalog)


def test_a_table_missing_the_kernels_a_cast_would_select_is_refused_before_any_change() -> None:
    # Only the own kernel's row: fp32 runs it, but a cast to bf16 would select a built-in
    # kernel in the middle of torch's walk, after the modules before the layer were cast.
    catalog, launches = _own_kernel()
    only_mine = {"cpu_my_w8a16": launches["cpu_my_w8a16"]}
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), _model(depth=1))
    before = snapshot(model)
    with pytest.raises(kp.InvalidValueError, match="no row for 'cuda_rowwise_scaled_mm'"):
        quantize_model(
            model, "fp8_weight_only", caps=CPU, policy=kp.Policy(), catalog=catalog,
            launches=only_mine,
        )  # fmt: skip
    _assert_untouched(model, before)


def test_the_linear_method_runs_a_kernel_of_ones_own() -> None:
    catalog, launches = _own_kernel()
    method = QuantizedLinearMethod(
        "fp8_weight_only", CPU, kp.Policy(), catalog=catalog, launches=launches
    )
    layer = torch.nn.Module()
    method.create_weights(layer, 64, [32, 32], 64, 64, torch.float32, prefix="mlp.gate_up")
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, weight)
    method.process_weights_after_loading(layer)
    assert isinstance(layer_state(layer).bound, DequantThenMatmul)
    x = torch.randn(5, 64)
    assert relative_error(method.apply(layer, x), x @ weight.t()) <= 0.06


def test_launches_of_another_kind_are_refused_naming_what_is_valid() -> None:
    rows: object = [("cpu_my_w8a16", Launch(DequantThenMatmul))]  # pairs, not a mapping
    with pytest.raises(kp.InvalidValueError, match=r"launches.*kernel id to .*\.Launch"):
        QuantizedLinearMethod(caps=CPU, launches=rows)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "found", "example"),
    [(DequantThenMatmul, "class DequantThenMatmul", "DequantThenMatmul"),
     ("DequantThenMatmul", "str", "YourKernelFamily")],
    ids=["a family where its row belongs", "a name"],
)  # fmt: skip
def test_a_bad_launches_entry_is_named_with_what_it_is(
    row: object, found: str, example: str
) -> None:
    # A table has a dozen rows: the error names the one that is wrong, and what it is.
    launches: object = {**LAUNCHES, "cpu_my_w8a16": row}
    expected = (
        f"invalid launches['cpu_my_w8a16'] '{found}': "
        f"expected a kernelpick.kernels.Launch, e.g. Launch({example})"
    )
    with pytest.raises(kp.InvalidValueError) as info:
        quantize_model(_model(depth=1), caps=CPU, launches=launches)  # type: ignore[arg-type]
    assert str(info.value) == expected


def test_a_launches_key_that_is_not_an_id_is_named() -> None:
    launches: object = {1: Launch(DequantThenMatmul)}
    with pytest.raises(kp.InvalidValueError, match=r"invalid launches key 1: expected a kernel id"):
        QuantizedLinearMethod(caps=CPU, launches=launches)  # type: ignore[arg-type]
