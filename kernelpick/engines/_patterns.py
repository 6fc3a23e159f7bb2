"""Which layers a ``modules_to_not_convert`` list keeps in high precision: one rule for
both engines, so that a checkpoint one writes the other reads the same way.

The rule is transformers' (``should_convert_module``), as its users write these lists: a
pattern keeps a layer when it matches the layer's name from the start up to a module
boundary (``"model.layers.1"`` keeps ``model.layers.1.mlp.up_proj``, not
``model.layers.11.mlp.up_proj``), as a regex with the same boundary (``"model.layers.*"``),
or as a suffix of the name (``"down_proj"``). ``"mlp"`` alone keeps nothing inside the
layers: it is neither a prefix nor a suffix of their names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kernelpick.core._errors import InvalidValueError

__all__ = ["check_patterns", "kept"]

# A match ends where a module name does: after a dot, before one, or at the end.
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


def kept(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``patterns`` keep the layer called ``name`` in high precision."""
    return any(
        re.match(rf"(?:{pattern}){_BOUNDARY}", name) or name.endswith(pattern)
        for pattern in patterns
    )


def check_patterns(patterns: object) -> tuple[str, ...]:
    """``patterns`` as a tuple of non-empty strings, each a valid regex; or
    ``InvalidValueError`` naming the first that is not."""
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
        expected = "a list of module names or patterns (non-empty strings)"
        raise InvalidValueError("modules_to_not_convert", patterns, expected)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            expected = "module names or patterns: non-empty strings"
            raise InvalidValueError("modules_to_not_convert entry", pattern, expected)
        try:
            re.compile(rf"(?:{pattern}){_BOUNDARY}")  # as kept() matches it
        except re.error as error:
            expected = f"a name, a suffix or a regex ({error})"
            raise InvalidValueError("modules_to_not_convert entry", pattern, expected) from None
    return tuple(patterns)
