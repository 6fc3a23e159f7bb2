"""The torch quantizers divide exactly on every device (docs/design.md#quantization-numerics).

CUDA torch computes ``tensor / python_number`` (and a division by a CPU 0-dim tensor) as
``tensor * reciprocal(number)`` (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), while
the CPU and the cupy quantizer divide exactly. Without a GPU these tests check it two ways:
by emulating that rule on the CPU, and by recording every division the quantizers make on
a device that is not the CPU (the meta device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kernelpick.core import Dtype
from kernelpick.kernels._quantize import (
    quantize,
    quantize_in_chunks,
    quantize_per_tensor,
    quantize_per_token,
)

FN = Dtype.FLOAT8_E4M3FN
_DIVISIONS = {
    torch.Tensor.__truediv__,
    torch.Tensor.__itruediv__,
    torch.Tensor.div,
    torch.Tensor.div_,
    torch.div,
    torch.true_divide,
}
Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
QUANTIZERS: dict[str, Quantizer] = {
    "per token": lambda x: quantize_per_token(x, FN),
    "per tensor": lambda x: quantize_per_tensor(x, FN),
    "1x128 groups": lambda x: quantize(x, (1, 128), FN),
    "128x128 blocks": lambda x: quantize(x, (128, 128), FN),
    "weight per channel, in chunks": lambda x: quantize_in_chunks(x, (1, -1), FN, chunk_rows=8),
    "weight blocks, in chunks": lambda x: quantize_in_chunks(x, (128, 128), FN, chunk_rows=128),
}


class _CudaDivisionRule(TorchFunctionMode):
    """Divides as CUDA torch does: a Python-number divisor becomes a multiplication by its
    fp32 reciprocal."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _DIVISIONS and len(args) == 2 and isinstance(args[1], (int, float)):
            reciprocal = torch.tensor(1.0, dtype=torch.float32) / args[1]
            if func in (torch.Tensor.__itruediv__, torch.Tensor.div_):
                return args[0].mul_(reciprocal)
            return args[0] * reciprocal
        return func(*args, **kwargs)


class _DivisorsOffTheDevice(TorchFunctionMode):
    """Records each division of a tensor off the CPU by a Python number or a CPU tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _DIVISIONS and len(args) == 2 and isinstance(args[0], torch.Tensor):
            data, divisor = args
            on_cpu = not isinstance(divisor, torch.Tensor) or divisor.device.type == "cpu"
            if data.device.type != "cpu" and on_cpu:
                self.found.append(f"{func.__name__}({data.device} data, {divisor!r})")
        return func(*args, **kwargs)


def test_the_cuda_rule_changes_scales_so_it_matters() -> None:
    amax = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 20
    exact = amax / torch.tensor(448.0)
    with _CudaDivisionRule():
        by_reciprocal = amax / 448.0
    assert (exact != by_reciprocal).float().mean() > 0.1


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_quantizers_give_the_same_bytes_under_cudas_division_rule(name: str) -> None:
    x = torch.randn(256, 384, generator=torch.Generator().manual_seed(1)) * 3
    q, scale = QUANTIZERS[name](x)
    with _CudaDivisionRule():
        q_cuda, scale_cuda = QUANTIZERS[name](x)
    assert torch.equal(scale, scale_cuda)
    assert torch.equal(q.view(torch.uint8), q_cuda.view(torch.uint8))


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_off_the_cpu_every_divisor_is_on_the_datas_device(name: str) -> None:
    x = torch.empty(256, 384, device="meta")
    recorder = _DivisorsOffTheDevice()
    with recorder:
        QUANTIZERS[name](x)
    assert recorder.found == []
