"""End to end on a real model: all-MiniLM-L6-v2 quantized on this CPU keeps its embeddings.

Runs the flow of examples/quantize_minilm.py (the ``e2e`` extra, which ``make test``
installs, ships the model so it loads offline).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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
    result = example.run(repeats=3)
    report = result.report
    print(report.render())
    ratio = report.weight_bytes_after / report.weight_bytes_before
    record_property("mean_cosine", result.mean_cosine)
    record_property("weight_bytes", (report.weight_bytes_before, report.weight_bytes_after))
    record_property("seconds_per_batch", (result.seconds_fp32, result.seconds_fp8))
    print(
        f"mean cosine {result.mean_cosine:.4f}; weights {ratio:.2f}x; per batch "
        f"fp32 {result.seconds_fp32 * 1e3:.1f} ms, fp8 {result.seconds_fp8 * 1e3:.1f} ms"
    )
    assert result.mean_cosine >= 0.99
    assert len(report.layers) == 37  # 6 layers x 6 linears, and the pooler
    assert {layer.kernel for layer in report.layers} == {"cpu_rowwise_scaled_mm"}
    # FP8 weight plus one fp32 scale per output channel, against fp32 weights.
    assert ratio < 0.26
