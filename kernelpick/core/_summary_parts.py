"""The parts of a model summary no decision covers: a layer kept in high precision
(``KeptLayer``) and the weights no kernelpick kernel runs (``UncoveredWeights``)."""

from __future__ import annotations

from typing import Any

import attrs

from kernelpick.core._dtypes import Dtype
from kernelpick.core._errors import InvalidValueError
from kernelpick.core._summary_text import collapse_names, size

__all__ = ["KeptLayer", "UncoveredWeights", "layer_names"]


def layer_names(value: object) -> tuple[str, ...]:
    """``value`` as a tuple of one or more layer names, else ``InvalidValueError``."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise InvalidValueError("layer names", value, "a tuple of layer names")
    if not value or not all(isinstance(name, str) for name in value):
        raise InvalidValueError("layer names", value, "one or more names (strings)")
    return tuple(value)


@attrs.frozen
class KeptLayer:
    """A linear layer left in high precision: its name, ``(N, K)``, dtype bytes per weight
    and why it was kept (the rule or pattern that kept it)."""

    name: str
    weight_shape: tuple[int, int]
    itemsize: int
    reason: str

    @property
    def weight_bytes(self) -> int:
        n, k = self.weight_shape
        return n * k * self.itemsize

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "weight_shape": list(self.weight_shape),
                "bytes": self.weight_bytes, "reason": self.reason}  # fmt: skip


def _dtype(value: object) -> Dtype | None:
    return None if value is None else Dtype.parse(value)


@attrs.frozen
class UncoveredWeights:
    """Weights of a model that are no linear layer kernelpick chooses for (MoE experts
    vLLM runs in FusedMoE): the modules holding them (``names``), how many elements they
    hold in the whole model (never a tensor-parallel rank's part), the ``dtype`` the
    checkpoint stores them in (None: as a pre-quantized checkpoint's quantization_config
    says, whose bytes are not counted) and why they are not covered."""

    names: tuple[str, ...] = attrs.field(converter=layer_names)
    elements: int
    dtype: Dtype | None = attrs.field(converter=_dtype)
    reason: str

    @property
    def weight_bytes(self) -> int | None:
        return None if self.dtype is None else self.elements * self.dtype.itemsize

    def render(self) -> str:
        if self.dtype is None:
            how = "stored as the checkpoint's quantization_config says: bytes not counted"
        else:
            how = f"{size(self.elements * self.dtype.itemsize)} in {self.dtype.value}"
        weights = f"{self.elements:,} weights in the whole model, {how}"
        modules = f"{len(self.names)} module(s), {collapse_names(self.names)}"
        return f"not covered: {modules} ({weights}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        dtype = None if self.dtype is None else self.dtype.value
        return {"count": len(self.names), "names": list(self.names), "elements": self.elements,
                "dtype": dtype, "bytes": self.weight_bytes, "reason": self.reason}  # fmt: skip
