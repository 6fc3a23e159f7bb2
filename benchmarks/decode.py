"""Decode speed of one FP8 linear layer on the CPU, against the best high-precision linear.

An LLM decodes a few tokens at a time: M is small, and a layer's time is the time to read
its weight from memory. So every callable here (the baselines and the kernels kernelpick
selects) rotates through several weights whose total is at least twice the last-level
cache, one weight a call, and each call reads its weight from DRAM, not from cache.

- Baselines: ``torch.nn.functional.linear`` in fp32, bf16 and fp16 (input and weight in
  that dtype). The best one at an M is the fastest of the three in this run.
- Candidates, through kernelpick's public API on ``kp.probe("cpu")``: ``ptpc``
  (``fp8_per_channel``, W8A8 with per-token activation scales) and ``w8a16``
  (``fp8_weight_only``), both with bf16 activations and bf16 output. Whatever kernel
  ``kp.choose`` selects is bound with ``kp.bind`` and run with ``apply``, activation
  quantization included; its id is recorded.
- Paired timing: within one repeat every callable is timed back to back (the order
  rotating from repeat to repeat); each figure is the median over the repeats of the
  per-repeat ratio, each absolute time the median of its own runs.
- The floor: memory read bandwidth is measured in the same run (the best pass of the
  fastest of a few streaming reductions over buffers larger than the cache). That op also
  reads the FP8 weight's bytes (rotated like the rest) as one more callable of the paired
  repeats: ``read_ms`` and ``*_vs_read`` are that read as the machine's load moved it.
  ``floor_ms`` is the FP8 weight's bytes over the better of the two bandwidths: no kernel
  that reads the weight once can be faster.
"""

from __future__ import annotations

import gc
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

import kernelpick as kp
from benchmarks.rotation import (
    BASELINES,
    INT8PACK,
    Timed,
    candidate,
    layer_peer,
    median_ratio,
    ratio_row,
    rotated_weights,
    shape_record,
    time_tokens,
)
from kernelpick.core import CpuArch

__all__ = [
    "ACTIVATION",
    "ACTIVATIONS",
    "BASELINES",
    "CANDIDATES",
    "FALLBACK_LLC_BYTES",
    "MIB",
    "check_activation",
    "layer_config",
    "llc_bytes",
    "measure_bandwidth",
    "run_decode",
]

MIB = 2**20
FALLBACK_LLC_BYTES = 64 * MIB  # where sysfs does not say
# Candidate name -> kernelpick scheme. Both run the activation dtype in and out.
CANDIDATES: dict[str, str] = {"ptpc": "fp8_per_channel", "w8a16": "fp8_weight_only"}
# Other libraries' ops in the same repeats: torch's int8 weight-only GEMM.
PEERS = (INT8PACK,)
ACTIVATION = "bfloat16"
# The activation dtypes the figures are taken for: bf16 (a bf16 model), fp32 (a model
# quantized from fp32 keeps fp32 activations).
ACTIVATIONS = ("bfloat16", "float32")


def check_activation(activation: str) -> None:
    """Refuses an activation dtype the figures are not taken for, naming the valid ones."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: use one of {', '.join(ACTIVATIONS)}")


def layer_config(scheme: str, n: int, k: int, activation: str) -> kp.QuantConfig:
    """``scheme``'s config for an ``[n, k]`` layer taking and giving ``activation``."""
    return kp.quant_config(
        scheme, weight_shape=(n, k), input_dtype=activation, out_dtype=activation
    )


# Streaming reductions over a uint8 buffer (its size a multiple of 8): each reads every byte
# once and writes nothing. The fastest here measures the bandwidth, and times the "read"
# callable beside the kernels.
READ_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "uint8 max": torch.max,
    "int64 max": lambda b: b.view(torch.int64).max(),
    "float32 sum": lambda b: b.view(torch.float32).sum(),
}
_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def _parse_size(text: str) -> int:
    """Bytes of a sysfs cache size such as ``32768K``."""
    text = text.strip().upper()
    if text and text[-1] in _UNITS:
        return int(text[:-1]) * _UNITS[text[-1]]
    return int(text)


def llc_bytes(root: Path = _CACHE) -> tuple[int, str]:
    """The last-level (level 3) cache of CPU 0 in bytes, and where that figure came from;
    ``FALLBACK_LLC_BYTES`` where sysfs does not say."""
    sizes = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if level == 3 and kind != "Instruction":
            sizes.append(size)
    if sizes:
        return max(sizes), f"{root}/index*/size (level 3)"
    return FALLBACK_LLC_BYTES, "not in sysfs: 64 MiB assumed"


def _fastest_pass(run: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` runs after a warm-up: a floor is what the memory can do,
    and other work on a shared machine only ever slows a pass down."""
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_bandwidth(total_bytes: int, repeats: int) -> dict[str, Any]:
    """Memory read bandwidth: streaming reductions over 4 buffers of ``total_bytes`` in all
    (make it several times the last-level cache), the fastest op's best pass, in GB/s. Each op reads
    every byte once and writes nothing; which one is bandwidth-bound depends on torch's
    vectorization of it (int32 ``sum`` widens to int64 and is compute-bound, for one)."""
    each = max(MIB, total_bytes // 4) // 64 * 64
    # Written, not just allocated: a calloc'ed buffer would read the shared zero page.
    buffers = [torch.full((each,), i + 1, dtype=torch.uint8) for i in range(4)]
    by_op: dict[str, float] = {}
    with torch.inference_mode():
        for name, op in READ_OPS.items():

            def one_pass(op: Callable[[torch.Tensor], torch.Tensor] = op) -> None:
                for buffer in buffers:
                    op(buffer)

            by_op[name] = 4 * each / _fastest_pass(one_pass, max(3, repeats)) / 1e9
    best = max(by_op, key=by_op.__getitem__)
    buffers.clear()
    return {
        "bandwidth_gbps": by_op[best],
        "bandwidth_op": best,
        "bandwidth_by_op_gbps": by_op,
        "bandwidth_bytes": 4 * each,
    }


def _shape(
    caps: kp.DeviceCaps,
    n: int,
    k: int,
    tokens: Sequence[int],
    repeats: int,
    target: int,
    bandwidth: dict[str, Any],
    seed: int,
    activation: str,
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    candidates = [
        candidate(name, layer_config(scheme, n, k, activation), caps)
        for name, scheme in CANDIDATES.items()
    ]
    dtype = getattr(torch, activation)
    layers = [layer_peer(name, scheme, caps) for name, scheme in CANDIDATES.items()]
    peers = (*PEERS, *layers)
    weights, fp8_count = rotated_weights(n, k, candidates, target, generator, peers, dtype)
    # The FP8 weight's bytes, read by the bandwidth's op in the same repeats as the kernels:
    # a floor that moves with the machine's load as they do.
    read_bytes = math.ceil(n * k / 64) * 64
    weights["read"] = [
        torch.full((read_bytes,), i + 1, dtype=torch.uint8) for i in range(fp8_count)
    ]
    record = shape_record(n, k, candidates, weights)
    fp8_bytes = n * k
    read = Timed("read", READ_OPS[bandwidth["bandwidth_op"]], weights["read"])
    samples = time_tokens(tokens, k, generator, candidates, weights, repeats, (read,), peers, dtype)
    del weights
    gc.collect()
    # The floor: the best bandwidth seen, up front or in any read among the repeats (a
    # busy machine slows one measurement, not necessarily both).
    fastest_read = min(t for by_name in samples.values() for t in by_name["read"])
    seen_gbps = max(bandwidth["bandwidth_gbps"], read_bytes / fastest_read / 1e9)
    floor_ms = fp8_bytes / (seen_gbps * 1e9) * 1e3
    rows = [_row(m, by_name, floor_ms) for m, by_name in samples.items()]
    return {
        **record,
        "fp8_weight_bytes": fp8_bytes,
        "read_gbps": read_bytes / fastest_read / 1e9,
        "floor_gbps": seen_gbps,
        "floor_ms": floor_ms,
        "rows": rows,
    }


def _row(m: int, samples: dict[str, list[float]], floor_ms: float) -> dict[str, Any]:
    """One M: ``ratio_row``'s figures, the streaming read's time, each candidate against
    the bytes-read floor, the paired read and the peers, and its layer (``name_module``)
    against its own ``kernel.apply``."""
    modules = [f"{name}_module" for name in CANDIDATES]
    row = ratio_row(m, samples, [*CANDIDATES, *(p.name for p in PEERS), *modules])
    row["read_ms"] = row["ms"].pop("read")
    for name in CANDIDATES:
        if name in samples:  # else no kernel selected for this scheme here
            row[f"{name}_vs_floor"] = row["ms"][name] / floor_ms
            row[f"{name}_vs_read"] = median_ratio(samples[name], samples["read"])
            for peer in PEERS:
                row[f"{name}_vs_{peer.name}"] = median_ratio(samples[name], samples[peer.name])
            module = samples[f"{name}_module"]
            row[f"{name}_module_vs_apply"] = median_ratio(module, samples[name])
    return row


def run_decode(
    shapes: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    repeats: int,
    rotation_bytes: int | None = None,
    cpu_isa: Sequence[str] | None = None,
    activation: str = ACTIVATION,
) -> dict[str, Any]:
    """The decode figures for each ``(N, K)`` in ``shapes`` at each M in ``tokens``.

    ``rotation_bytes``: the bytes each rotation must at least span; None for twice the
    last-level cache (0 for just 2 buffers: a smoke run at tiny sizes). ``cpu_isa``: ISA
    flags to select and build with instead of the probed ones (say ``avx2, fma, f16c``, to
    time the AVX2 build on an AVX-512 CPU); a subset of the CPU's own. ``activation``: the
    layers' input and output dtype, ``bfloat16`` or ``float32`` (a model quantized from
    fp32 keeps fp32 activations).
    """
    check_activation(activation)
    caps = kp.probe("cpu")
    if cpu_isa is not None:
        caps = attrs.evolve(caps, arch=CpuArch(platform.machine(), cpu_isa))
    llc, llc_source = llc_bytes()
    target = 2 * llc if rotation_bytes is None else rotation_bytes
    bandwidth = measure_bandwidth(min(2**30, max(4 * target, 4 * MIB)), repeats)
    results = [
        _shape(caps, n, k, tokens, repeats, target, bandwidth, seed, activation)
        for seed, (n, k) in enumerate(shapes)
    ]
    return {
        "llc_bytes": llc,
        "llc_source": llc_source,
        "rotation_target_bytes": target,
        **bandwidth,
        "repeats": repeats,
        "activation_dtype": activation,
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "schemes": dict(CANDIDATES),
        "shapes": results,
    }
