"""A model's plan before anything is downloaded: what every linear layer of the model a
``config.json`` describes would run on a device, and why not something faster.

- ``linear_layers``: the layers as vLLM builds them, from transformers' own model class
  built on the meta device (shapes, no weights; never a checkpoint's own code): its
  linears (GPT-2's Conv1D ones too), q/k/v, gate/up and DeepSeek's q_a/kv_a fused by one
  table, each split over the tensor-parallel ranks as vLLM splits it, the layers vLLM
  keeps in high precision (the output head, MoE routers but those of the
  ``QUANTIZED_ROUTERS`` models, BERT's pooler) and the weights no linear method runs
  apart (MoE experts, as 3-D parameters or one ``nn.Linear`` per expert: vLLM runs them
  in FusedMoE; any other 2-D weight no table places). Every 2-D weight is in one of them
  or an embedding.
- ``read_config`` refuses a config naming no ``architectures``, and ``check_sizes`` one
  whose sizes no model has (not positive ints, KV heads not dividing the heads, more than
  ``MAX_LAYERS`` layers) before transformers builds anything.
- ``plan_model``: each layer's ``QuantConfig`` under a scheme or the checkpoint's own
  ``quantization_config``, refused where loading would refuse it, and a
  ``kernelpick.core.ModelSummary`` of the decisions per device.

Needs transformers (``pip install 'kernelpick[transformers]'``), imported only when a
model is read.
"""

from kernelpick.plan._config import CONFIG_NAME, ModelConfig, read_config
from kernelpick.plan._layers import EXPERTS, Linear, ModelLayers, linear_layers
from kernelpick.plan._meta import TransformersUnavailableError, meta_model
from kernelpick.plan._plan import ModelPlan, plan_model, recipe_for
from kernelpick.plan._sizes import MAX_LAYERS
from kernelpick.plan._table import (
    FUSED,
    KEPT,
    QUANTIZED_ROUTERS,
    ROUTER_KEPT,
    SPLITS,
    Fused,
    Heads,
    Part,
    Split,
)

__all__ = [
    "CONFIG_NAME",
    "EXPERTS",
    "FUSED",
    "KEPT",
    "MAX_LAYERS",
    "QUANTIZED_ROUTERS",
    "ROUTER_KEPT",
    "SPLITS",
    "Fused",
    "Heads",
    "Linear",
    "ModelConfig",
    "ModelLayers",
    "ModelPlan",
    "Part",
    "Split",
    "TransformersUnavailableError",
    "linear_layers",
    "meta_model",
    "plan_model",
    "read_config",
    "recipe_for",
]
