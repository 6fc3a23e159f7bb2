"""The integration's errors, in the one hierarchy rooted at ``kp.KernelpickError``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelpick.core.decision import Rejected
from kernelpick.core.errors import KernelpickError

__all__ = ["KernelSelectionError", "ModelConversionError"]


class KernelSelectionError(KernelpickError):
    """No kernel can implement a layer's quantization on the device; raised before any
    weight is allocated (design §1, behaviour 4).

    The message is ``quantization="<scheme>": `` then the layer (when named) and the full
    Reasons list; ``rejected`` is the decision itself, ``layer`` the layer's prefix.
    """

    def __init__(self, scheme: str, rejected: Rejected, layer: str = "") -> None:
        self.scheme = scheme
        self.rejected = rejected
        self.layer = layer
        where = f"layer {layer!r}: " if layer else ""
        super().__init__(f'quantization="{scheme}": {where}{rejected.render()}')

    def __reduce__(self) -> tuple[type[KernelSelectionError], tuple[str, Rejected, str]]:
        return (type(self), (self.scheme, self.rejected, self.layer))


class ModelConversionError(KernelpickError):
    """``quantize_model`` found layers it cannot convert; the model was left untouched.

    ``failures`` pairs each layer's name with the error that explains it.
    """

    def __init__(self, failures: Sequence[tuple[str, KernelpickError]]) -> None:
        self.failures = tuple(failures)
        lines = [f"{name}: {error}" for name, error in self.failures]
        count = len(self.failures)
        super().__init__(
            f"cannot quantize the model; nothing was changed. {count} layer(s) failed:\n"
            + "\n".join(lines)
        )

    def __reduce__(
        self,
    ) -> tuple[type[ModelConversionError], tuple[tuple[tuple[str, KernelpickError], ...]]]:
        return (type(self), (self.failures,))
