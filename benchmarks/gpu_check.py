"""Every GPU check in one script: each CUDA kernel's error and speed, and the GPU figures.

    PYTHONPATH=. python benchmarks/gpu_check.py --json gpu.json   # on a machine with a GPU
    python benchmarks/gpu_check.py --dry-run                     # anywhere: print the plan

It installs nothing and runs from the source tree. For every CUDA kernel of the catalog at
M in 1, 16 and 2048 with N = K = 8192 it measures the relative error against an fp32
reference of the same quantized operands, and the time against a bf16 ``torch.matmul`` of
the same shape, with CUDA events, in the same run. Then the benchmark figures:

- ``gpu_ptpc_vs_bf16_8192``: the selected PTPC layer (row-wise, activation quantization
  included) / bf16 matmul, at M = N = K = 8192;
- ``gpu_quant_bw_fraction``: the fused per-token quantizer's bandwidth / a device-to-device
  copy's, over 8192 x 8192 bf16;
- ``gpu_w8a16_gemv_vs_bf16``: ``cuda_w8a16_cupy`` at M = 1, N = K = 8192 / bf16 GEMV.

Sized to finish well within 4 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# Every CUDA kernel of the catalog, with a scheme it serves. A case the device cannot run
# is reported with the selector's reasons instead of a time: block FP8 off SM 9.0, MXFP8
# off SM 10.x/12.x, and int8 at M <= 16 (torch._int_mm on a GPU needs M > 16).
KERNELS = {
    "cuda_rowwise_scaled_mm": "fp8_per_channel",
    "cuda_block_scaled_mm": "fp8_block",
    "cuda_mxfp8_scaled_mm": "mxfp8",
    "cuda_tensorwise_scaled_mm": "fp8_per_tensor",
    "cuda_channelwise_unfused": "fp8_per_channel",
    "cuda_int8_int_mm": "int8_per_channel",
    "cuda_int8_int_mm_padded": "int8_per_channel",
    "cuda_w8a16_cupy": "fp8_weight_only",
    "cuda_w8a16_torch": "fp8_weight_only",
}
# Kernels whose rules turn down some of the cases on every device, or on most.
_NOTES = {
    "cuda_block_scaled_mm": "SM 9.0 only",
    "cuda_mxfp8_scaled_mm": "SM 10.x / 12.x only",
    "cuda_int8_int_mm": "M > 16 only",
}
TOKENS = (1, 16, 2048)
SIZE = 8192


@dataclass(frozen=True)
class Case:
    kernel: str
    scheme: str
    m: int
    n: int
    k: int


def plan() -> list[Case]:
    return [Case(k, s, m, SIZE, SIZE) for k, s in KERNELS.items() for m in TOKENS]


def _print_plan(cases: list[Case]) -> None:
    print(f"{len(cases)} kernel cases (error vs fp32 reference, time vs bf16 torch.matmul):")
    for case in cases:
        note = _NOTES.get(case.kernel, "")
        line = f"  {case.kernel:<28} {case.scheme:<16} M={case.m:<5} N={case.n} K={case.k}"
        print(f"{line}  ({note})" if note else line)
    print("figures: gpu_ptpc_vs_bf16_8192, gpu_quant_bw_fraction, gpu_w8a16_gemv_vs_bf16")


def _timer(repeats: int) -> Callable[[Callable[[], object]], float]:
    """A median-of-``repeats`` timer in milliseconds on the current GPU: CUDA events around
    each run, the same timer as ``kernelpick bench``."""
    import torch

    from kernelpick.bench import median_seconds

    device = torch.device("cuda", torch.cuda.current_device())

    def median_ms(run: Callable[[], object]) -> float:
        return median_seconds(run, repeats, device) * 1e3

    return median_ms


Timer = Callable[[Callable[[], object]], float]


def _run_case(case: Case, caps: Any, median_ms: Timer) -> dict[str, Any]:
    import torch

    import kernelpick as kp
    from kernelpick.kernels import bind, dequantize_weight, quantize_canonical

    record: dict[str, Any] = asdict(case)
    # Each call passes case.m rows, which a kernel with a floor on M (int8) reads.
    config = kp.quant_config(case.scheme, weight_shape=(case.n, case.k), min_tokens=case.m)
    decision = kp.choose(caps, config, kp.Policy(force=case.kernel))
    if isinstance(decision, kp.Rejected):
        why = [r.render() for r in decision.reasons if r.kernel == case.kernel]
        record["status"] = "rejected: " + "; ".join(why)
        return record
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(case.m)
    x = torch.randn(case.m, case.k, device=device, generator=generator).to(torch.bfloat16)
    w = torch.randn(case.n, case.k, device=device, generator=generator) / case.k**0.5
    kernel = bind(case.kernel, config, caps, device)
    fp8_weight, scale = quantize_canonical(w, config)
    bundle = kernel.prepare_weights(fp8_weight, scale)
    out = kernel.apply(x, bundle).float()
    # The reference multiplies the same quantized operands in fp32.
    w_deq = dequantize_weight(fp8_weight, scale, config)
    x_deq = _activation_reference(x, config, caps)
    reference = x_deq @ w_deq.t()
    exact = x.float() @ w.t()
    w_bf16 = w.to(torch.bfloat16)
    kernel_ms = median_ms(lambda: kernel.apply(x, bundle))
    bf16_ms = median_ms(lambda: torch.matmul(x, w_bf16.t()))
    record.update(
        status="ok",
        error_vs_reference=float(torch.linalg.norm(out - reference) / torch.linalg.norm(reference)),
        error_vs_unquantized=float(torch.linalg.norm(out - exact) / torch.linalg.norm(exact)),
        kernel_ms=kernel_ms,
        bf16_matmul_ms=bf16_ms,
        vs_bf16=kernel_ms / bf16_ms,
    )
    return record


def _activation_reference(x: Any, config: Any, caps: Any) -> Any:
    """The activation as the kernel should see it, quantized with torch ops (so the fused
    cupy quantizer is checked too) and dequantized to fp32."""
    from kernelpick.core import Dtype, GroupShape
    from kernelpick.kernels._quantize import (
        dequantize,
        quantize,
        quantize_per_tensor,
        quantize_per_token,
    )

    act = config.activation
    if act is None:
        return x.float()
    fmt = Dtype.INT8 if act.dtype is Dtype.INT8 else caps.fp8_format
    group = act.scale.group
    if group in (GroupShape.PER_TOKEN, GroupShape.PER_TENSOR):
        per_token = group == GroupShape.PER_TOKEN
        xq, x_scale = (quantize_per_token if per_token else quantize_per_tensor)(x, fmt)
        return xq.float() * x_scale
    shape = (group.rows, group.cols)
    xq, x_scale = quantize(x, shape, fmt, act.scale.dtype)
    return dequantize(xq, x_scale, shape)


def _figures(caps: Any, median_ms: Timer) -> dict[str, Any]:
    import torch

    from kernelpick.core import Dtype
    from kernelpick.kernels._cupy_quant import quantize_per_token_cupy
    from kernelpick.kernels._cupy_runtime import cupy_usable

    figures: dict[str, Any] = {}
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(SIZE, SIZE, device=device).to(torch.bfloat16)
    ptpc_case = Case("cuda_rowwise_scaled_mm", "fp8_per_channel", SIZE, SIZE, SIZE)
    ptpc = _run_case(ptpc_case, caps, median_ms)
    if ptpc["status"] == "ok":
        figures["gpu_ptpc_vs_bf16_8192"] = ptpc["vs_bf16"]
    if cupy_usable():
        fp8 = Dtype.FLOAT8_E4M3FN
        quant_ms = median_ms(lambda: quantize_per_token_cupy(x, fp8))
        moved = x.numel() * (2 + 1) + SIZE * 4  # read bf16, write FP8 and the scales
        copy_dst = torch.empty_like(x)
        copy_ms = median_ms(lambda: copy_dst.copy_(x))
        copy_moved = 2 * x.numel() * 2  # read and write bf16
        figures["gpu_quant_bw_fraction"] = (moved / quant_ms) / (copy_moved / copy_ms)
        figures["gpu_quant_gbps"] = moved / quant_ms / 1e6
        figures["gpu_copy_gbps"] = copy_moved / copy_ms / 1e6
        gemv = _run_case(Case("cuda_w8a16_cupy", "fp8_weight_only", 1, SIZE, SIZE), caps, median_ms)
        if gemv["status"] == "ok":
            figures["gpu_w8a16_gemv_vs_bf16"] = gemv["vs_bf16"]
    return figures


def _table(records: list[dict[str, Any]]) -> str:
    head = ("kernel", "M", "kernel ms", "bf16 ms", "vs bf16", "err/ref", "err/exact")
    lines = ["{:<28} {:>5} {:>10} {:>9} {:>8} {:>9} {:>9}".format(*head)]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"{r['kernel']:<28} {r['m']:>5} {r['status']}")
            continue
        times = f"{r['kernel_ms']:>10.4f} {r['bf16_matmul_ms']:>9.4f} {r['vs_bf16']:>8.3f}"
        errors = f"{r['error_vs_reference']:>9.2e} {r['error_vs_unquantized']:>9.2e}"
        lines.append(f"{r['kernel']:<28} {r['m']:>5} {times} {errors}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    cases = plan()
    if args.dry_run:
        _print_plan(cases)
        return 0
    import torch

    import kernelpick as kp

    if not torch.cuda.is_available() or torch.version.hip is not None:
        print("gpu_check: needs an NVIDIA GPU; torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    caps = kp.probe("cuda")
    print(f"device: {caps.render()}")
    median_ms = _timer(args.repeats)
    records = [_run_case(case, caps, median_ms) for case in cases]
    print(_table(records))
    figures = _figures(caps, median_ms)
    for name, value in figures.items():
        print(f"{name}: {value:.3f}")
    machine = {
        "device": caps.render(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "libraries": sorted(caps.libraries),
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine, "cases": records, "figures": figures}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
