"""quantize_model keeps what the model had: hooks, ties, the embedding's tied head, real
byte counts, and whole layers when something stops it halfway."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import (
    KernelSelectionError,
    ModelConversionError,
    QuantizedLinear,
    SkippedLayer,
    model_summary,
    quantize_model,
)
from kernelpick.integration.convert import _swap as swap
from kernelpick.integration.formats import CONV1D_KEPT, OUTPUT_HEAD_KEPT
from kernelpick.integration.layer import _accept as steps_module
from kernelpick.kernels._canonical import quantize_canonical
from tests.support.snapshots import snapshot

CPU = kp.device_profile("cpu")


class TinyLM(torch.nn.Module):
    """An embedding, two blocks and a head tied to the embedding, as language models have."""

    def __init__(self, vocab: int = 256, width: int = 64, tied: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                torch.nn.Linear(2 * width, width))
            for _ in range(2)
        )  # fmt: skip
        self.head = torch.nn.Linear(width, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        out: torch.Tensor = self.head(hidden)
        return out


def test_forward_hooks_and_pre_hooks_still_fire_and_still_come_off() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    seen: list[str] = []
    model[0].register_forward_pre_hook(lambda m, args: seen.append("pre"))
    handle = model[1].register_forward_hook(lambda m, args, out: seen.append("post"))
    model[1].register_forward_hook(lambda m, args, out: out * 2)  # a hook that changes output
    quantize_model(model, caps=CPU, policy=kp.Policy())
    assert isinstance(model[1], QuantizedLinear)
    x = torch.randn(2, 32)
    doubled = model(x)
    assert seen == ["pre", "post"]
    handle.remove()
    seen.clear()
    assert torch.equal(model(x), doubled)
    assert seen == ["pre"]


def test_linears_sharing_a_weight_stay_one_tensor_quantized_once() -> None:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(32, 32), "b": torch.nn.Linear(32, 32)})
    model["b"].weight = model["a"].weight
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    a, b = model["a"], model["b"]
    assert isinstance(a, QuantizedLinear)
    assert isinstance(b, QuantizedLinear)
    assert a.get_parameter("weight") is b.get_parameter("weight")
    assert a.get_parameter("weight_scale") is b.get_parameter("weight_scale")
    assert a.get_parameter("bias") is not b.get_parameter("bias")
    assert [layer.name for layer in report.layers] == ["a", "b"]
    assert len(model.state_dict()) == 6
    assert len(list(model.parameters())) == 4


def test_a_head_tied_to_the_embedding_is_kept_by_default_and_the_report_says_why() -> None:
    model = TinyLM()  # its head is no output head by name: the tie keeps it
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    assert type(model.head) is torch.nn.Linear
    assert model.head.weight is model.embed.weight
    why = ("its weight is tied to embed.weight (Embedding), which stays in high precision; "
           "untie=True converts a separate FP8 copy")  # fmt: skip
    assert report.skipped == (SkippedLayer("head", why),)
    assert f"kept in high precision: head (256 x 64): {why}" in report.render()
    assert model_summary(model).kept == report.summary.kept
    assert report.bytes_after < report.bytes_before


class _Lm(torch.nn.Module):
    """A block and an untied output head named as transformers names it."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.Linear(64, 64)
        self.lm_head = torch.nn.Linear(64, 256, bias=False)


def test_the_output_head_stays_high_precision_unless_asked_and_the_summary_says_so() -> None:
    model = _Lm()
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    assert type(model.lm_head) is torch.nn.Linear
    assert [layer.name for layer in report.skipped] == ["lm_head"]
    assert report.skipped[0].reason == OUTPUT_HEAD_KEPT
    assert f"kept in high precision: lm_head (256 x 64): {OUTPUT_HEAD_KEPT}" in (
        model_summary(model).render()
    )
    asked = _Lm()
    quantize_model(asked, caps=CPU, policy=kp.Policy(), quantize_head=True)
    assert isinstance(asked.lm_head, QuantizedLinear)
    with pytest.raises(kp.InvalidValueError, match="quantize_head"):
        quantize_model(_Lm(), caps=CPU, policy=kp.Policy(), quantize_head=1)


def test_untie_converts_the_head_and_the_report_counts_the_copy() -> None:
    model = TinyLM()
    report = quantize_model(model, caps=CPU, policy=kp.Policy(), untie=True)
    assert isinstance(model.head, QuantizedLinear)
    assert model.embed.weight.dtype == torch.float32  # the embedding keeps its own
    fp8_head = 256 * 64 + 256 * 4  # FP8 bytes and one fp32 scale per row
    kept = quantize_model(TinyLM(), caps=CPU, policy=kp.Policy())
    assert report.bytes_after == kept.bytes_after + fp8_head


def test_the_report_counts_each_storage_once() -> None:
    model = TinyLM()
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    report = quantize_model(model, caps=CPU, policy=kp.Policy())
    assert report.bytes_before == sum(unique.values())
    after = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    assert report.bytes_after == sum(after.values())


def _flat(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({f"l{i}": torch.nn.Linear(32, 48) for i in range(4)})
    model["twice"] = torch.nn.Sequential(model["l1"])  # l1 is reachable at two paths
    model["tied"] = torch.nn.Linear(32, 48)
    model["tied"].weight = model["l3"].weight  # l3 and tied share one weight
    return model


def _whole(model: torch.nn.Module, original: torch.nn.Module) -> list[str]:
    """The converted layers; asserts every other layer is exactly as in ``original``."""
    converted = []
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            converted.append(name)
        elif type(module) is torch.nn.Linear:
            twin = original.get_submodule(name)
            for key in ("weight", "bias"):
                assert torch.equal(module.get_parameter(key), twin.get_parameter(key)), name
    assert model.get_submodule("l1") is model.get_submodule("twice.0")
    tied = model.get_submodule("tied"), model.get_submodule("l3")
    assert tied[0].get_parameter("weight") is tied[1].get_parameter("weight")
    return converted


@pytest.mark.parametrize("call", range(6))  # six swaps: l0, l1 twice, l2, l3 and tied
def test_an_interrupt_at_any_swap_leaves_whole_layers_and_a_rerun_finishes(
    monkeypatch: pytest.MonkeyPatch, call: int
) -> None:
    model, original = _flat(), _flat()
    real = swap.Swaps.replace
    calls = []

    def replace(self: swap.Swaps, path: str, new: torch.nn.Module) -> None:
        calls.append(path)
        if len(calls) == call + 1:
            raise KeyboardInterrupt
        real(self, path, new)

    monkeypatch.setattr(swap.Swaps, "replace", replace)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=kp.Policy())
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    converted = _whole(model, original)
    assert set(info.value.converted) <= set(converted)
    assert "Run the same call again" in str(info.value)
    monkeypatch.setattr(swap.Swaps, "replace", real)
    quantize_model(model, caps=CPU, policy=kp.Policy())
    reference = _flat()
    quantize_model(reference, caps=CPU, policy=kp.Policy())
    x = torch.randn(3, 32)
    for name in ("l0", "l1", "l2", "l3", "tied"):
        assert torch.equal(model.get_submodule(name)(x), reference.get_submodule(name)(x)), name
    _whole(model, original)


def test_an_out_of_memory_while_quantizing_a_layer_leaves_it_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, original = _flat(), _flat()
    real = quantize_canonical
    calls = []

    def failing(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CPU out of memory")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(steps_module, "quantize_canonical", failing)
    with pytest.raises(ModelConversionError, match=r"RuntimeError\(CPU out of memory\)") as info:
        quantize_model(model, caps=CPU, policy=kp.Policy())
    assert info.value.converted == ("l0",)
    assert _whole(model, original) == ["l0"]


def test_identical_failures_are_listed_once_with_every_layer_named() -> None:
    model = torch.nn.ModuleDict({f"layer{i}": torch.nn.Linear(64, 64) for i in range(32)})
    model["odd"] = torch.nn.Linear(64, 40)  # unaligned: one more reason
    before = snapshot(model)
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=kp.device_profile("a100"), policy=kp.Policy())
    text = str(info.value)
    assert "33 layer(s) failed" in text
    assert "32 layers (layer0, layer1, layer2, layer3, layer4, layer5, and 26 more)" in text
    assert text.count("cuda_rowwise_scaled_mm: requires compute capability") == 2
    assert all(isinstance(error, KernelSelectionError) for _, error in info.value.failures)
    assert snapshot(model) == before


def test_a_model_on_the_meta_device_is_refused_naming_each_layer() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    with pytest.raises(ModelConversionError) as info:
        quantize_model(model, caps=CPU, policy=kp.Policy())
    assert [name for name, _ in info.value.failures] == ["0", "1"]
    assert all(isinstance(error, kp.KernelInputError) for _, error in info.value.failures)
    assert "not on the meta device" in str(info.value)
    assert all(type(m) is torch.nn.Linear for m in model)


def test_each_replaced_linear_is_freed_before_the_next_is_quantized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import weakref

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    originals = [weakref.ref(module) for module in model]
    alive: list[int] = []

    def counting(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        alive.append(sum(ref() is not None for ref in originals))
        return quantize_canonical(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(steps_module, "quantize_canonical", counting)
    quantize_model(model, caps=CPU, policy=kp.Policy())
    assert alive == [4, 3, 2, 1]  # peak memory stays near one high-precision layer
    assert all(ref() is None for ref in originals)


def test_a_load_state_dict_pre_hook_moves_to_the_converted_layer() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32))
    seen: list[type] = []
    register = model[0].register_load_state_dict_pre_hook
    register(lambda module, *args: seen.append(type(module)))  # type: ignore[no-untyped-call]
    quantize_model(model, caps=CPU, policy=kp.Policy())
    model.load_state_dict(model.state_dict())
    assert seen == [QuantizedLinear]


def _tiny_gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model: torch.nn.Module = transformers.GPT2LMHeadModel(config)
    return model


def test_gpt2s_conv1d_layers_are_kept_by_name_never_passed_over_in_silence() -> None:
    """transformers' Conv1D stores its weight K x N: no exact nn.Linear, so quantize_model
    keeps each one, with why and its N x K, and every 2-D weight of the model is then an
    embedding, a converted layer or a kept one."""
    model = _tiny_gpt2()
    report = quantize_model(model, "fp8_per_channel", caps=CPU)
    kept = {layer.name: (layer.weight_shape, layer.reason) for layer in report.summary.kept}
    assert kept["transformer.h.0.attn.c_attn"] == ((192, 64), CONV1D_KEPT)
    assert kept["transformer.h.1.mlp.c_proj"] == ((64, 256), CONV1D_KEPT)
    assert report.layers == ()
    matrices = {
        name.removesuffix(".weight") for name, p in model.named_parameters() if p.dim() == 2
    }
    assert matrices - set(kept) == {"transformer.wte", "transformer.wpe"}
    assert f"c_attn (2 x 192 x 64): {CONV1D_KEPT}" in report.summary.render()
