"""CPU launch glue: which kernel family runs each ``cpu_*`` catalog id."""

from __future__ import annotations

from collections.abc import Mapping

from kernelpick.adapters._launcher import Launcher
from kernelpick.kernels._reference import ReferenceW8A8, ReferenceW8A16
from kernelpick.kernels._scaled_mm import RowwiseScaledMM, TensorwiseScaledMM

__all__ = ["LAUNCHERS"]

# CPU _scaled_mm runs any shape, but torch.compile's fake-tensor check demands K, N % 16
# (design §4); it takes a bias in every output dtype.
LAUNCHERS: Mapping[str, Launcher] = {
    "cpu_rowwise_scaled_mm": Launcher(RowwiseScaledMM, alignment=16),
    "cpu_tensorwise_scaled_mm": Launcher(TensorwiseScaledMM, alignment=16),
    "cpu_dequant_reference": Launcher(ReferenceW8A8),
    "cpu_w8a16_reference": Launcher(ReferenceW8A16),
}
