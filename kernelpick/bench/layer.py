"""Measure a selected kernel against the unquantized linear it replaces, in one run.

Every figure is a ratio against a baseline timed in the same process on the same data, so
a noisy, shared machine still gives comparable numbers. ``kernelpick bench`` prints these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import attrs
import torch

from kernelpick.core.device import DeviceCaps
from kernelpick.core.dtypes import Dtype
from kernelpick.core.schemes import Scheme
from kernelpick.integration.method import Fp8OnlineLinearMethod, weight_loader_of
from kernelpick.kernels._torch import torch_dtype

__all__ = ["LayerBench", "bench_layer", "median_seconds"]


def _sync(device: torch.device) -> None:
    # GPU work is asynchronous: a timer must wait for it to finish.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of ``run`` over ``repeats`` calls, after two warm-up calls."""
    for _ in range(2):
        run()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@attrs.frozen
class LayerBench:
    """One layer: the kernel's time (activation quantization included), the unquantized
    linear's in fp32 and in the layer's dtype, and the kernel's error against fp32."""

    kernel: str
    degraded: bool
    device: str
    tokens: int
    shape: tuple[int, int]
    dtype: str
    seconds_kernel: float
    seconds_fp32: float
    seconds_native: float
    relative_error: float

    def to_dict(self) -> dict[str, object]:
        return {
            **attrs.asdict(self),
            "vs_fp32": self.seconds_kernel / self.seconds_fp32,
            "vs_native": self.seconds_kernel / self.seconds_native,
        }


def bench_layer(
    caps: DeviceCaps,
    scheme: Scheme | str,
    shape: tuple[int, int],
    dtype: Dtype | str,
    tokens: int,
    repeats: int,
    device: torch.device,
) -> LayerBench:
    """Quantize a random ``[N, K]`` layer with the kernel selected for ``caps`` and time it."""
    n, k = shape
    native = torch_dtype(Dtype.parse(dtype))
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(n, k, generator=generator) / k**0.5).to(device)
    x = torch.randn(tokens, k, generator=generator).to(device)
    method = Fp8OnlineLinearMethod(scheme, caps)
    layer = torch.nn.Module()
    with torch.device(device):  # engines allocate under the device they load onto
        method.create_weights(layer, k, [n], k, n, native, prefix="bench")
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, weight.to(native))
    method.process_weights_after_loading(layer)
    x_native, w_native = x.to(native), weight.to(native)
    with torch.inference_mode():
        exact = torch.nn.functional.linear(x, weight)
        got = method.apply(layer, x_native).float()
        error = float(torch.linalg.norm(got - exact) / torch.linalg.norm(exact))
        seconds = median_seconds(lambda: method.apply(layer, x_native), repeats, device)
        fp32 = median_seconds(lambda: torch.nn.functional.linear(x, weight), repeats, device)
        same = median_seconds(
            lambda: torch.nn.functional.linear(x_native, w_native), repeats, device
        )
    decision = layer.__dict__["kernelpick_decision"]
    return LayerBench(
        decision.kernel, decision.degraded, caps.name, tokens, shape,
        Dtype.parse(dtype).value, seconds, fp32, same, error,
    )  # fmt: skip
