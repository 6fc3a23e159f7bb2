"""compressed-tensors' ``targets`` and ``ignore``: which modules a config group names (a
module name, ``re:`` and a regex, or a class in the module's MRO), the regexes checked
when the config is read."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kernelpick.integration._errors import CheckpointError
from kernelpick.integration.formats._patterns import ct_matches, ct_refusal

__all__ = ["check_regexes", "matches", "strings"]


def check_regexes(where: str, key: str, patterns: list[str]) -> None:
    """Each ``re:`` pattern compiled now, as ``matches`` will match it: one that cannot be
    is a ``CheckpointError`` when the config is read, not a ``re.error`` at some layer."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            refusal = ct_refusal(pattern.removeprefix("re:"))
            if refusal is not None:
                expected = f"a name, a class, or re: and a regex both re and RE2 read: {refusal}"
                raise CheckpointError(where, key, repr(pattern), expected)


def strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def matches(name: str, module: torch.nn.Module | None, patterns: Iterable[str]) -> bool:
    """compressed-tensors' rule: a pattern is a module name, ``re:`` and a regular
    expression matched from the start of the name (by RE2, in linear time: see
    ``_patterns``), or a class name in the module's MRO (``Linear`` also matching vLLM's
    ``LinearBase``; no class for ``module`` None, a name read from a file header)."""
    classes = set() if module is None else {cls.__name__ for cls in type(module).__mro__}
    if "LinearBase" in classes:
        classes.add("Linear")
    for pattern in patterns:
        if pattern.startswith("re:"):
            if ct_matches(name, pattern.removeprefix("re:")):
                return True
        elif pattern == name or pattern in classes:
            return True
    return False
