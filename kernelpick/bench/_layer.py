"""One layer: the selected kernel against the unquantized linear it replaces, in one run."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from kernelpick.bench._memory import allocation_failures, check_fits
from kernelpick.bench._timing import median_seconds
from kernelpick.core import DeviceCaps, Dtype, Scheme
from kernelpick.integration import QuantizedLinearMethod, layer_state, weight_loader_of
from kernelpick.kernels import torch_dtype

__all__ = ["RATIO", "STAGES", "LayerBench", "Progress", "bench_layer", "processed_layer", "ratio"]

Progress = Callable[[str, int, int], None]
"""Told ``(stage, number, total)`` as each stage of a benchmark starts, numbered from 1."""

STAGES = 4  # quantize, then time the kernel, the fp32 linear and the native linear

RATIO = "vs_{baseline} = time / {baseline} time (below 1: faster than {baseline})"
"""What every ``vs_<baseline>`` figure is, in the text and in the JSON (``ratio``)."""


def ratio(seconds: float, baseline: float) -> float:
    """``seconds`` over the ``baseline``'s seconds (see ``RATIO``)."""
    return seconds / baseline


def processed_layer(
    method: QuantizedLinearMethod, weight: torch.Tensor, device: torch.device
) -> torch.nn.Module:
    """A layer taken through the linear-method protocol as an engine would: create, load
    ``weight [N, K]`` (its dtype is the layer's), process."""
    n, k = weight.shape
    layer = torch.nn.Module()
    with torch.device(device):  # engines allocate under the device they load onto
        method.create_weights(layer, k, [n], k, n, weight.dtype, prefix="bench")
    param = layer.get_parameter("weight")
    weight_loader_of(param)(param, weight)
    method.process_weights_after_loading(layer)
    return layer


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
        """The fields, with the kernel's ``vs_fp32`` and ``vs_native`` (see ``RATIO``)."""
        return {
            **attrs.asdict(self),
            "vs_fp32": ratio(self.seconds_kernel, self.seconds_fp32),
            "vs_native": ratio(self.seconds_kernel, self.seconds_native),
        }


def bench_layer(
    caps: DeviceCaps,
    scheme: Scheme | str,
    shape: tuple[int, int],
    dtype: Dtype | str,
    tokens: int,
    repeats: int,
    device: torch.device,
    *,
    progress: Progress | None = None,
) -> LayerBench:
    """Quantize a random ``[N, K]`` layer with the kernel selected for ``caps`` and time it;
    ``progress`` hears of each of the ``STAGES`` stages as it starts (a run takes seconds).

    A layer whose tensors would not fit ``device``'s free memory is ``InvalidValueError``
    before anything is allocated, and so is an allocation that fails anyway."""
    n, k = shape
    parsed = Dtype.parse(dtype)
    name, native = parsed.value, torch_dtype(parsed)
    # Made (the scheme read, the kernel selected) before the first stage is announced: a
    # bad scheme is an error on its own, not one that follows "[1/4] quantizing".
    method = QuantizedLinearMethod(scheme, caps)
    # Before the first stage too, and before anything is allocated.
    check_fits(shape, tokens, native.itemsize, device)
    sizes = f"M={tokens} N={n} K={k}"
    tell = progress or (lambda stage, number, total: None)
    with allocation_failures(shape, tokens):
        tell(f"quantizing the {n}x{k} weight", 1, STAGES)
        generator = torch.Generator().manual_seed(0)
        weight = (torch.randn(n, k, generator=generator) / k**0.5).to(device)
        x = torch.randn(tokens, k, generator=generator).to(device)
        layer = processed_layer(method, weight.to(native), device)
        x_native, w_native = x.to(native), weight.to(native)
        decision = layer_state(layer).decision
        with torch.inference_mode():
            exact = torch.nn.functional.linear(x, weight)
            got = method.apply(layer, x_native).float()
            error = float(torch.linalg.norm(got - exact) / torch.linalg.norm(exact))
            tell(f"timing {decision.kernel} at {sizes}", 2, STAGES)
            seconds = median_seconds(lambda: method.apply(layer, x_native), repeats, device)
            tell(f"timing linear float32 at {sizes}", 3, STAGES)
            fp32 = median_seconds(lambda: torch.nn.functional.linear(x, weight), repeats, device)
            tell(f"timing linear {name} at {sizes}", 4, STAGES)
            same = median_seconds(
                lambda: torch.nn.functional.linear(x_native, w_native), repeats, device
            )
    return LayerBench(
        decision.kernel, decision.degraded, caps.name, tokens, shape,
        name, seconds, fp32, same, error,
    )  # fmt: skip
