"""Run the benchmark suite: decision cost and kernel speed, side by side in one run.

    .venv/bin/python benchmarks/run.py --quick --json out.json   # from the repository root

Without a size flag it is the reported run (decode figures at N = K = 4096); ``--full`` adds
the 14336 x 4096 decode shape, ``--quick`` cuts the decision loops and repeats (the decode
sweep stays whole), ``--tiny`` only shows the harness works (CI). ``python -m
benchmarks.run`` works as well. The GPU figures come from ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs
import torch

# Run as a script, Python puts benchmarks/ itself on the path, not the repository root that
# the ``benchmarks`` package (and, without an install, ``kernelpick``) is imported from.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kernelpick as kp  # noqa: E402
from benchmarks.decode import ACTIVATION, ACTIVATIONS  # noqa: E402
from benchmarks.report import render  # noqa: E402  (needs ROOT on the path)
from benchmarks.suite import SuiteConfig, run_suite  # noqa: E402
from kernelpick.core import CpuArch  # noqa: E402

__all__ = ["main"]

# Bumped when a key of the JSON record changes meaning or goes away. 2: the decode figures
# (``decode``) replaced ``cpu_ptpc_*``, ``cpu_fp32_linear_ms`` and ``cpu_bf16_linear_ms``.
SCHEMA_VERSION = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer decision repeats")
    size.add_argument("--full", action="store_true", help="also the 14336 x 4096 decode shape")
    size.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke run (CI)")
    parser.add_argument(
        "--cpu-isa", default=None, metavar="FLAGS",
        help="comma-separated ISA flags to select the FP8 kernels for (e.g. avx2,fma,f16c)",
    )  # fmt: skip
    parser.add_argument(
        "--activation", choices=ACTIVATIONS, default=ACTIVATION,
        help="the decode and scheme layers' input and output dtype (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="torch threads for the whole run (default: torch's own), recorded in the JSON",
    )  # fmt: skip
    parser.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="PATH",
        help="also write the results as JSON to PATH, or (without one) only JSON to stdout",
    )  # fmt: skip
    return parser


def _cpu_isa(parser: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """The flags of ``--cpu-isa``: some, and each one this CPU has (the kernels built for
    them must run here; a misspelled flag would silently pick another build)."""
    flags = tuple(sorted({flag.strip().lower() for flag in text.split(",") if flag.strip()}))
    host = kp.probe("cpu").arch
    have = host.isa if isinstance(host, CpuArch) else frozenset()
    if not flags:
        parser.error("--cpu-isa: give at least one ISA flag, e.g. avx2,fma,f16c")
    missing = [flag for flag in flags if flag not in have]
    if missing:
        parser.error(
            f"--cpu-isa: this CPU lacks {', '.join(missing)}; it has {', '.join(sorted(have))}"
        )
    return flags


def main(argv: list[str] | None = None) -> int:
    """Run the suite at the size asked for, print the table, write JSON if asked."""
    parser = _parser()
    args = parser.parse_args(argv)
    sizes = {"tiny": SuiteConfig.tiny, "quick": SuiteConfig.quick, "full": SuiteConfig.full}
    config = next((make() for name, make in sizes.items() if getattr(args, name)), SuiteConfig())
    if args.cpu_isa is not None:
        config = attrs.evolve(config, cpu_isa=_cpu_isa(parser, args.cpu_isa))
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads: {args.threads}; give 1 or more")
        torch.set_num_threads(args.threads)
    config = attrs.evolve(config, activation=args.activation)
    results = {"schema_version": SCHEMA_VERSION, **run_suite(config)}
    if args.json == "-":
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
