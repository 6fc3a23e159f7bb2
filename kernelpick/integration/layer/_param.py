"""A parameter a layer registers, as data: what a plan lists and an engine allocates."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

__all__ = ["Param"]


def _plain(dims: Mapping[str, int]) -> dict[str, int]:
    return dict(dims)  # a plain dict: a model holding it can still be deep-copied


@attrs.frozen
class Param:
    """A parameter a layer registers before any weight loads."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    dims: Mapping[str, int] = attrs.field(factory=dict, converter=_plain)
