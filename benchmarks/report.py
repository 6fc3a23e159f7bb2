"""The targets of the benchmarks issue, and a table that says where each figure stands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from benchmarks.schemes import render_schemes

__all__ = ["DECODE_TARGETS", "TARGETS", "DecodeTarget", "Target", "render"]

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


@attrs.frozen
class DecodeTarget:
    """``figure`` (a key of a decode row, e.g. ``ptpc_vs_best``) at ``m`` tokens should be
    at most ``bound``, on every decode shape measured. Each is a median of per-repeat
    ratios, candidate over baseline, timed back to back within each repeat."""

    figure: str
    m: int
    bound: float

    def value(self, shape: Mapping[str, Any]) -> float | None:
        """This figure on one shape of ``results["decode"]["shapes"]``, if measured."""
        for row in shape.get("rows", ()):
            if row.get("m") == self.m and self.figure in row:
                return float(row[self.figure])
        return None

    def met(self, shape: Mapping[str, Any]) -> bool | None:
        value = self.value(shape)
        return None if value is None else value <= self.bound


DECODE_TARGETS = (
    DecodeTarget("ptpc_vs_best", 1, 0.5),
    DecodeTarget("ptpc_vs_best", 4, 0.6),
    DecodeTarget("ptpc_vs_best", 16, 0.6),
    DecodeTarget("ptpc_vs_best", 256, 1.2),
    DecodeTarget("ptpc_vs_best", 2048, 1.2),
    DecodeTarget("w8a16_vs_best", 1, 0.5),
    # Against torch's _weight_int8pack_mm (int8 weight-only), at every M (issue 27).
    *(DecodeTarget("ptpc_vs_int8pack", m, 1.0) for m in (1, 4, 16, 64, 256, 2048)),
)
# What each decode column is, for the legend under the tables.
_DECODE_NAMES = {
    "ptpc": "fp8_per_channel (W8A8, per-token activation scales)",
    "w8a16": "fp8_weight_only (W8A16)",
    "int8pack": "torch._weight_int8pack_mm, per-channel int8 weights (a peer, not selected)",
}


def _decode_target(figure: str, m: int) -> DecodeTarget | None:
    return next((t for t in DECODE_TARGETS if (t.figure, t.m) == (figure, m)), None)


def _bound(target: DecodeTarget | None) -> str:
    return "" if target is None else f"<= {target.bound:g}"


def _verdict(met: bool | None) -> str:
    return "" if met is None else "met" if met else "MISSED"


def _decode_shape(shape: Mapping[str, Any], bandwidth: float) -> list[str]:
    n, k = shape["n"], shape["k"]
    kernels: Mapping[str, str] = shape.get("kernels", {})
    degraded: Mapping[str, bool] = shape.get("degraded", {})
    builds: Mapping[str, str] = shape.get("builds", {})
    ran = ", ".join(
        f"{name}: {kernel}{f' [{builds[name]}]' if name in builds else ''}"
        f"{' (DEGRADED)' if degraded.get(name) else ''}"
        for name, kernel in kernels.items()
    )
    rotation = ", ".join(
        f"{name} {r['buffers']} x {r['bytes'] / r['buffers'] / 2**20:.1f} MiB"
        for name, r in shape.get("rotation", {}).items()
    )
    lines = [
        f"decode, N={n} K={k}  ({ran})",
        f"  floor {shape['floor_ms']:.3f} ms = FP8 weight {shape['fp8_weight_bytes'] / 2**20:.1f}"
        f" MiB / {shape.get('floor_gbps', bandwidth):.1f} GB/s (the better of {bandwidth:.1f} up"
        f" front and {shape.get('read_gbps', 0.0):.1f} in the fastest read below)",
        f"  rotation: {rotation}",
        f"  {'M':>5} {'fp32':>8} {'bf16':>8} {'fp16':>8} {'best':>5} {'ptpc':>8} {'w8a16':>8}"
        f" {'int8pack':>8} {'read':>7} (ms)  {'ptpc/floor':>10} {'w8a16/floor':>11}"
        f" {'ptpc/read':>9} {'w8a16/read':>10} {'ptpc/int8pack':>13}",
    ]
    rows: list[Mapping[str, Any]] = shape.get("rows", [])

    def ms(row: Mapping[str, Any], name: str) -> str:
        value = row["ms"].get(name)
        return "-" if value is None else f"{value:.3f}"

    def ratio(row: Mapping[str, Any], key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{float(value):.2f}"

    for row in rows:
        read = row.get("read_ms")
        lines.append(
            f"  {row['m']:>5} {ms(row, 'fp32'):>8} {ms(row, 'bf16'):>8} {ms(row, 'fp16'):>8} "
            f"{row['best']:>5} {ms(row, 'ptpc'):>8} {ms(row, 'w8a16'):>8} "
            f"{ms(row, 'int8pack'):>8} {'-' if read is None else f'{read:.3f}':>7}       "
            f"{ratio(row, 'ptpc_vs_floor'):>10} {ratio(row, 'w8a16_vs_floor'):>11} "
            f"{ratio(row, 'ptpc_vs_read'):>9} {ratio(row, 'w8a16_vs_read'):>10} "
            f"{ratio(row, 'ptpc_vs_int8pack'):>13}"
        )
    lines.append(
        f"  {'M':>5} {'ptpc_vs_best':>12} {'target':>8} {'':>6} {'ptpc_vs_fp32':>12}"
        f" {'w8a16_vs_best':>13} {'target':>8} {'':>6} {'w8a16_vs_fp32':>13}"
    )
    for row in rows:
        m = row["m"]
        cells = []
        for name in ("ptpc", "w8a16"):
            target = _decode_target(f"{name}_vs_best", m)
            met = None if target is None else target.met(shape)
            cells.append(
                f"{ratio(row, f'{name}_vs_best'):>{len(name) + 8}} "
                f"{_bound(target):>8} {_verdict(met):>6} "
                f"{ratio(row, f'{name}_vs_fp32'):>{len(name) + 8}}"
            )
        lines.append(f"  {m:>5} {cells[0]} {cells[1]}")
    return lines


def _decode(results: Mapping[str, Any]) -> list[str]:
    decode: Mapping[str, Any] | None = results.get("decode")
    if not decode:
        return []
    bandwidth = float(decode["bandwidth_gbps"])
    lines = [
        "",
        f"decode-speed layer (times: medians of {decode['repeats']} paired repeats; ratios: "
        "medians of per-repeat ratios)",
        f"  memory read bandwidth {bandwidth:.1f} GB/s (best pass of {decode['bandwidth_op']} over "
        f"{decode['bandwidth_bytes'] / 2**20:.0f} MiB); last-level cache "
        f"{decode['llc_bytes'] / 2**20:.0f} MiB; weights rotate through >= "
        f"{decode['rotation_target_bytes'] / 2**20:.0f} MiB per callable",
        "  fp32/bf16/fp16: F.linear in that dtype; best: the fastest of the three at that M",
        "  read: the FP8 weight's bytes read by that op, timed beside the kernels; floor: those"
        " bytes / the best bandwidth seen",
    ]
    act = decode.get("activation_dtype", "bfloat16")
    lines += [f"  {name}: {what}, {act} in and out" for name, what in _DECODE_NAMES.items()]
    if decode.get("cpu_isa"):
        lines.append(f"  FP8 kernels selected for CPU ISA: {', '.join(decode['cpu_isa'])}")
    for shape in decode.get("shapes", []):
        lines += ["", *_decode_shape(shape, bandwidth)]
    return lines


def _machine(results: Mapping[str, Any]) -> str:
    machine = results.get("machine", {})
    isa = ", ".join(machine.get("isa", [])) or "?"
    return (
        f"machine: {machine.get('cpu', '?')} (ISA: {isa}), torch CPU capability "
        f"{machine.get('torch_cpu_capability', '?')}, {machine.get('torch_threads', '?')} torch "
        f"threads, torch {machine.get('torch', '?')}, kernelpick {machine.get('kernelpick', '?')}"
    )


def _decode_targets(results: Mapping[str, Any]) -> list[str]:
    """The decode targets' rows of the main table: one per target and shape measured, then
    what they were divided by (the tables under "decode-speed layer" have the detail)."""
    shapes: list[Mapping[str, Any]] = results.get("decode", {}).get("shapes", [])
    lines = []
    for target in DECODE_TARGETS:
        bound = _bound(target)
        label = f"{target.figure} M={target.m}"
        if not shapes:
            lines.append(f"{label:<36} {'-':>12} {bound:>12}  not measured here")
        for shape in shapes:
            value = target.value(shape)
            shown = "-" if value is None else f"{value:.3f}"
            verdict = _verdict(target.met(shape)) or "not measured here"
            where = f"{label}, {shape['n']}x{shape['k']}"
            lines.append(f"{where:<36} {shown:>12} {bound:>12}  {verdict}")
    kernels = ", ".join(
        f"{name}: {kernel}"
        for name, kernel in (shapes[0].get("kernels", {}) if shapes else {}).items()
    )
    described: Mapping[str, str] = results.get("baselines", {})
    baseline = described.get("decode_best", "the fastest of fp32, bf16, fp16 F.linear")
    lines.append(f"    FP8 layer ({kernels or '-'}), bf16 in and out  /  {baseline}")
    return lines


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
    lines += _decode_targets(results)
    lines += ["", "absolute figures (for people; the targets judge the ratios above):"]
    absolute = [
        ("dict lookup", "dict_lookup_ns", "ns"), ("choose, cached", "choose_cached_ns", "ns"),
        ("choose, uncached", "choose_uncached_ns", "ns"),
        ("plan a Llama-3-8B", "plan_model_ns", "ns"),
        ("quantize", "quantize_gbps", "GB/s"),
        ("clone", "clone_gbps", "GB/s"), ("peak extra memory", "peak_extra_memory_mib", "MiB"),
    ]  # fmt: skip
    for label, key, unit in absolute:
        if key in results:
            value = float(results[key])
            shown = (
                f"{value / 1e3:.2f} us" if unit == "ns" and value > 1e4 else f"{value:.2f} {unit}"
            )
            lines.append(f"  {label:<34} {shown:>14}")
    lines += _decode(results)
    if results.get("schemes"):
        lines += render_schemes(results["schemes"])
    return "\n".join(lines)
