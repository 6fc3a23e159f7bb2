"""A model's structure and every weight byte, to show a failed conversion changed nothing."""

from __future__ import annotations

import torch

Snapshot = tuple[list[tuple[str, type, int]], dict[str, bytes]]


def snapshot(model: torch.nn.Module) -> Snapshot:
    """Each module's name, type and identity, and each state tensor's bytes."""
    modules = [(name, type(module), id(module)) for name, module in model.named_modules()]
    weights = {
        name: tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        for name, tensor in model.state_dict().items()
    }
    return modules, weights
