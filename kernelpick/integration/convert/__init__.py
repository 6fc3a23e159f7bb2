"""Converting a model: ``quantize_model`` swaps each eligible ``nn.Linear`` for a
``QuantizedLinear`` (every kernel selected first, so a refused model is left as it was),
and reports what it did (``ConversionReport``; ``model_summary`` reads what every layer of
any converted model runs); ``Swaps`` puts modules in place keeping
their hooks, ``dropped_by_swap`` names what a swap would lose."""

from kernelpick.integration.convert._eligible import kept_reason
from kernelpick.integration.convert._progress import ProgressBar, is_terminal
from kernelpick.integration.convert._quantize_model import quantize_model
from kernelpick.integration.convert._report import ConversionReport, LayerReport, SkippedLayer
from kernelpick.integration.convert._summary import kept_layers, model_summary, record_kept
from kernelpick.integration.convert._swap import Swaps, dropped_by_swap, model_bytes

__all__ = [
    "ConversionReport",
    "LayerReport",
    "ProgressBar",
    "SkippedLayer",
    "Swaps",
    "dropped_by_swap",
    "is_terminal",
    "kept_layers",
    "kept_reason",
    "model_bytes",
    "model_summary",
    "quantize_model",
    "record_kept",
]
