"""Putting a converted module where a linear was, keeping what the model had on it, and
undoing a set of such swaps as one."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping

import torch

__all__ = ["Swaps", "dropped_by_swap", "model_bytes"]

# Every hook a module can hold. The new module shares the old one's dictionaries, so a
# hook still fires and a handle registered on the old module still removes it.
_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _rebind(hooks: Mapping[int, object], module: torch.nn.Module) -> None:
    """Point the hooks that torch calls with their module (``load_state_dict`` pre-hooks
    registered publicly hold it weakly) at ``module``."""
    for hook in hooks.values():
        if getattr(hook, "with_module", False):
            hook.module = weakref.ref(module)  # type: ignore[attr-defined]


def _adopt(new: torch.nn.Module, old: torch.nn.Module) -> None:
    for name in _HOOK_DICTS:
        if name in old.__dict__:
            new.__dict__[name] = old.__dict__[name]
    _rebind(old._load_state_dict_pre_hooks, new)
    new.train(old.training)


class Swaps:
    """Replacements of modules, parameters and buffers in ``model`` that ``undo`` reverts
    together, newest first."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._undo: list[Callable[[], None]] = []

    def _put(self, entries: dict[str, object], key: str, new: object) -> None:
        old = entries[key]
        self._undo.append(lambda: entries.__setitem__(key, old))
        entries[key] = new

    def replace(self, path: str, new: torch.nn.Module) -> None:
        """Put ``new`` at ``path`` with the hooks and mode of the module there."""
        parent_name, _, child = path.rpartition(".")
        parent = self._model.get_submodule(parent_name)
        old = parent.get_submodule(child)
        self._undo.append(lambda: _rebind(old._load_state_dict_pre_hooks, old))
        _adopt(new, old)
        self._put(parent._modules, child, new)  # type: ignore[arg-type]

    def set_tensor(self, module: torch.nn.Module, name: str, new: torch.Tensor) -> None:
        """Make ``new`` the parameter or buffer ``name`` of ``module``."""
        entries = module._parameters if name in module._parameters else module._buffers
        self._put(entries, name, new)  # type: ignore[arg-type]

    def undo(self) -> None:
        """Put back everything replaced so far."""
        while self._undo:
            self._undo.pop()()


def dropped_by_swap(linear: torch.nn.Module) -> list[str]:
    """What a linear holds besides ``weight`` and ``bias`` (other parameters, buffers,
    child modules): a swap for an ``QuantizedLinear`` would lose it."""
    names = [n for n in linear._parameters if n not in ("weight", "bias")]
    return names + list(linear._buffers) + list(linear._modules)


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes a model's parameters and buffers hold, each storage counted once: tied
    and shared tensors are one allocation, and so are views of one tensor. A tensor on the
    meta device (a skeleton) counts at the size it would take."""
    seen: set[tuple[torch.device, int]] = set()
    total = 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_meta:  # no storage to share: one count per tensor (a tie is one)
            key = (tensor.device, id(tensor))
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
            continue
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total
