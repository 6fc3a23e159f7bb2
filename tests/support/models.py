"""Small models the integration tests convert: linears in a few distinct shapes, repeated."""

from __future__ import annotations

import torch

__all__ = ["SHAPES", "linears"]

# (in, out) of each distinct layer: a model of ``copies`` blocks has len(SHAPES) configs.
SHAPES = ((64, 128), (128, 64), (64, 32))


def linears(copies: int, seed: int = 0) -> torch.nn.ModuleDict:
    """``copies`` blocks of one ``nn.Linear`` per shape of ``SHAPES``, seeded."""
    torch.manual_seed(seed)
    return torch.nn.ModuleDict(
        {
            f"b{j}_{i}": torch.nn.Linear(k, n)
            for j in range(copies)
            for i, (k, n) in enumerate(SHAPES)
        }
    )
