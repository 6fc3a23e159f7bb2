"""The fixture configs of real models (tests/fixtures/configs/<name>/config.json, sizes from
their public releases, no weights) and small configs written for one test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
FIXTURES = sorted(path.name for path in CONFIGS.iterdir() if (path / "config.json").is_file())


def fixture_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return data


def small_llama(**changes: Any) -> dict[str, Any]:
    """A two-layer Llama config, quick to build on the meta device."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 1000, "torch_dtype": "bfloat16", **changes,
    }  # fmt: skip


def small_qwen3_moe(**changes: Any) -> dict[str, Any]:
    """A two-layer Qwen3-MoE config of four experts, every layer an MoE block."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 2, "num_experts": 4,
        "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 1000, "torch_dtype": "bfloat16", **changes,
    }  # fmt: skip


def small_gpt2(**changes: Any) -> dict[str, Any]:
    """A two-layer GPT-2, whose linears are transformers' Conv1D (weights stored K x N)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4,
        "n_layer": 2, "n_positions": 128, "vocab_size": 100, "torch_dtype": "float16",
        **changes,
    }  # fmt: skip


def small_llava(**changes: Any) -> dict[str, Any]:
    """A LLaVA of one layer each: a Llama with 2 KV heads for 4 heads, a CLIP vision tower
    of 4 heads (no KV heads of its own)."""
    return {
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "torch_dtype": "bfloat16",
        "text_config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                        "num_attention_heads": 4, "num_key_value_heads": 2,
                        "num_hidden_layers": 1, "vocab_size": 1000},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 64,
                          "intermediate_size": 128, "num_attention_heads": 4,
                          "num_hidden_layers": 1, "image_size": 28, "patch_size": 14},
        **changes,
    }  # fmt: skip


def write_config(folder: Path, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(data))
    return path
