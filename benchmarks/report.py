"""The targets of the benchmarks issue, and a table that says where each figure stands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["TARGETS", "Target", "render"]


@attrs.frozen
class Target:
    """``figure`` (a ratio) should be at most / at least ``bound``."""

    figure: str
    at_most: bool
    bound: float
    means: str

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
    Target("choose_cached_ns/dict_lookup_ns", True, 20, "a repeated question costs a lookup"),
    Target("choose_uncached_ns/dict_lookup_ns", True, 1000, "a new question, every rule"),
    Target("plan_model_ns/dict_lookup_ns", True, 100000, "all 224 Llama-3-8B layers, cold"),
    Target("cpu_ptpc_vs_fp32_linear", True, 1.8, "PTPC layer / fp32 nn.Linear"),
    Target("cpu_ptpc_vs_bf16_linear", True, 0.35, "PTPC layer / bf16 nn.Linear"),
    Target("weight_bytes_ratio", True, 0.51, "FP8 weight + scales / bf16 weight"),
    Target("peak_extra_memory_ratio", True, 1.5, "quantize_model peak extra / one fp32 layer"),
    Target("quantize_vs_clone", False, 0.25, "quantization / clone() throughput"),
    Target("gpu_ptpc_vs_bf16_8192", True, 0.6, "PTPC layer / bf16 matmul, 8192^3"),
    Target("gpu_quant_bw_fraction", False, 0.7, "fused quantizer / copy bandwidth"),
    Target("gpu_w8a16_gemv_vs_bf16", True, 0.65, "cupy W8A16 GEMV / bf16 GEMV"),
)


def render(results: Mapping[str, Any]) -> str:
    """The figures against their targets, then the absolute numbers behind them."""
    lines = [f"{'figure':<36} {'value':>12} {'target':>12}  result"]
    for target in TARGETS:
        value = target.value(results)
        bound = f"{'<=' if target.at_most else '>='} {target.bound:g}"
        if value is None:
            lines.append(f"{target.figure:<36} {'-':>12} {bound:>12}  not measured here")
            continue
        verdict = "met" if target.met(results) else "MISSED"
        lines.append(f"{target.figure:<36} {value:>12.3f} {bound:>12}  {verdict}: {target.means}")
    lines.append("")
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
            lines.append(f"{label:<36} {shown:>14}")
    return "\n".join(lines)
