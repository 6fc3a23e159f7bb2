"""A small Llama from transformers for the block-FP8 and int8 checkpoint tests.

Its linears have the shapes block scales find hard: ``k_proj`` and ``v_proj`` have
N = 64 (half a 128-row block), and with ``intermediate=192`` the MLP has N = 192
(``gate_proj``, ``up_proj``) and K = 192 (``down_proj``), one and a half blocks. The
head is tied to the embedding, as deployed FP8 checkpoints are quantized: every Linear
but ``lm_head``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kernelpick as kp
from kernelpick.integration import load_quantized
from tests.support.snapshots import snapshot

__all__ = [
    "FP8_BOUND",
    "IDS",
    "INT8_BOUND",
    "config",
    "edit_config",
    "llama",
    "logits",
    "refused_and_unchanged",
]

# How far a quantized model's logits may be from the high-precision model's (relative
# Frobenius error). e4m3 keeps 3 mantissa bits: rounding moves a value by at most 2^-4 of
# itself, about 3% RMS; a linear rounds both its operands, about 4-5% at its output, and
# the residual stream carries earlier layers' errors forward (5-6% measured on this model
# for per-channel and block FP8 alike). 0.1 is under the 2 x 2^-4 = 0.125 one linear may
# reach at worst, while a misread scale (its reciprocal, another block's, none) errs by
# O(1). int8 rounds to a step of amax / 127: for rows of random weights (amax ~ 3.5
# sigma) that is about 0.8% RMS per operand, 1.4% measured at the logits; 0.03 is twice it.
FP8_BOUND = 0.1
INT8_BOUND = 0.03

IDS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))


def config(intermediate: int = 192) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip


def llama(
    seed: int, intermediate: int = 192, dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config(intermediate))
    model.train(False)
    torch.nn.Module.to(model, dtype)  # transformers' own to() is typed for no dtype
    return model


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids).logits
    return out


def edit_config(path: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """The checkpoint's ``config.json`` at ``path``, changed in place by ``edit``."""
    file = path / "config.json"
    loaded = json.loads(file.read_text())
    edit(loaded)
    file.write_text(json.dumps(loaded))


def refused_and_unchanged(
    path: Path, named: str, error: type[kp.KernelpickError] = kp.KernelpickError
) -> kp.KernelpickError:
    """Loading the checkpoint at ``path`` into a fresh skeleton raises ``error``, whose
    message matches ``named``, and leaves the skeleton as it was; the error, for more."""
    skeleton = llama(seed=1)
    before = snapshot(skeleton)
    with pytest.raises(error, match=named) as info:
        load_quantized(skeleton, path, kp.device_profile("cpu"), kp.Policy())
    assert snapshot(skeleton) == before
    return info.value
