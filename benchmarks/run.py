"""Run the benchmark suite: decision cost and kernel speed, side by side in one run.

    python benchmarks/run.py --quick --json out.json

A thin entry point to ``kernelpick.bench`` (``kernelpick bench --suite`` runs the same from
an installed wheel). The GPU figures come from ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import sys

from kernelpick.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--suite", *sys.argv[1:]]))
