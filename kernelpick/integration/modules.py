"""``Fp8Linear``: the module ``quantize_model`` puts where an ``nn.Linear`` was."""

from __future__ import annotations

import torch

from kernelpick.integration.method import Fp8OnlineLinearMethod, layer_state

__all__ = ["Fp8Linear"]


class Fp8Linear(torch.nn.Module):
    """A linear layer whose FP8 weight runs on the kernel kernelpick chose for it.

    It holds ``weight`` (FP8, in the kernel's layout), ``weight_scale`` and ``bias``, and
    forwards through its method's ``apply``. ``kernelpick_decision`` records the choice.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        method: Fp8OnlineLinearMethod,
        bias: torch.nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.method = method
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        decision = layer_state(self).decision
        flag = " (degraded)" if decision.degraded else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, kernel={decision.kernel}{flag}"
        )
