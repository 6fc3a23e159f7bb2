"""Benchmarks that ship with the package, so ``kernelpick bench`` works from a wheel.

``run_suite`` measures decision cost and kernel speed side by side in one run, each figure a
ratio against a baseline timed in the same process; ``bench_layer`` times one layer.
"""

from kernelpick.bench._layer import LayerBench, bench_layer
from kernelpick.bench._report import TARGETS, Target, render
from kernelpick.bench._suite import SuiteConfig, run_suite

__all__ = ["TARGETS", "LayerBench", "SuiteConfig", "Target", "bench_layer", "render", "run_suite"]
