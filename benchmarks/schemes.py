"""Block FP8 and int8 layers on the CPU against the best high-precision linear.

``decode.py`` times the per-channel FP8 schemes; this module times the others on the same
method, with its helpers: every callable rotates through weights totalling at least twice
the last-level cache, timing is paired (all callables back to back in each repeat, the
order rotating) and each figure is the median of per-repeat ratios.

- Baselines: ``F.linear`` in fp32, bf16 and fp16; "best" is the fastest at that M.
- Candidates, each the kernel ``kp.choose`` selects on ``kp.probe("cpu")`` (its id is
  recorded), bound with ``kp.bind`` and run with ``apply``, in and out in the activation
  dtype (bf16, or fp32 for a model quantized from fp32):
  ``block`` (``fp8_block``: 1 x 128 dynamic activation groups, 128 x 128 weight blocks),
  ``block_w8a16`` (128 x 128 weight blocks, weight-only), ``int8`` (``int8_per_channel``:
  per-token int8 activations, per-channel int8 weights), ``per_tensor``
  (``fp8_per_tensor``: one dynamic activation scale, one weight scale), ``int4_wo`` and
  ``int8_wo`` (``int4_weight_only``, groups of 128, and ``int8_weight_only``, per
  channel: kernelpick's ``cpu_int4_gemm`` on AVX512-BF16, else torch's tinygemm, and
  torch's int8pack op), ``int4_torch`` (int4 on torch's ``cpu_int4pack_mm``, forced,
  beside it) and, for comparison in the same repeats, ``ptpc`` (``fp8_per_channel``).
- Peers, in the same repeats where the machine has them: ``q4_0``, llama.cpp's Q4_0
  product (``ggml_peer``: set ``KERNELPICK_GGML``), beside the int4 layers.
"""

from __future__ import annotations

import gc
import platform
from collections.abc import Sequence
from typing import Any

import attrs
import torch

import kernelpick as kp
from benchmarks.decode import ACTIVATION, MIB, check_activation, layer_config, llc_bytes
from benchmarks.ggml_peer import ggml_peer
from benchmarks.rotation import (
    Peer,
    candidate,
    ratio_row,
    rotated_weights,
    shape_record,
    time_tokens,
)
from kernelpick.core import CpuArch, Dtype, GroupShape, QuantKey, ScaleSpec

__all__ = ["CANDIDATES", "SCHEME_TOKENS", "render_schemes", "run_schemes"]

# Candidate name -> the scheme it times (``block_w8a16`` is not a named scheme: weight-only
# with block scales, see _config).
CANDIDATES: dict[str, str] = {
    "block": "fp8_block",
    "block_w8a16": "fp8 128x128 blocks, weight-only",
    "int8": "int8_per_channel",
    "per_tensor": "fp8_per_tensor",
    "ptpc": "fp8_per_channel",
    "int4_wo": "int4_weight_only",
    "int4_torch": "int4_weight_only",
    "int8_wo": "int8_weight_only",
}
# Candidates timed under a policy of their own: int4 on torch's op beside the one selected
# (kernelpick's cpu_int4_gemm, where the CPU has AVX512-BF16).
_POLICIES = {"int4_torch": kp.Policy(force="cpu_int4pack_mm")}
# Every M the decode figures take (the targets judge these layers at every M).
SCHEME_TOKENS = (1, 4, 16, 64, 256, 2048)


def _config(name: str, n: int, k: int, activation: str) -> kp.QuantConfig:
    if name == "block_w8a16":
        weight = QuantKey(Dtype.FLOAT8_E4M3FN, ScaleSpec(GroupShape.block(128), static=True))
        return kp.QuantConfig(weight, None, (n, k), activation, activation)
    return layer_config(CANDIDATES[name], n, k, activation)


def _shape(
    caps: kp.DeviceCaps, n: int, k: int, tokens: Sequence[int], repeats: int, target: int,
    seed: int, activation: str, peers: Sequence[Peer],
) -> dict[str, Any]:  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    candidates = [
        candidate(name, _config(name, n, k, activation), caps, _POLICIES.get(name))
        for name in CANDIDATES
    ]
    dtype = getattr(torch, activation)
    weights, _ = rotated_weights(n, k, candidates, target, generator, peers, dtype)
    record = shape_record(n, k, candidates, weights)
    samples = time_tokens(
        tokens, k, generator, candidates, weights, repeats, peers=peers, activation=dtype
    )
    del weights
    gc.collect()
    names = [*CANDIDATES, *(peer.name for peer in peers)]
    rows = [ratio_row(m, by_name, names) for m, by_name in samples.items()]
    return {**record, "rows": rows}


def run_schemes(
    shapes: Sequence[tuple[int, int]],
    tokens: Sequence[int],
    repeats: int,
    rotation_bytes: int | None = None,
    cpu_isa: Sequence[str] | None = None,
    activation: str = ACTIVATION,
) -> dict[str, Any]:
    """The figures for each ``(N, K)`` in ``shapes`` at each M in ``tokens``; the arguments
    are ``run_decode``'s (``rotation_bytes`` None: twice the last-level cache)."""
    check_activation(activation)
    caps = kp.probe("cpu")
    if cpu_isa is not None:
        caps = attrs.evolve(caps, arch=CpuArch(platform.machine(), cpu_isa))
    llc, llc_source = llc_bytes()
    target = 2 * llc if rotation_bytes is None else rotation_bytes
    q4_0, q4_0_runs = ggml_peer(torch.get_num_threads())
    peers = () if q4_0 is None else (q4_0,)
    return {
        "llc_bytes": llc,
        "llc_source": llc_source,
        "rotation_target_bytes": target,
        "repeats": repeats,
        "activation_dtype": activation,
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "schemes": dict(CANDIDATES),
        "peers": {"q4_0": q4_0_runs},
        "shapes": [
            _shape(caps, n, k, tokens, repeats, target, seed, activation, peers)
            for seed, (n, k) in enumerate(shapes)
        ],
    }


def render_schemes(schemes: dict[str, Any]) -> list[str]:
    """The report's lines for ``run_schemes``' record."""
    lines = [
        "",
        f"other schemes (times: medians of {schemes['repeats']} paired repeats; ratios: medians"
        f" of per-repeat ratios); weights rotate through >= "
        f"{schemes['rotation_target_bytes'] / MIB:.0f} MiB per callable",
    ]
    act = schemes.get("activation_dtype", "bfloat16")
    lines += [f"  {name}: {what}, {act} in and out" for name, what in schemes["schemes"].items()]
    lines += [f"  {name} (peer): {what}" for name, what in schemes.get("peers", {}).items()]
    for shape in schemes["shapes"]:
        builds = shape.get("builds", {})
        ran = ", ".join(
            f"{name}: {kernel}{f' [{builds[name]}]' if name in builds else ''}"
            f"{' (DEGRADED)' if shape['degraded'].get(name) else ''}"
            for name, kernel in shape["kernels"].items()
        )
        timed = [*CANDIDATES, *schemes.get("peers", {})]
        names = [name for name in timed if name in shape["rows"][0]["ms"]]
        lines += ["", f"schemes, N={shape['n']} K={shape['k']}  ({ran})"]
        lines.append(
            f"  {'M':>5} {'best':>5} {'best ms':>8} "
            + " ".join(f"{name + ' ms':>15} {name + '/best':>16}" for name in names)
        )
        for row in shape["rows"]:
            cells = " ".join(
                f"{row['ms'][name]:>15.3f} {row[f'{name}_vs_best']:>16.2f}" for name in names
            )
            lines.append(f"  {row['m']:>5} {row['best']:>5} {row['best_ms']:>8.3f} {cells}")
    return lines
