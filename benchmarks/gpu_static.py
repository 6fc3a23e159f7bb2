"""Static cost of the cupy kernels: SASS instructions in their hot loops, with no GPU.

    python benchmarks/gpu_static.py            # sm_80 and sm_90, text
    python benchmarks/gpu_static.py --json static.json --arch sm_90

Each kernel is rendered as its op would render it (the module's own spec choice), compiled
with nvcc to a cubin, and disassembled with cuobjdump (on PATH, or from the
``nvidia-cuda-cuobjdump`` wheel). A loop is a backward branch and the instructions from its
target to the branch; an innermost loop holds no other loop. The figures:

- the W8A16 GEMV: instructions of its innermost loop per weight byte a thread consumes per
  iteration (``GemvSpec.weight_bytes_per_step``), for the M = 1 specialization;
- the per-token quantizer: the sum over its innermost loops (the amax pass and the quantize
  pass) of instructions per element (``QuantSpec.vec`` elements per iteration).

The loops are written ``#pragma unroll 1`` so that one iteration is one step; the figure is
a count of the code the loop runs, not a timing, and the same nvcc gives the same count.
Targets on sm_90 (issue 26): the GEMV <= 4 per weight byte, the quantizer <= 12 per element.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

TARGETS = {"gemv": 4.0, "quant": 12.0}
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.MULTILINE)
_BRANCH = re.compile(r"\bBRA\b(?:\s+\S+)?\s+0x([0-9a-f]+)")


@dataclass(frozen=True)
class Loop:
    start: int  # address of the branch target
    end: int  # address of the backward branch
    instructions: int


def loops(sass: str) -> list[Loop]:
    """Every loop of one function's SASS: a backward branch to an earlier address (a branch
    to itself, the trap after EXIT, is not a loop)."""
    found = []
    for match in _INSTRUCTION.finditer(sass):
        address, text = int(match.group(1), 16), match.group(2)
        branch = _BRANCH.search(text)
        if branch is None:
            continue
        target = int(branch.group(1), 16)
        if target < address:
            found.append(Loop(target, address, (address - target) // 16 + 1))
    return found


def innermost(all_loops: Sequence[Loop]) -> list[Loop]:
    """The loops that contain no other loop."""
    return [
        outer
        for outer in all_loops
        if not any(
            inner != outer and outer.start <= inner.start and inner.end <= outer.end
            for inner in all_loops
        )
    ]


def cuobjdump() -> str | None:
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    wheel = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / "cuobjdump"
    return str(wheel) if wheel.exists() else None


def compile_sass(source: str, arch: str, tool: str) -> tuple[str, str]:
    """(SASS, ptxas resource report) of ``source`` compiled for ``arch`` (``sm_90``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        cu.write_text(source)
        built = subprocess.run(
            ["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(cubin), str(cu)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        # cuobjdump runs nvdisasm, which the wheel puts beside it.
        env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ['PATH']}"}
        sass = subprocess.run(
            [tool, "-sass", str(cubin)], capture_output=True, text=True, check=True, env=env
        ).stdout
    return sass, built.stderr


@dataclass(frozen=True)
class Figure:
    kernel: str
    arch: str
    what: str  # "gemv" (per weight byte) or "quant" (per element)
    loop_instructions: list[int]
    per_unit: float
    target: float | None
    stack_bytes: int | None
    spills: int | None


def _resources(report: str) -> tuple[int | None, int | None]:
    stack = re.search(r"(\d+) bytes stack frame", report)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", report)
    return (
        int(stack.group(1)) if stack else None,
        sum(int(s) for s in spills) if spills else None,
    )


def measure(name: str, source: str, arch: str, what: str, units: list[int], tool: str) -> Figure:
    """``units[i]``: the bytes or elements one iteration of the i-th innermost loop consumes,
    in address order."""
    sass, report = compile_sass(source, arch, tool)
    inner = sorted(innermost(loops(sass)), key=lambda loop: loop.start)
    counts = [loop.instructions for loop in inner]
    if len(units) == 1:  # one step size for every innermost loop
        units = units * len(inner)
    per_unit = sum(c / u for c, u in zip(counts, units, strict=True))
    if what == "gemv":
        per_unit = max(c / u for c, u in zip(counts, units, strict=True))  # the hot loop
    stack, spills = _resources(report)
    target = TARGETS[what] if arch == "sm_90" else None
    return Figure(name, arch, what, counts, per_unit, target, stack, spills)


def _cases() -> list[tuple[str, str, str, list[int]]]:
    """(name, source, what, units) of each kernel as its op renders it for M = 1, bf16/fp16,
    aligned rows (16-byte loads)."""
    from kernelpick.core import Dtype
    from kernelpick.kernels._cupy_gemv import GemvSpec, gemv_m_tile, render_gemv
    from kernelpick.kernels._cupy_quant import QuantSpec, render_quant_per_token

    bf16, fp16, fn = Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT8_E4M3FN
    cases = []
    for x in (bf16, fp16):
        # 16-byte weight loads; one iteration of the K loop is one chunk of K.
        spec = GemvSpec(x, x, fn, 16, gemv_m_tile(1))
        cases.append((spec.name, render_gemv(spec), "gemv", [spec.weight_bytes_per_step]))
    for x in (bf16, fp16):
        quant = QuantSpec(x, fn, 8)
        cases.append((quant.name, render_quant_per_token(quant), "quant", [quant.vec]))
    return cases


def _table(figures: list[Figure]) -> str:
    lines = [f"{'kernel':<52} {'arch':<6} {'loops':<14} {'per unit':>9} {'target':>7} stack"]
    for f in figures:
        unit = "/byte" if f.what == "gemv" else "/elem"
        target = "" if f.target is None else f"<= {f.target:g}"
        loops_text = "+".join(str(c) for c in f.loop_instructions)
        lines.append(
            f"{f.kernel:<52} {f.arch:<6} {loops_text:<14} {f.per_unit:>6.2f}{unit} "
            f"{target:>7} {f.stack_bytes}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", help="sm_80, sm_90 (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    tool = cuobjdump()
    if shutil.which("nvcc") is None or tool is None:
        print("gpu_static: needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")
        return 1
    figures = [
        measure(name, source, arch, what, units, tool)
        for arch in args.arch or ["sm_80", "sm_90"]
        for name, source, what, units in _cases()
    ]
    print(_table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in figures], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
