"""The integer weight-only ranks of the vLLM tests (``python -m
tests.engines.vllm_int_workers RANK PORT OUT``): pre-quantized int4 and int8 row- and
column-parallel layers loaded from the whole checkpoint tensors through vLLM's loaders,
which narrow them to the rank's part, and online row-parallel per-channel layers, whose
ranks agree each row's bounds. vLLM is imported inside the functions only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import kernelpick as kp
from kernelpick.integration import weight_loader_of
from kernelpick.kernels import pack_zero_points, quantize_int
from tests.engines.vllm_workers import WORLD, K, N, peaked_x, vllm_group, weight

__all__ = ["integer_row_and_column", "straddling_groups"]

# (scheme, group size, symmetric) of each layer: a row-parallel rank must hold whole
# groups of K; a column-parallel one whole words of packed zero points along N.
ROW = ("int4_weight_only", 64, True)
ROW_PER_CHANNEL = ("int8_weight_only", -1, False)  # zero points one column, on every rank
ROW_ONE_GROUP = ("int4_weight_only", 128, False)  # one group per rank: narrowed along K
COLUMN = ("int4_weight_only", 32, False)
# Online, quantized from each rank's float part: per channel, on the whole row's bounds.
ONLINE_ROW = (("int8_weight_only", -1, True), ("int4_weight_only", -1, False))


def _tensors(scheme: str, group: int, symmetric: bool, seed: int) -> dict[str, torch.Tensor]:
    config = kp.quant_config(
        scheme, weight_shape=(N, K), group_size=group, symmetric=symmetric, out_dtype="float32"
    )
    packed, scale, zero = quantize_int(weight(N, K, seed), config)
    tensors = {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([N, K])}
    if zero is not None:
        tensors["weight_zero_point"] = pack_zero_points(zero, config.weight.dtype.bits)
    return tensors


def _layer(
    style: str, grouping: tuple[str, int, bool], prefix: str, checkpoint: str = "pre_quantized"
) -> Any:
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    scheme, group, symmetric = grouping
    config = KernelpickConfig(
        scheme, group_size=group, symmetric=symmetric, checkpoint_format=checkpoint
    )
    kwargs = {"params_dtype": torch.float32, "quant_config": config, "prefix": prefix}
    if style == "row":
        return RowParallelLinear(K, N, bias=False, input_is_parallel=False, **kwargs)
    return ColumnParallelLinear(K, N, bias=False, gather_output=True, **kwargs)


def integer_row_and_column() -> dict[str, torch.Tensor]:
    """Each layer's output for ``peaked_x``, in the current vLLM group (1 or 2 ranks)."""
    out: dict[str, torch.Tensor] = {}
    for key, style, grouping, seed in (("row", "row", ROW, 11),
                                       ("row_per_channel", "row", ROW_PER_CHANNEL, 12),
                                       ("row_one_group", "row", ROW_ONE_GROUP, 14),
                                       ("column", "column", COLUMN, 13)):  # fmt: skip
        layer = _layer(style, grouping, f"model.layers.0.{key}")
        for name, tensor in _tensors(*grouping, seed).items():
            param = layer.get_parameter(name)
            weight_loader_of(param)(param, tensor)
        layer.quant_method.process_weights_after_loading(layer)
        out[key] = layer(peaked_x())[0]
    for index, grouping in enumerate(ONLINE_ROW):
        key = f"online_row_{index}"
        layer = _layer("row", grouping, f"model.layers.0.{key}", "high_precision")
        param = layer.get_parameter("weight")
        weight_loader_of(param)(param, weight(N, K, 20 + index))  # the whole float weight
        layer.quant_method.process_weights_after_loading(layer)  # all-reduces the bounds
        out[key] = layer(peaked_x())[0]
    return out


def straddling_groups() -> str:
    """A row-parallel layer whose rank's K (128) is no whole number of its groups (96)."""
    try:
        _layer("row", ("int4_weight_only", 96, True), "model.layers.0.straddle")
    except kp.KernelpickError as error:
        return f"{type(error).__name__}: {error}"
    return "built"


def main(argv: list[str]) -> None:
    rank, port, out = int(argv[0]), int(argv[1]), Path(argv[2])
    with vllm_group(WORLD, rank, port):
        tensors = integer_row_and_column()
        refusal = straddling_groups()
    torch.save(tensors, out / f"int_rank{rank}.pt")
    print("RESULT " + json.dumps({"rank": rank, "straddling": refusal}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
