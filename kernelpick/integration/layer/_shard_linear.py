"""``shard_linear``: one rank's quantized shard of a whole ``nn.Linear``, for models that
split their layers themselves (see ``_parallel`` for the styles and what the ranks share)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import torch

from kernelpick.adapters import default_caps
from kernelpick.core import DeviceCaps, InvalidValueError, Policy, Scheme
from kernelpick.integration.layer._loaders import weight_loader_of
from kernelpick.integration.layer._method import QuantizedLinearMethod
from kernelpick.integration.layer._module import QuantizedLinear
from kernelpick.integration.layer._parallel import DEFAULT_TIMEOUT, ParallelStyle, TensorParallel
from kernelpick.kernels import check_finite

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["shard_linear"]


def shard_linear(
    module: torch.nn.Linear,
    style: ParallelStyle | str,
    group: ProcessGroup | None = None,
    *,
    scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
    caps: DeviceCaps | None = None,
    policy: Policy | None = None,
    block_size: int | None = None,
    group_size: int | None = None,
    symmetric: bool = True,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    prefix: str = "",
) -> QuantizedLinear:
    """This rank's quantized shard of ``module``, which every rank of ``group`` (the default
    group when None) holds whole: ``"column"`` keeps ``out_features / world`` outputs,
    ``"row"`` keeps ``in_features / world`` inputs. Each rank must call it for the same
    layers in the same order (a row-parallel per-channel or any per-tensor scheme
    all-reduces the weight amax; an integer one, each row's bounds).

    ``block_size`` is ``fp8_block``'s; ``group_size`` and ``symmetric`` are the integer
    weight-only schemes' (see ``kp.quant_config``). A row-parallel integer shard must hold
    whole groups: ``in_features / world`` a multiple of the group size, or per channel.

    The shard's forward returns its part of the output: the caller gathers column-parallel
    parts and sums row-parallel ones with an all-reduce. A row-parallel shard holds the
    bias on rank 0 only, so that the sum adds it once; a column-parallel shard holds its
    part of it. The shard is made on ``module``'s device, and ``caps`` defaults to a probe
    of that device. ``module`` is only read: it is as it was whether or not this succeeds.
    """
    tp = TensorParallel.of(style, group, timeout=timeout)
    name = prefix or "module"
    if type(module) is not torch.nn.Linear:
        found = type(module).__name__
        raise InvalidValueError(name, found, "an nn.Linear (exactly: a subclass may hold more)")
    n, k = module.out_features, module.in_features
    column = tp.style is ParallelStyle.COLUMN
    split = n if column else k
    if split % tp.world_size:
        features = "out_features" if column else "in_features"
        expected = f"a multiple of the world size, {tp.world_size}, for {tp.style}-parallel"
        raise InvalidValueError(f"{features} of {name}", split, expected)
    n_part, k_part = (n // tp.world_size, k) if column else (n, k // tp.world_size)
    if module.bias is not None:  # the whole bias, on every rank, so that all refuse it alike
        check_finite(f"{name}.bias", module.bias.detach().view(1, -1))
    device = module.weight.device
    if caps is None:
        caps = default_caps(device)
    method = QuantizedLinearMethod(
        scheme, caps, policy, block_size=block_size, group_size=group_size,
        symmetric=symmetric, tensor_parallel=tp,
    )  # fmt: skip
    shard = QuantizedLinear(k_part, n_part, method.steps, _bias_part(module.bias, tp, n_part))
    with torch.device(device):
        method.create_weights(shard, k_part, [n_part], k, n, module.weight.dtype, prefix=prefix)
    weight = shard.get_parameter("weight")
    weight_loader_of(weight)(weight, module.weight.detach())  # narrows to this rank's part
    method.process_weights_after_loading(shard)
    return shard


def _bias_part(
    bias: torch.Tensor | None, tp: TensorParallel, n_part: int
) -> torch.nn.Parameter | None:
    if bias is None or (tp.style is ParallelStyle.ROW and tp.rank != 0):
        return None
    part = bias.detach()
    if tp.style is ParallelStyle.COLUMN:
        part = part.narrow(0, tp.rank * n_part, n_part)
    return torch.nn.Parameter(part.clone(), requires_grad=bias.requires_grad)
