"""The benchmark suite: decision cost and kernel speed, side by side in one run.

Every figure that the targets judge is a ratio against a baseline measured in the same run
(a dict lookup, the fastest high-precision ``F.linear``, a ``clone()``), because these
machines are shared and noisy; ``results["baselines"]`` names each one. Absolute times are
reported alongside, for people. Developer tooling: it lives in the source tree, not in the wheel.
"""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import torch

import kernelpick as kp
from benchmarks.decode import ACTIVATION, BASELINES, run_decode
from benchmarks.memory import peak_extra_rss
from benchmarks.schemes import SCHEME_TOKENS, run_schemes
from benchmarks.timing import median_ns
from kernelpick.bench import median_seconds
from kernelpick.core import CpuArch
from kernelpick.integration import quantize_model
from kernelpick.kernels import quantize_canonical

__all__ = ["DECODE_TOKENS", "LLAMA3_8B_LAYERS", "SuiteConfig", "run_suite"]

# (name, N, K) of one Llama-3-8B decoder layer: hidden 4096, 8 KV heads of 128, MLP 14336.
LLAMA3_8B_LAYERS = (
    ("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096),
    ("o_proj", 4096, 4096), ("gate_proj", 14336, 4096), ("up_proj", 14336, 4096),
    ("down_proj", 4096, 14336),
)  # fmt: skip
CPU = torch.device("cpu")
# The repository root: the directory the ``benchmarks`` package is imported from.
ROOT = Path(__file__).resolve().parents[1]
# CPU flags for bf16 arithmetic (x86 AVX-512 and AMX, Arm): where none is present, the bf16
# nn.Linear baseline is not a native bf16 GEMM, and "vs bf16" means something else.
BF16_UNITS = ("avx512_bf16", "amx_bf16", "bf16")


# The decode figures' token counts (M), and their shapes (N, K): ``full()`` adds the MLP's
# gate/up projection of a Llama-3-8B layer to the 4096 x 4096 one.
DECODE_TOKENS = SCHEME_TOKENS
DECODE_SHAPE = (4096, 4096)
MLP_SHAPE = (14336, 4096)


@attrs.frozen
class SuiteConfig:
    """Sizes and repeats. ``SuiteConfig()`` is the reported run, ``full()`` adds the
    14336 x 4096 decode shape, ``quick()`` fits in a few minutes on a 2-core machine,
    ``tiny()`` only shows the harness works (CI).

    ``rotation_bytes``: how many bytes of weights each decode callable rotates through at
    least; None for twice the last-level cache, so that every call reads its weight from
    memory (0: just 2 buffers, for a smoke run).
    """

    hidden: int = 4096
    memory_layers: int = 8
    repeats: int = 7
    decision_loops: int = 20000
    model_layers: int = 32
    decode_tokens: tuple[int, ...] = DECODE_TOKENS
    decode_shapes: tuple[tuple[int, int], ...] = (DECODE_SHAPE,)
    decode_repeats: int = 7
    # M of the block FP8 and int8 figures (benchmarks/schemes.py), on the decode shapes.
    scheme_tokens: tuple[int, ...] = SCHEME_TOKENS
    rotation_bytes: int | None = None
    # ISA flags the FP8 kernels are selected and built for, instead of the probed ones.
    cpu_isa: tuple[str, ...] | None = None
    # The decode and scheme layers' input and output dtype (benchmarks.decode.ACTIVATIONS).
    activation: str = ACTIVATION

    @classmethod
    def full(cls) -> SuiteConfig:
        return cls(decode_shapes=(DECODE_SHAPE, MLP_SHAPE))

    @classmethod
    def quick(cls) -> SuiteConfig:
        return cls(repeats=3, decision_loops=5000)

    @classmethod
    def tiny(cls) -> SuiteConfig:
        return cls(
            hidden=64, memory_layers=2, repeats=1, decision_loops=50, model_layers=2,
            decode_tokens=(1, 4), decode_shapes=((64, 64),), decode_repeats=1, rotation_bytes=0,
            scheme_tokens=(1, 4),
        )  # fmt: skip


def _decisions(config: SuiteConfig) -> dict[str, float]:
    caps = kp.device_profile("h100")  # CUDA has the largest catalog
    layer = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    names = {"choose": kp.choose, "caps": caps, "layer": layer, "clear": kp.clear_cache}
    # The floor: a dict hit on a str key, whose hash Python caches in the object.
    names["table"] = {"h100/fp8_per_channel/4096x4096": "decision"}
    names["key"] = "h100/fp8_per_channel/4096x4096"
    loops, repeats = config.decision_loops, max(3, config.repeats)
    lookup = median_ns("table[key]", names, loops=loops, repeats=repeats)
    cached = median_ns("choose(caps, layer)", names, loops=loops, repeats=repeats)
    uncached = median_ns(
        "clear(); choose(caps, layer)", names, loops=max(1, loops // 20), repeats=repeats
    )

    def plan_model() -> None:
        kp.clear_cache()  # a model load starts cold
        for _ in range(config.model_layers):
            for _name, n, k in LLAMA3_8B_LAYERS:
                kp.choose(caps, kp.quant_config("fp8_per_channel", weight_shape=(n, k)))

    names["plan"] = plan_model
    plan = median_ns("plan()", names, loops=1, repeats=repeats)
    return {
        "dict_lookup_ns": lookup,
        "choose_cached_ns": cached,
        "choose_uncached_ns": uncached,
        "plan_model_ns": plan,
        "plan_model_decisions": config.model_layers * len(LLAMA3_8B_LAYERS),
    }


def _quantization(config: SuiteConfig) -> dict[str, float]:
    size = config.hidden
    weight = torch.randn(size, size, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layer = kp.quant_config("fp8_per_channel", weight_shape=(size, size))
    quantize = median_seconds(lambda: quantize_canonical(weight, layer), config.repeats, CPU)
    clone = median_seconds(weight.clone, config.repeats, CPU)
    q, scale = quantize_canonical(weight, layer)
    source = weight.numel() * weight.element_size()
    return {
        "quantize_vs_clone": clone / quantize,  # throughput ratio: same bytes in
        "quantize_gbps": source / quantize / 1e9,
        "clone_gbps": source / clone / 1e9,
        "weight_bytes_ratio": (q.numel() * q.element_size() + scale.numel() * 4) / source,
    }


def measure_conversion_memory(size: int, layers: int) -> int:
    """Peak extra resident bytes while ``quantize_model`` converts ``layers`` fp32 linears of
    ``size`` x ``size``. Code paths are warmed on a small model first, so what is measured
    is what the data costs, not the first use of a module."""
    caps, policy = kp.probe("cpu"), kp.Policy()
    quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 64)), caps=caps, policy=policy)
    torch.manual_seed(2)
    model = torch.nn.Sequential(*(torch.nn.Linear(size, size) for _ in range(layers)))
    gc.collect()
    _, extra = peak_extra_rss(lambda: quantize_model(model, caps=caps, policy=policy))
    return extra


def _memory(config: SuiteConfig) -> dict[str, float]:
    # In a fresh process: memory the allocator kept from earlier measurements would hide
    # the peak, or inflate it.
    code = (
        "from benchmarks.suite import measure_conversion_memory as measure; "
        f"print(measure({config.hidden}, {config.memory_layers}))"
    )
    # cwd=ROOT: ``-c`` imports from the working directory, where ``benchmarks`` must be found.
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    extra = int(run.stdout.split()[-1])
    layer_fp32 = config.hidden * config.hidden * 4
    return {"peak_extra_memory_ratio": extra / layer_fp32, "peak_extra_memory_mib": extra / 2**20}


def _bf16_units() -> list[str]:
    caps = kp.probe("cpu")
    isa = caps.arch.isa if isinstance(caps.arch, CpuArch) else frozenset()
    return [flag for flag in BF16_UNITS if flag in isa]


def _baselines(config: SuiteConfig) -> dict[str, Any]:
    """What each ratio was divided by. The bf16 baseline is named with the CPU's bf16 units,
    because with them a bf16 GEMM is several times faster than fp32 and without them slower."""
    size = config.hidden
    units = _bf16_units()
    bf16 = (
        f"native bf16 arithmetic ({', '.join(units)})"
        if units
        else f"no bf16 arithmetic on this CPU (none of {', '.join(BF16_UNITS)})"
    )
    shapes = ", ".join(f"N={n} K={k}" for n, k in config.decode_shapes)
    tokens = ", ".join(str(m) for m in config.decode_tokens)
    dtypes = ", ".join(BASELINES)
    return {
        "cpu_bf16_native": bool(units),
        "baselines": {
            "dict_lookup_ns": "a hit in a one-entry dict on a str key (hash cached), timeit",
            "decode_best": (
                f"the fastest F.linear of {dtypes} at the same M ({tokens}) and shape "
                f"({shapes}), weights rotated past the last-level cache; bf16: {bf16}"
            ),
            "decode_fp32": "fp32 F.linear, same M and shape, weights rotated the same way",
            "decode_floor_ms": "FP8 weight bytes / memory read bandwidth measured in this run",
            "clone_gbps": f"clone() throughput, {size}x{size} bf16 weight (fresh memory each call)",
        },
    }


def _machine() -> dict[str, Any]:
    caps = kp.probe("cpu")
    return {
        "cpu": caps.name, "isa": sorted(caps.arch.isa) if isinstance(caps.arch, CpuArch) else [],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0], "torch": torch.__version__,
        "kernelpick": kp.__version__, "platform": platform.platform(),
    }  # fmt: skip


def run_suite(config: SuiteConfig) -> dict[str, Any]:
    """Every CPU figure of the benchmarks issue, with the machine it ran on."""
    results: dict[str, Any] = {"machine": _machine()} | _baselines(config)
    results |= _decisions(config)
    # Before the decode figures: their gigabyte of freed buffers would leave malloc serving
    # clone()'s 32 MiB from memory already faulted in, and the clone baseline measures a
    # fresh allocation (page faults) as it always has.
    results |= _quantization(config)
    results["decode"] = run_decode(
        config.decode_shapes,
        config.decode_tokens,
        config.decode_repeats,
        config.rotation_bytes,
        config.cpu_isa,
        config.activation,
    )
    results["schemes"] = run_schemes(
        config.decode_shapes,
        config.scheme_tokens,
        config.decode_repeats,
        config.rotation_bytes,
        config.cpu_isa,
        config.activation,
    )
    results |= _memory(config)
    return results
