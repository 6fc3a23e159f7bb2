"""What the example tables of the core values share: the names a lookup lists, and a
stand-in for a torch dtype."""

from __future__ import annotations

import kernelpick as kp
from kernelpick.core import Dtype

__all__ = ["DTYPE_NAMES", "PROFILE_NAMES", "TorchLike"]

DTYPE_NAMES = [d.value for d in Dtype]
PROFILE_NAMES = list(kp.device_profiles())


class TorchLike:
    """Stands in for a torch dtype: only its ``str`` is ``torch.<name>``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text
