"""benchmarks/gpu_static.py: the loop finder on known SASS, and the harness end to end where
nvcc and cuobjdump are present (the figures themselves are stated in docs/benchmarks.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_static import Loop, cuobjdump, innermost, loops

ROOT = Path(__file__).resolve().parents[2]

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R0, c[0x0][0x210], PT ;
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0030*/                   FMNMX R3, R3, R2, !PT ;
        /*0040*/               @!P0 BRA 0x20 ;
        /*0050*/                   FMUL R3, R3, R3 ;
        /*0060*/                   FFMA R6, R3, R2, R6 ;
        /*0070*/                   ISETP.GE.AND P1, PT, R0, R7, PT ;
        /*0080*/               @!P1 BRA 0x60 ;
        /*0090*/               @!P2 BRA 0x50 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0 ;
"""


def test_a_loop_is_a_backward_branch_and_the_trap_is_not() -> None:
    found = loops(SASS)
    assert found == [Loop(0x20, 0x40, 3), Loop(0x60, 0x80, 3), Loop(0x50, 0x90, 5)]


def test_innermost_loops_hold_no_other_loop() -> None:
    assert innermost(loops(SASS)) == [Loop(0x20, 0x40, 3), Loop(0x60, 0x80, 3)]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("nvcc") is None or cuobjdump() is None, reason="needs nvcc and cuobjdump"
)
def test_the_harness_counts_every_kernel_it_renders(tmp_path: Path) -> None:
    out = tmp_path / "static.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_static.py", "--arch", "sm_90", "--json", str(out)],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert {f["what"] for f in figures} == {"gemv", "quant"}
    for figure in figures:
        assert figure["loop_instructions"], figure
        assert figure["per_unit"] > 0, figure
        assert figure["target"] is not None  # sm_90 has a target
