"""End to end on a real model: all-MiniLM-L6-v2 quantized on this CPU keeps its embeddings,
and survives a checkpoint written here and read in a fresh process.

Runs the flow of examples/quantize_minilm.py (the ``e2e`` extra, which ``make test``
installs, ships the model so it loads offline).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

import kernelpick as kp

pytestmark = pytest.mark.slow  # about 30 s: a real model, and a fresh process

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quantize_minilm.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quantize_minilm", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_minilm_embeddings_survive_fp8_per_channel(
    record_property: Callable[[str, object], None],
) -> None:
    example = _example()
    model = example.load_model()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    weights = sum(m.weight.numel() for m in linears)
    channels = sum(m.out_features for m in linears)
    result = example.run(repeats=3)
    report = result.report
    print(report.render())
    record_property("mean_cosine", result.mean_cosine)
    record_property("model_bytes", (report.bytes_before, report.bytes_after))
    record_property("seconds_per_batch", (result.seconds_fp32, result.seconds_fp8))
    record_property("seconds_per_sentence", (result.seconds_one_fp32, result.seconds_one_fp8))
    print(
        f"mean cosine {result.mean_cosine:.4f}; model {report.bytes_before} -> "
        f"{report.bytes_after} bytes; per batch fp32 {result.seconds_fp32 * 1e3:.1f} ms, "
        f"fp8 {result.seconds_fp8 * 1e3:.1f} ms; per sentence fp32 "
        f"{result.seconds_one_fp32 * 1e3:.2f} ms, fp8 {result.seconds_one_fp8 * 1e3:.2f} ms"
    )
    assert result.mean_cosine >= 0.99
    assert result.min_cosine >= example.MIN_COSINE
    assert min(result.seconds_fp32, result.seconds_fp8) > 0  # timed, not judged
    assert min(result.seconds_one_fp32, result.seconds_one_fp8) > 0
    assert len(report.layers) == len(linears) == 37  # 6 layers x 6 linears, and the pooler
    # Whatever kernelpick selects on this CPU for each fp32 layer (with its bias) is what
    # the conversion used.
    caps = kp.probe("cpu")
    for layer in report.layers:
        config = kp.quant_config(
            "fp8_per_channel", weight_shape=layer.shape, out_dtype="float32", bias=True
        )
        decision = kp.choose(caps, config)
        assert isinstance(decision, kp.Selected)
        assert (layer.kernel, layer.degraded) == (decision.kernel, False)
    # Each fp32 weight became one FP8 byte per value and one fp32 scale per output channel.
    assert report.bytes_before - report.bytes_after == 4 * weights - (weights + 4 * channels)


def test_minilm_round_trips_through_a_checkpoint_in_a_fresh_process(tmp_path: Path) -> None:
    example = _example()
    saved = example.quantize_and_save(tmp_path / "minilm-fp8", repeats=1)
    assert (tmp_path / "minilm-fp8" / "model.safetensors").is_file()
    out = tmp_path / "loaded.safetensors"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(EXAMPLE), "--load", str(tmp_path / "minilm-fp8"),
               "--embeddings", str(out)]  # fmt: skip
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "37 quantized layer(s)" in finished.stdout
    # No long silence: each stage is said on stderr as it starts, in order.
    stages = [line for line in finished.stderr.splitlines() if line.startswith("... ")]
    assert [line.split()[1] for line in stages][:3] == ["loading", "encoding", "loading"], stages
    assert any(line.startswith("... comparing") for line in stages), stages
    loaded = load_file(str(out))
    assert torch.equal(loaded["fp8"], saved.embeddings)  # bit-identical, another process
    cosine = torch.nn.functional.cosine_similarity(loaded["fp8"], loaded["fp32"], dim=-1)
    assert float(cosine.min()) >= 0.99


def test_minilm_int4_weight_only_runs_as_its_weights_dequantized_in_fp32_do(
    record_property: Callable[[str, object], None],
) -> None:
    from kernelpick.kernels import dequantize_int, quantize_int

    example = _example()
    result = example.run(repeats=1, scheme="int4_weight_only")
    report = result.report
    record_property("int4_cosine", (result.mean_cosine, result.min_cosine))
    print(
        f"int4_weight_only: cosine mean {result.mean_cosine:.4f}, min {result.min_cosine:.4f}; "
        f"kernels {sorted({layer.kernel for layer in report.layers})}; model "
        f"{report.bytes_before} -> {report.bytes_after} bytes"
    )
    assert report.scheme == "int4_weight_only"
    assert result.min_cosine >= example.min_cosine("int4_weight_only")
    # The kernels add no error of their own: the same weights dequantized into fp32
    # linears embed the sentences as the int4 layers do.
    fake = example.load_model()
    for module in fake.modules():
        if type(module) is torch.nn.Linear:
            n, k = module.weight.shape
            config = kp.quant_config("int4_weight_only", weight_shape=(n, k), out_dtype="float32")
            packed, scale, zero = quantize_int(module.weight.detach(), config)
            module.weight.data = dequantize_int(packed, scale, zero, config)
    expected = example.embed(fake, example.SENTENCES)
    cosine = torch.nn.functional.cosine_similarity(expected, result.embeddings, dim=-1)
    assert float(cosine.min()) >= 0.9999
