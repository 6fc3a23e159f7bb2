"""Checkpoint formats: what a checkpoint's config says about its tensors, and the rules
that read a model's own settings.

- ``Layout``: a checkpoint's scheme, block size, which modules it quantizes and what it
  names their tensors (``layout.recipe``: the recipe its layers are made with);
  ``read_layout`` picks the reader by ``quant_method``: ``compressed_tensors`` (what
  ``save_quantized`` writes) or ``fine_grained_fp8`` (transformers' FineGrainedFP8).
- ``check_e8m0_dtype``: a file header's refusal of a tensor that cannot be an E8M0 scale
  (mxfp8's ``weight_scale``, stored as its uint8 bytes: ``kernelpick.kernels.E8M0_STORED``).
- What a module is from its name alone (a checkpoint's headers): ``experts_module``, the
  MoE experts vLLM runs in FusedMoE (``FUSED_MOE``), which ``kernelpick plan`` reads too;
  ``stand_in``, the module a stored weight is read as (an embedding, a router, GPT-2's
  ``Conv1D`` by the model type's names, ``conv1d_names``, or a linear).
- ``modules_to_not_convert``: transformers' pattern rule (``check_patterns``, ``kept``),
  the one rule every engine applies; the output head's one default (``output_heads``).
- A model's quantization config: ``quantization_config``, ``record`` (what
  ``save_pretrained`` writes), ``check_one_config``, ``fp32_modules``, ``quantized_layers``.
- ``config_dtype``: the dtype a ``config.json`` states (``dtype``, ``torch_dtype``).
"""

from kernelpick.integration.formats._config_dtype import (
    DTYPE_KEY,
    DTYPE_KEYS,
    VALID_DTYPES,
    config_dtype,
)
from kernelpick.integration.formats._conv1d import CONV1D_KEPT, Conv1D, conv1d_names, is_conv1d
from kernelpick.integration.formats._head import HEAD_PATTERNS, OUTPUT_HEAD_KEPT, output_heads
from kernelpick.integration.formats._json_file import MAX_JSON_BYTES, read_json_object
from kernelpick.integration.formats._layout import (
    QUANTIZATION_CONFIG,
    Layout,
    Stored,
    check_e8m0_dtype,
)
from kernelpick.integration.formats._model_config import (
    check_one_config,
    fp32_modules,
    quantization_config,
    quantized_layers,
    record,
)
from kernelpick.integration.formats._module_names import (
    EMBEDDINGS,
    EXPERT_LINEARS,
    FUSED_MOE,
    ROUTERS,
    experts_module,
    moe_block,
    stand_in,
)
from kernelpick.integration.formats._patterns import check_patterns, kept
from kernelpick.integration.formats._read import read_layout

__all__ = [
    "CONV1D_KEPT",
    "DTYPE_KEY",
    "DTYPE_KEYS",
    "EMBEDDINGS",
    "EXPERT_LINEARS",
    "FUSED_MOE",
    "HEAD_PATTERNS",
    "MAX_JSON_BYTES",
    "OUTPUT_HEAD_KEPT",
    "QUANTIZATION_CONFIG",
    "ROUTERS",
    "VALID_DTYPES",
    "Conv1D",
    "Layout",
    "Stored",
    "check_e8m0_dtype",
    "check_one_config",
    "check_patterns",
    "config_dtype",
    "conv1d_names",
    "experts_module",
    "fp32_modules",
    "is_conv1d",
    "kept",
    "moe_block",
    "output_heads",
    "quantization_config",
    "quantized_layers",
    "read_json_object",
    "read_layout",
    "record",
    "stand_in",
]
