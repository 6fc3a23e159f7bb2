"""kernelpick as a transformers quantizer (``kernelpick.engines.transformers``), against the
installed transformers: quantize on load, save, reload pre-quantized, and refusals.

The tiny-Llama tests run in a second or two each; the all-MiniLM ones (the ``e2e`` extra
ships the model, so they run offline) are slow: a real model and a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaForCausalLM
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    AutoQuantizationConfig,
)

import kernelpick as kp
from kernelpick.engines.transformers import KernelpickConfig, KernelpickHfQuantizer
from kernelpick.integration import (
    CheckpointError,
    KernelSelectionError,
    ModelConversionError,
    QuantizedLinear,
    load_quantized,
    quantization_config,
)
from tests.engines.hf_models import (
    EMBED,
    ROOT,
    as_format_v1,
    embed_function,
    linears,
    llama_dir,
    load,
    minilm,
    saved,
)
from tests.support.tiny_llama import FP8_BOUND, llama, logits

# -- registration and config ---------------------------------------------------------------


def test_import_registers_kernelpick_and_kernelpick_alone_imports_no_transformers() -> None:
    assert AUTO_QUANTIZATION_CONFIG_MAPPING["kernelpick"] is KernelpickConfig
    assert AUTO_QUANTIZER_MAPPING["kernelpick"] is KernelpickHfQuantizer
    code = "import sys, kernelpick, kernelpick.engines; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_round_trips_through_its_dict() -> None:
    config = KernelpickConfig("fp8_block", ["mlp"], 64)
    saved = config.to_dict()
    assert saved == {
        "quant_method": "kernelpick", "scheme": "fp8_block", "modules_to_not_convert": ["mlp"],
        "block_size": 64, "group_size": None, "symmetric": True, "format_version": 1,
    }  # fmt: skip
    again = AutoQuantizationConfig.from_dict(json.loads(json.dumps(saved)))
    assert isinstance(again, KernelpickConfig)
    assert again.to_dict() == saved
    default = KernelpickConfig()
    # None is the default (the model's output heads), saved as None: a reload applies the
    # same default to the model it loads, rather than a list naming one head.
    assert (default.scheme, default.modules_to_not_convert) == ("fp8_per_channel", None)
    assert default.to_dict()["modules_to_not_convert"] is None
    reloaded = AutoQuantizationConfig.from_dict(json.loads(json.dumps(default.to_dict())))
    assert reloaded.to_dict() == default.to_dict()
    assert default.caps is None
    assert default.policy is None
    assert "caps" not in KernelpickConfig(caps=kp.device_profile("cpu")).to_dict()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"scheme": "fp8_per_tensor_static"}, "fp8_per_tensor_static"),
        ({"scheme": "int4"}, "int4"),
        ({"scheme": "fp8_per_channel", "block_size": 64}, "block_size"),
        ({"scheme": "fp8_block", "block_size": 0}, "block_size"),
        ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
        ({"quant_method": "fp8"}, "quant_method"),
        ({"format_version": 2}, "format_version"),
        ({"weight_block_size": [128, 128]}, "weight_block_size"),
        ({"caps": "a100"}, "caps"),
        ({"scheme": "fp8_per_channel", "group_size": 64}, "group_size"),
        ({"scheme": "int4_weight_only", "group_size": 0}, "group_size"),
        ({"scheme": "int4_weight_only", "symmetric": "no"}, "symmetric"),
    ],
)
def test_bad_config_values_are_refused(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(kp.KernelpickError, match=named):
        KernelpickConfig(**kwargs)


# -- quantize on load ----------------------------------------------------------------------


def test_lm_head_stays_high_precision_by_default(tmp_path: Path) -> None:
    path = llama_dir(tmp_path)
    reference = load(path)
    model = load(path, quantization_config=KernelpickConfig())
    assert linears(model, torch.nn.Linear) == ["lm_head"]
    assert len(linears(model, QuantizedLinear)) == 14  # 2 layers x (4 attention + 3 MLP)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    error = torch.linalg.norm(logits(model) - logits(reference)) / torch.linalg.norm(
        logits(reference)
    )
    assert float(error) < FP8_BOUND


def test_modules_to_not_convert_are_honoured(tmp_path: Path) -> None:
    path = llama_dir(tmp_path)
    # transformers' patterns: a suffix, and a prefix ending at a module boundary
    skip = ["down_proj", "model.layers.1.mlp"]
    model = load(path, quantization_config=KernelpickConfig(modules_to_not_convert=skip))
    assert sorted(linears(model, torch.nn.Linear)) == [
        "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj",
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
    ]  # fmt: skip
    assert "lm_head" in linears(model, QuantizedLinear)  # an explicit list replaces the default


def test_a_rejected_device_raises_before_any_weight_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = llama_dir(tmp_path)
    from transformers import modeling_utils

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights loaded before the kernel was selected")

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "_load_pretrained_model", no_loading)
    config = KernelpickConfig(caps=kp.device_profile("a100"), policy=kp.Policy())
    with pytest.raises(KernelSelectionError) as info:
        load(path, quantization_config=config)
    text = str(info.value)
    assert text.startswith('quantization="fp8_per_channel": ')
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert f"\n  - {kernel}: " in text


def test_a_weight_kernelpick_refuses_raises_kernelpicks_error(tmp_path: Path) -> None:
    """transformers would only log an error raised while it converts a weight, then raise
    its own ("issues during automatic conversion"): the user sees kernelpick's, naming
    the layer and why."""
    path = llama_dir(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelConversionError, match="row 3 has NaN or Inf") as caught:
        load(path, quantization_config=KernelpickConfig())
    assert [name for name, _ in caught.value.failures] == ["model.layers.1.mlp.up_proj"]
    assert isinstance(caught.value.failures[0][1], kp.KernelInputError)


UP = "model.layers.1.mlp.up_proj"
GATE = "model.layers.0.mlp.gate_proj"
QUANTIZED_ALREADY: list[tuple[str, str, Any, dict[str, Any]]] = [
    # What is stored, under what name, and how from_pretrained is asked to read it.
    ("int8 weight", f"{UP}.weight", lambda t: t.to(torch.int8), {}),
    ("fp8 weight", f"{UP}.weight", lambda t: t.to(torch.float8_e4m3fn), {}),
    # transformers renames keys (key_mapping, conversion mappings) before kernelpick sees
    # a name: what is stored is refused, whatever it is called.
    ("renamed", f"{UP}.weight", lambda t: t.to(torch.float8_e4m3fn),
     {"key_mapping": {"upp_proj": "up_proj"}, "rename": ("up_proj", "upp_proj")}),
    # A module kept in high precision would take FP8 bytes cast, without their scale.
    ("kept module", "lm_head.weight", lambda t: t.to(torch.float8_e4m3fn), {}),
    # A scale in a high-precision checkpoint would replace the one quantizing makes.
    ("stray scale", f"{UP}.weight_scale", lambda t: torch.full((t.shape[0], 1), 0.5), {}),
    ("pickled", f"{UP}.weight", lambda t: t.to(torch.float8_e4m3fn), {"bin": True}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "key", "change", "how"), QUANTIZED_ALREADY, ids=[c[0] for c in QUANTIZED_ALREADY]
)
def test_a_quantized_checkpoint_is_refused_before_a_weight_is_quantized_on_load(
    tmp_path: Path,
    case: str,
    key: str,
    change: Any,
    how: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers casts each stored tensor to the model's dtype before the quantize op
    (or a module kept in high precision) sees it: FP8 or int8 bytes (a quantized checkpoint
    saved with no quantization_config) would arrive as values without their scale."""
    path = llama_dir(tmp_path)
    tensors = load_file(path / "model.safetensors")
    source = key if key in tensors else key.replace("weight_scale", "weight")
    tensors[key] = change(tensors[source])
    stored = key
    if "rename" in how:
        old, new = how["rename"]
        stored = key.replace(old, new)
        tensors[stored] = tensors.pop(key)
    (path / "model.safetensors").unlink()
    if how.get("bin"):
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    from transformers import modeling_utils

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights loaded before the checkpoint was checked")

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "_load_pretrained_model", no_loading)
    kwargs = {"key_mapping": how["key_mapping"]} if "key_mapping" in how else {}
    with pytest.raises(CheckpointError, match="quantized already") as caught:
        load(path, quantization_config=KernelpickConfig(), **kwargs)
    assert caught.value.key == stored, case


def test_a_scale_past_the_file_check_is_never_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the files are not read first (a loader that passes none), an online layer
    still installs only the scale its quantizing made."""
    import kernelpick.engines.transformers as plugin

    path = llama_dir(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors[f"{UP}.weight_scale"] = torch.full((192, 1), 0.5)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.setattr(plugin, "check_high_precision", lambda files: None)
    with pytest.raises(ModelConversionError, match=r"up_proj\.weight_scale.*quantizing made"):
        load(path, quantization_config=KernelpickConfig())


def test_a_huge_block_size_quantizes_as_one_block(tmp_path: Path) -> None:
    """A block wider than the weight is one block: quantized as such, never padded out to
    the block's size (2**70 overflowed torch's pad; 2**40 asked for 256 TiB)."""
    path = llama_dir(tmp_path)
    reference = logits(load(path))
    model = load(path, quantization_config=KernelpickConfig("fp8_block", block_size=2**70))
    scale = model.model.layers[0].mlp.down_proj.weight_scale
    assert tuple(scale.shape) == (1, 1)
    error = torch.linalg.norm(logits(model) - reference) / torch.linalg.norm(reference)
    assert float(error) < FP8_BOUND


# -- save and reload -----------------------------------------------------------------------


def test_save_writes_compressed_tensors_which_stock_transformers_loads(tmp_path: Path) -> None:
    """One format from every save path: compressed-tensors', which transformers' own
    compressed-tensors support loads as the quantized model (no kernelpick kernel runs),
    and load_quantized loads into kernelpick's layers byte for byte."""
    out, model = saved(tmp_path)
    written = json.loads((out / "config.json").read_text())["quantization_config"]
    assert written == quantization_config(model)
    assert written["quant_method"] == "compressed-tensors"
    assert written["ignore"] == ["lm_head"]
    stored = load_file(out / "model.safetensors")
    assert stored["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.layers.0.self_attn.q_proj.weight_scale"].dtype == torch.float32
    stock = load(out)
    assert type(stock.hf_quantizer).__name__ == "CompressedTensorsHfQuantizer"
    assert not linears(stock, QuantizedLinear)
    error = torch.linalg.norm(logits(stock) - logits(model)) / torch.linalg.norm(logits(model))
    assert float(error) < 1e-5  # the same FP8 weights and per-token activations
    skeleton = LlamaForCausalLM(AutoConfig.from_pretrained(out))
    load_quantized(skeleton, out, kp.probe("cpu"), kp.Policy())
    assert torch.equal(logits(skeleton), logits(model))
    for key, value in model.state_dict().items():
        other = skeleton.state_dict()[key]
        assert other.dtype == value.dtype
        assert torch.equal(other.view(torch.uint8), value.view(torch.uint8)), key


def test_a_format_version_1_checkpoint_still_loads_pre_quantized(tmp_path: Path) -> None:
    out, model = saved(tmp_path)
    again = load(as_format_v1(out))
    assert again.hf_quantizer.pre_quantized
    assert linears(again, torch.nn.Linear) == ["lm_head"]
    assert torch.equal(logits(again), logits(model))
    again.save_pretrained(tmp_path / "resaved")  # saved again: compressed-tensors, as always
    written = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert written["quantization_config"] == quantization_config(model)


def test_a_missing_quantized_tensor_is_refused(tmp_path: Path) -> None:
    out, _ = saved(tmp_path)
    tensors = load_file(out / "model.safetensors")
    del tensors["model.layers.1.self_attn.o_proj.weight_scale"]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelConversionError, match=r"o_proj\.weight_scale"):
        load(as_format_v1(out))


def test_quantized_bytes_for_a_high_precision_module_are_refused(tmp_path: Path) -> None:
    # Saved with every linear quantized, reloaded keeping the MLP: transformers would cast
    # the FP8 bytes into fp32 linears without their scales.
    out, _ = saved(tmp_path)
    v1 = as_format_v1(out, KernelpickConfig(modules_to_not_convert=["lm_head", "up_proj"]))
    with pytest.raises(CheckpointError, match=r"mlp\.up_proj\.weight"):
        load(v1)


def _edit(out: Path, key: str, change: Any) -> None:
    tensors = load_file(out / "model.safetensors")
    tensors[key] = change(tensors[key]).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


LAYER = "model.layers.0.mlp.down_proj"
RESHAPED: list[tuple[str, str, Any, str]] = [
    ("weight_scale", "transposed", lambda t: t.reshape(1, -1), r"weight_scale.*\[128, 1\]"),
    ("weight_scale", "half", lambda t: t[:64], r"weight_scale.*\[128, 1\]"),
    ("weight", "transposed", lambda t: t.t(), r"down_proj\.weight.*\[128, 192\]"),
    ("weight", "a row short", lambda t: t[:-1], r"down_proj\.weight.*\[128, 192\]"),
]


@pytest.mark.parametrize(("name", "how", "change", "named"), RESHAPED)
def test_a_reshaped_tensor_is_kernelpicks_refusal_not_transformers(
    tmp_path: Path, name: str, how: str, change: Any, named: str
) -> None:
    """transformers compares each tensor with its placeholder before kernelpick sees it,
    and raises "ignore_mismatched_sizes": the shapes are kernelpick's to check."""
    out, _ = saved(tmp_path)
    _edit(out, f"{LAYER}.{name}", change)
    with pytest.raises(ModelConversionError, match=named) as caught:
        load(as_format_v1(out))
    assert [failed for failed, _ in caught.value.failures] == [LAYER], how


def test_a_scale_stored_flat_loads_as_load_quantized_reads_it(tmp_path: Path) -> None:
    out, model = saved(tmp_path)
    _edit(out, f"{LAYER}.weight_scale", lambda t: t.reshape(-1))  # [N]: load_quantized's too
    again = load(as_format_v1(out))
    assert torch.equal(logits(again), logits(model))
    assert tuple(again.get_submodule(LAYER).weight_scale.shape) == (128, 1)


def test_an_edited_scheme_is_refused_by_kernelpick(tmp_path: Path) -> None:
    out, _ = saved(tmp_path)  # per-channel scales, read as per-tensor ones
    with pytest.raises(ModelConversionError, match=r"weight_scale.*\[1\]"):
        load(as_format_v1(out, KernelpickConfig("fp8_per_tensor")))


# -- all-MiniLM-L6-v2 ----------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_quantize_save_and_reload_in_a_fresh_process(tmp_path: Path) -> None:
    """A fresh process with no kernelpick import loads what save_pretrained wrote, through
    transformers' compressed-tensors support, to the quantized model's embeddings; one that
    imports kernelpick reads a format-1 checkpoint of the same tensors bit for bit."""
    embed = embed_function()
    reference = embed(AutoModel.from_pretrained(minilm()))
    model = AutoModel.from_pretrained(minilm(), quantization_config=KernelpickConfig())
    assert len(linears(model, QuantizedLinear)) == 37
    assert not linears(model, torch.nn.Linear)
    quantized = embed(model)
    cosine = torch.nn.functional.cosine_similarity(quantized, reference)
    assert float(cosine.min()) >= 0.99, cosine
    out = tmp_path / "minilm-kernelpick"
    model.save_pretrained(out)
    stock = EMBED + textwrap.dedent(
        """
        from safetensors.torch import save_file
        model = AutoModel.from_pretrained(sys.argv[1])
        assert "kernelpick" not in sys.modules
        save_file({"embeddings": embed(model).contiguous()}, sys.argv[2])
        """
    )
    result = tmp_path / "stock.safetensors"
    subprocess.run(
        [sys.executable, "-c", stock, str(out), str(result)], check=True, cwd=ROOT, timeout=300
    )
    fresh = load_file(result)["embeddings"]
    # transformers decompresses and runs its own FP8 activation path: near, not equal.
    assert float(torch.nn.functional.cosine_similarity(fresh, quantized).min()) >= 0.999
    assert float(torch.nn.functional.cosine_similarity(fresh, reference).min()) >= 0.99
    state = {k: v.contiguous().view(torch.uint8) for k, v in model.state_dict().items()}
    script = EMBED + textwrap.dedent(
        """
        import kernelpick.engines.transformers  # registers "kernelpick" before loading
        from safetensors.torch import save_file
        model = AutoModel.from_pretrained(sys.argv[1])
        assert model.hf_quantizer.pre_quantized, "not the pre-quantized path"
        state = {k: v.contiguous().view(torch.uint8) for k, v in model.state_dict().items()}
        state["__embeddings__"] = embed(model).contiguous().view(torch.uint8)
        save_file(state, sys.argv[2])
        """
    )
    result = tmp_path / "fresh.safetensors"
    subprocess.run(
        [sys.executable, "-c", script, str(as_format_v1(out)), str(result)], check=True,
        cwd=ROOT, timeout=300,
    )  # fmt: skip
    fresh_state = load_file(result)
    assert torch.equal(fresh_state.pop("__embeddings__"), quantized.contiguous().view(torch.uint8))
    assert fresh_state.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(fresh_state[key], value), key


@pytest.mark.parametrize(
    ("scheme", "dtype"),
    [
        ("fp8_per_tensor", torch.float32),
        ("fp8_weight_only", torch.float32),
        ("fp8_block", torch.float32),
        ("int8_per_channel", torch.float32),
        ("mxfp8", torch.float32),
        ("fp8_per_channel", torch.bfloat16),
    ],
)
def test_every_online_scheme_saves_and_reloads(
    tmp_path: Path, scheme: str, dtype: torch.dtype
) -> None:
    path = llama_dir(tmp_path)
    reference = logits(load(path, dtype=dtype)).float()
    model = load(path, dtype=dtype, quantization_config=KernelpickConfig(scheme))
    stored = torch.int8 if scheme == "int8_per_channel" else torch.float8_e4m3fn
    assert model.model.layers[0].mlp.gate_proj.weight.dtype == stored
    got = logits(model).float()
    assert float(torch.linalg.norm(got - reference) / torch.linalg.norm(reference)) < FP8_BOUND
    out = tmp_path / "quantized"
    model.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["quantization_config"] == (
        quantization_config(model)
    )
    if scheme == "mxfp8":  # E8M0 scales as their bytes, as compressed-tensors reads them
        assert load_file(out / "model.safetensors")[f"{GATE}.weight_scale"].dtype == torch.uint8
    for again in (load(as_format_v1(out, KernelpickConfig(scheme)), dtype=dtype),
                  _load_quantized(out, dtype)):  # fmt: skip
        assert again.model.layers[0].mlp.gate_proj.kernelpick_decision == (
            model.model.layers[0].mlp.gate_proj.kernelpick_decision
        )
        assert torch.equal(logits(again), logits(model))


def _load_quantized(out: Path, dtype: torch.dtype) -> Any:
    config = AutoConfig.from_pretrained(out)
    skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    load_quantized(skeleton, out, kp.probe("cpu"), kp.Policy())
    return skeleton


def test_a_head_tied_to_the_embedding_stays_high_precision(tmp_path: Path) -> None:
    # tests/support/tiny_llama.py's model ties lm_head to embed_tokens, which stays high precision
    llama(seed=0).save_pretrained(tmp_path / "tied")
    model = load(tmp_path / "tied", quantization_config=KernelpickConfig(modules_to_not_convert=[]))
    assert linears(model, torch.nn.Linear) == ["lm_head"]
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_bad_value_set_after_the_config_was_made_is_refused() -> None:
    config = KernelpickConfig()
    config.scheme = "fp8_per_tensor_static"  # as transformers' update() sets it: no __init__
    with pytest.raises(kp.InvalidValueError, match="fp8_per_tensor_static"):
        KernelpickHfQuantizer(config, pre_quantized=False)


@pytest.mark.slow
def test_without_kernelpick_what_save_pretrained_wrote_loads_quantized(tmp_path: Path) -> None:
    """Where kernelpick is not imported, stock transformers loads the checkpoint through its
    compressed-tensors support, to the quantized model's logits. A format-1 checkpoint
    (``quant_method`` "kernelpick", which kernelpick no longer writes) is why: there,
    transformers only warns about the unknown method and casts the FP8 bytes into plain
    linears with no scales. If that half starts failing, transformers refuses by itself."""
    out, model = saved(tmp_path)
    torch.save(logits(model), tmp_path / "expected.pt")
    script = textwrap.dedent(
        """
        import sys, torch
        from transformers import AutoModelForCausalLM
        IDS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
        assert "kernelpick" not in sys.modules
        linear = model.model.layers[0].mlp.gate_proj
        with torch.no_grad():
            got = model(IDS).logits
        expected = torch.load(sys.argv[2])
        print(type(linear).__name__, float((got - expected).norm() / expected.norm()))
        """
    )

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, str(path), str(tmp_path / "expected.pt")],
            capture_output=True, text=True, cwd=ROOT, timeout=300, check=True,
        )  # fmt: skip

    kind, error = run(out).stdout.split()
    assert kind == "Linear"  # transformers' own layer, its weights decompressed
    assert float(error) < 1e-5
    legacy = run(as_format_v1(out))
    assert float(legacy.stdout.split()[1]) > 0.5  # silently wrong
    assert "kernelpick" in legacy.stderr  # the only sign: a warning naming the unknown method


@pytest.mark.parametrize("attribute", ["_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"])
def test_modules_the_model_keeps_in_fp32_are_not_quantized(tmp_path: Path, attribute: str) -> None:
    # transformers loads these in fp32 whatever dtype the model gets, apart from kernelpick.
    path = llama_dir(tmp_path)
    keeps: Any = type("KeepsUp", (LlamaForCausalLM,), {attribute: ["up_proj"]})
    model = keeps.from_pretrained(
        path, dtype=torch.bfloat16, quantization_config=KernelpickConfig(caps=kp.probe("cpu"))
    )
    up = model.model.layers[0].mlp.up_proj
    assert type(up) is torch.nn.Linear
    assert type(model.model.layers[0].mlp.gate_proj) is QuantizedLinear


@pytest.mark.parametrize(
    ("scheme", "group_size", "symmetric"),
    [("int4_weight_only", 64, True), ("int4_weight_only", 32, False),
     ("int8_weight_only", None, True)],
)  # fmt: skip
def test_integer_schemes_quantize_on_load_as_quantize_model_does_and_save_pack_quantized(
    tmp_path: Path, scheme: str, group_size: int | None, symmetric: bool
) -> None:
    from kernelpick.integration import quantize_model

    path = llama_dir(tmp_path)
    config = KernelpickConfig(scheme, group_size=group_size, symmetric=symmetric)
    model = load(path, quantization_config=config)
    gate = model.model.layers[0].mlp.gate_proj
    expected = {"weight_packed", "weight_scale"} | (set() if symmetric else {"weight_zero_point"})
    assert {name for name, _ in gate.named_parameters()} == expected
    converted = load(path)
    quantize_model(converted, scheme, kp.probe("cpu"), kp.Policy(), lambda n, _: n == "lm_head",
                   group_size=group_size, symmetric=symmetric)  # fmt: skip
    assert torch.equal(logits(model), logits(converted))  # one quantizer, one kernel
    out = tmp_path / "quantized"
    model.save_pretrained(out)
    written = json.loads((out / "config.json").read_text())["quantization_config"]
    assert written == quantization_config(model)
    assert written["format"] == "pack-quantized"
    stored = load_file(out / "model.safetensors")
    assert stored[f"{GATE}.weight_shape"].tolist() == [192, 128]
    assert f"{GATE}.weight" not in stored
    skeleton = LlamaForCausalLM(AutoConfig.from_pretrained(out))
    load_quantized(skeleton, out, kp.probe("cpu"), kp.Policy())
    assert torch.equal(logits(skeleton), logits(model))
    if not symmetric:  # transformers 5.25 with compressed-tensors 0.20.1 sizes an asymmetric
        return  # layer's zero points unpacked, and refuses compressed-tensors' own checkpoints
    stock = load(out)  # transformers' own compressed-tensors support: dequantized weights
    assert type(stock.hf_quantizer).__name__ == "CompressedTensorsHfQuantizer"
    error = torch.linalg.norm(logits(stock) - logits(model)) / torch.linalg.norm(logits(model))
    assert float(error) < 1e-2  # the same weights; torch's int4 op computes in bf16


def test_a_pack_quantized_checkpoint_is_refused_for_quantize_on_load(tmp_path: Path) -> None:
    path = llama_dir(tmp_path)
    model = load(path, quantization_config=KernelpickConfig("int4_weight_only", group_size=64))
    out = tmp_path / "quantized"
    model.save_pretrained(out)
    written = json.loads((out / "config.json").read_text())
    del written["quantization_config"]  # as if the weights were a high-precision checkpoint
    (out / "config.json").write_text(json.dumps(written))
    with pytest.raises(CheckpointError, match="quantized already"):
        load(out, quantization_config=KernelpickConfig("int4_weight_only"))
