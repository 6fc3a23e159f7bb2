"""What ``kernelpick bench`` needs to time one layer, shipped so that it works from a wheel.

``bench_layer`` times the selected kernel against the unquantized linear it replaces;
``median_seconds`` times on the device the tensors live on (CUDA events on a GPU). The
benchmark suite lives in the source tree (``benchmarks/``), not here.
"""

from kernelpick.bench._layer import RATIO, STAGES, LayerBench, Progress, bench_layer, ratio
from kernelpick.bench._timing import median_seconds

__all__ = ["RATIO", "STAGES", "LayerBench", "Progress", "bench_layer", "median_seconds", "ratio"]
