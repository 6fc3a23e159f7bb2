"""What the example tables of the core values share: the names a lookup lists, a stand-in
for a torch dtype, and configs no named scheme makes."""

from __future__ import annotations

import kernelpick as kp
from kernelpick.core import Dtype, GroupShape, QuantKey, ScaleSpec

__all__ = ["DTYPE_NAMES", "PROFILE_NAMES", "TorchLike", "static_per_token_config"]

DTYPE_NAMES = [d.value for d in Dtype]
PROFILE_NAMES = list(kp.device_profiles())


class TorchLike:
    """Stands in for a torch dtype: only its ``str`` is ``torch.<name>``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def static_per_token_config() -> kp.QuantConfig:
    """FP8 W8A8 with a stored per-token activation scale: no kernel takes one."""
    fp8 = Dtype.FLOAT8_E4M3FN
    return kp.QuantConfig(
        weight=QuantKey(fp8, ScaleSpec(GroupShape.PER_CHANNEL, static=True)),
        activation=QuantKey(fp8, ScaleSpec(GroupShape.PER_TOKEN, static=True)),
        weight_shape=(16, 16),
        input_dtype=Dtype.BFLOAT16,
        out_dtype=Dtype.BFLOAT16,
    )
