"""The targets of the benchmarks issue, and a table that says where each figure stands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["TARGETS", "Target", "render"]

_DICT_HIT = "a dict hit on a str key"


@attrs.frozen
class Target:
    """``figure`` should be at most / at least ``bound``.

    Every figure is a ratio, ``measured`` over ``baseline``, both taken in the same run (or,
    for the byte figures, computed from the same tensors): shared machines drift between
    runs, a ratio within one run does not.
    """

    figure: str
    at_most: bool
    bound: float
    measured: str
    baseline: str
    # The key under ``results["baselines"]`` where the suite describes the baseline it timed
    # (shape, and for bf16 whether this CPU has bf16 arithmetic), shown instead of ``baseline``.
    timed: str = ""

    def names_baseline(self, results: Mapping[str, Any]) -> str:
        """The baseline this figure was divided by, as this run describes it if it does."""
        described: Mapping[str, str] = results.get("baselines", {})
        return described.get(self.timed, self.baseline)

    def met(self, results: Mapping[str, Any]) -> bool | None:
        value = self.value(results)
        if value is None:
            return None
        return value <= self.bound if self.at_most else value >= self.bound

    def value(self, results: Mapping[str, Any]) -> float | None:
        if self.figure.endswith("/dict_lookup_ns"):
            base = self.figure.removesuffix("/dict_lookup_ns")
            if base in results and "dict_lookup_ns" in results:
                return float(results[base]) / float(results["dict_lookup_ns"])
            return None
        found = results.get(self.figure)
        return None if found is None else float(found)


TARGETS = (
    Target("choose_cached_ns/dict_lookup_ns", True, 50, "kp.choose, a question seen before",
           _DICT_HIT, "dict_lookup_ns"),
    Target("choose_uncached_ns/dict_lookup_ns", True, 3000,
           "kp.choose after clear_cache (h100, every rule)", _DICT_HIT, "dict_lookup_ns"),
    Target("plan_model_ns/dict_lookup_ns", True, 1e5,
           "a cold plan of a Llama-3-8B, 32 x 7 layers (--tiny: 2 x 7)", _DICT_HIT,
           "dict_lookup_ns"),
    Target("cpu_ptpc_vs_fp32_linear", True, 1.8, "PTPC layer, activation quantization included",
           "fp32 nn.Linear, same shape", "cpu_fp32_linear_ms"),
    Target("cpu_ptpc_vs_bf16_linear", True, 0.35, "PTPC layer, activation quantization included",
           "bf16 nn.Linear, same shape", "cpu_bf16_linear_ms"),
    Target("weight_bytes_ratio", True, 0.51, "FP8 weight + fp32 scales, bytes",
           "bf16 weight, bytes"),
    Target("peak_extra_memory_ratio", True, 1.5, "quantize_model's peak extra resident memory",
           "one fp32 layer, bytes"),
    Target("quantize_vs_clone", False, 0.25, "per-channel quantization throughput",
           "clone() throughput, same weight", "clone_gbps"),
    Target("gpu_ptpc_vs_bf16_8192", True, 0.6, "PTPC layer, 8192^3", "bf16 torch.matmul, 8192^3"),
    Target("gpu_quant_bw_fraction", False, 0.7, "fused per-token quantizer bandwidth",
           "device-to-device copy bandwidth"),
    Target("gpu_w8a16_gemv_vs_bf16", True, 0.65, "cuda_w8a16_cupy GEMV, N=K=8192",
           "bf16 GEMV, same shape"),
)  # fmt: skip


def _machine(results: Mapping[str, Any]) -> str:
    machine = results.get("machine", {})
    return (
        f"machine: {machine.get('cpu', '?')}, torch CPU capability "
        f"{machine.get('torch_cpu_capability', '?')}, {machine.get('torch_threads', '?')} torch "
        f"threads, torch {machine.get('torch', '?')}, kernelpick {machine.get('kernelpick', '?')}"
    )


def render(results: Mapping[str, Any]) -> str:
    """The figures against their targets, each over the baseline it was divided by, then
    the absolute numbers behind them."""
    lines = [_machine(results), ""]
    lines.append(f"{'figure':<36} {'value':>12} {'target':>12}  result")
    for target in TARGETS:
        value = target.value(results)
        bound = f"{'<=' if target.at_most else '>='} {target.bound:g}"
        if value is None:
            lines.append(f"{target.figure:<36} {'-':>12} {bound:>12}  not measured here")
        else:
            verdict = "met" if target.met(results) else "MISSED"
            lines.append(f"{target.figure:<36} {value:>12.3f} {bound:>12}  {verdict}")
        lines.append(f"    {target.measured}  /  {target.names_baseline(results)}")
    lines += ["", "absolute figures (for people; the targets judge the ratios above):"]
    absolute = [
        ("dict lookup", "dict_lookup_ns", "ns"), ("choose, cached", "choose_cached_ns", "ns"),
        ("choose, uncached", "choose_uncached_ns", "ns"),
        ("plan a Llama-3-8B", "plan_model_ns", "ns"),
        ("PTPC layer", "cpu_ptpc_ms", "ms"), ("fp32 nn.Linear", "cpu_fp32_linear_ms", "ms"),
        ("bf16 nn.Linear", "cpu_bf16_linear_ms", "ms"), ("quantize", "quantize_gbps", "GB/s"),
        ("clone", "clone_gbps", "GB/s"), ("peak extra memory", "peak_extra_memory_mib", "MiB"),
    ]  # fmt: skip
    for label, key, unit in absolute:
        if key in results:
            value = float(results[key])
            shown = (
                f"{value / 1e3:.2f} us" if unit == "ns" and value > 1e4 else f"{value:.2f} {unit}"
            )
            lines.append(f"  {label:<34} {shown:>14}")
    return "\n".join(lines)
