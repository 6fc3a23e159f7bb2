"""The vLLM quantization config of ``kernelpick.engines.vllm``; importing this module
imports vLLM. Its layers' method is ``_method.KernelpickLinearMethod``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from kernelpick.core import DeviceCaps, InvalidValueError, Policy, Scheme
from kernelpick.engines.vllm._method import KernelpickLinearMethod
from kernelpick.integration import CheckpointFormat, QuantizedLinearMethod, Recipe
from kernelpick.integration.formats import check_patterns, kept
from kernelpick.integration.formats import compressed_tensors as ct
from kernelpick.integration.layer import LayerSteps

__all__ = ["KernelpickConfig", "KernelpickLinearMethod", "register_config"]

# The keys of a checkpoint's quantization_config this config reads; any other is refused.
# ``format_version`` is what kernelpick's transformers quantizer writes with the canonical
# FP8/int8 tensors it saves (save_pretrained): such a checkpoint is pre-quantized.
_KEYS = (
    "quant_method", "scheme", "block_size", "group_size", "symmetric", "checkpoint_format",
    "modules_to_not_convert", "format_version",
)  # fmt: skip
_FORMAT_VERSIONS = (1,)
_NAME = "kernelpick"


class KernelpickConfig(QuantizationConfig):
    """kernelpick's quantization config for vLLM: one ``scheme`` for every linear layer.

    ``checkpoint_format`` is ``"high_precision"`` (quantize the checkpoint's float weights
    on load; the scheme must be one of ``ONLINE_SCHEMES``) or ``"pre_quantized"`` (canonical
    FP8/int8 weights with ``weight_scale``, as kernelpick writes them; an integer
    weight-only scheme's pack-quantized tensors). ``block_size`` is ``fp8_block``'s;
    ``group_size``, ``symmetric`` and ``act_order`` the integer schemes' (a
    compressed-tensors checkpoint's own, when it is read). Layers ``modules_to_not_convert``
    matches stay unquantized, by transformers' rule (see ``_patterns``; a fused layer by
    its shards' names, which must agree). ``caps`` is the device kernels are selected for
    (None: ``kp.probe()`` of the current device) and ``policy`` kernelpick's policy
    (None: from ``KERNELPICK_*`` variables); both exist for callers and tests, and a
    checkpoint cannot set them.
    """

    def __init__(
        self,
        scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
        *,
        block_size: int | None = None,
        group_size: int | None = None,
        symmetric: bool = True,
        act_order: bool = False,
        checkpoint_format: CheckpointFormat | str = CheckpointFormat.HIGH_PRECISION,
        modules_to_not_convert: Sequence[str] = (),
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        compressed_tensors: ct.CompressedTensorsLayout | None = None,
    ) -> None:
        super().__init__()
        # Checked here, purely: a value kernelpick refuses (block_size, say) is an error
        # when the config is made, not at the first layer, and nothing is probed for it.
        self.recipe = Recipe.of(
            scheme, checkpoint_format=checkpoint_format, block_size=block_size,
            group_size=group_size, symmetric=symmetric, act_order=act_order,
        )  # fmt: skip
        self.scheme = self.recipe.scheme
        self.checkpoint_format = self.recipe.checkpoint_format
        self.block_size = self.recipe.block_size
        self.modules_to_not_convert = check_patterns(modules_to_not_convert)
        self.caps = caps
        self.policy = policy
        self.compressed_tensors = compressed_tensors
        self._method: QuantizedLinearMethod | None = None

    @property
    def method(self) -> QuantizedLinearMethod:
        """kernelpick's linear method for every layer of this config, made once, at the
        first layer: the device is probed and the policy read then, not per layer. Each
        layer takes it at its own tensor-parallel place (``with_tensor_parallel``)."""
        if self._method is None:
            steps = LayerSteps.create(self.recipe, self.caps, self.policy)
            self._method = QuantizedLinearMethod.of(steps)
        return self._method

    def __repr__(self) -> str:
        return (
            f"KernelpickConfig(scheme={self.scheme.value!r}, checkpoint_format="
            f"{self.checkpoint_format.value!r}, block_size={self.block_size!r})"
        )

    def get_name(self) -> str:
        return _NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        # No floor of vLLM's: kernelpick's selection decides per device and per layer, and
        # says why when no kernel fits (an a100 runs fp8_weight_only and int8, not PTPC).
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # the config is the checkpoint's quantization_config, in config.json

    @classmethod
    def override_quantization_method(
        cls, hf_quant_cfg: dict[str, Any], user_quant: str | None, hf_config: Any = None
    ) -> str | None:
        """Claim a compressed-tensors checkpoint only when the user asked for kernelpick
        (``quantization="kernelpick"``): otherwise vLLM's own compressed-tensors support
        serves it, as it would without kernelpick installed."""
        if user_quant != _NAME or not isinstance(hf_quant_cfg, Mapping):
            return None
        return _NAME if hf_quant_cfg.get("quant_method") == ct.METHOD else None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> KernelpickConfig:
        """The config a checkpoint's ``quantization_config`` describes: kernelpick's own
        (see ``_KEYS``), or a compressed-tensors one that ``override_quantization_method``
        claimed (read by kernelpick's reader, which refuses what it does not understand)."""
        if not isinstance(config, Mapping):
            raise InvalidValueError("quantization_config", type(config).__name__, "a dict")
        if config.get("quant_method") == ct.METHOD:
            layout = ct.from_config("quantization_config (compressed-tensors)", config)
            return cls(
                layout.scheme, block_size=layout.block_size, group_size=layout.group_size,
                symmetric=layout.symmetric, act_order=layout.act_order,
                checkpoint_format="pre_quantized", compressed_tensors=layout,
            )  # fmt: skip
        unknown = sorted(str(key) for key in config if key not in _KEYS)
        if unknown:
            raise InvalidValueError("quantization_config keys", unknown, f"only {', '.join(_KEYS)}")
        method = config.get("quant_method", _NAME)
        if method != _NAME:
            raise InvalidValueError("quantization_config quant_method", method, repr(_NAME))
        saved = "format_version" in config
        if saved and config["format_version"] not in _FORMAT_VERSIONS:
            expected = f"one of {_FORMAT_VERSIONS} (the layouts this kernelpick reads)"
            raise InvalidValueError("format_version", config["format_version"], expected)
        default = "pre_quantized" if saved else "high_precision"
        return cls(
            config.get("scheme", Scheme.FP8_PER_CHANNEL.value),
            block_size=config.get("block_size"),
            group_size=config.get("group_size"),
            symmetric=config.get("symmetric", True),
            checkpoint_format=config.get("checkpoint_format", default),
            modules_to_not_convert=config.get("modules_to_not_convert") or (),
        )

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if not isinstance(layer, LinearBase):
            return None  # embeddings, lm_head (a vocab-parallel embedding), attention, MoE
        if self._keeps(prefix) or not self._quantizes(layer, prefix):
            return UnquantizedLinearMethod()
        return KernelpickLinearMethod(self, prefix)

    def _names(self, prefix: str) -> list[str]:
        """The names the checkpoint gives a layer: its own, or for a layer vLLM fused
        (qkv_proj, gate_up_proj) its shards' (``packed_modules_mapping``)."""
        parent, _, last = prefix.rpartition(".")
        shards = self.packed_modules_mapping.get(last) or [last]
        return [f"{parent}.{shard}" if parent else shard for shard in shards]

    def _keeps(self, prefix: str) -> bool:
        """Whether ``modules_to_not_convert`` keeps this layer in high precision, by the rule
        transformers' quantizer uses (``_patterns``): by its own name, or for a fused layer
        by its shards' names, which must agree."""
        if kept(prefix, self.modules_to_not_convert):  # named as vLLM names it: qkv_proj
            return True
        roles = {name: kept(name, self.modules_to_not_convert) for name in self._names(prefix)}
        if len(set(roles.values())) > 1:
            raise InvalidValueError(
                f"modules_to_not_convert for the fused layer {prefix}", roles,
                "its shards all kept in high precision or all quantized: vLLM runs them as "
                "one layer",
            )  # fmt: skip
        return next(iter(roles.values()))

    def _quantizes(self, layer: torch.nn.Module, prefix: str) -> bool:
        """Whether a compressed-tensors checkpoint quantized this layer (True for kernelpick's
        own config). A layer vLLM fused (qkv_proj, gate_up_proj) is looked up by the names
        the checkpoint has, its shards' (``packed_modules_mapping``); they must agree."""
        layout = self.compressed_tensors
        if layout is None:
            return True
        names = self._names(prefix)
        roles = {name: bool(ct.matches(name, layer, layout.targets))
                 and not ct.matches(name, layer, layout.ignore) for name in names}  # fmt: skip
        if len(set(roles.values())) > 1:
            raise InvalidValueError(
                f"compressed-tensors ignore list for the fused layer {prefix}", roles,
                "its shards all quantized or all kept in high precision",
            )  # fmt: skip
        return next(iter(roles.values()))


def register_config(name: str) -> None:
    """Register ``KernelpickConfig`` under ``name`` (vLLM overwrites an earlier one)."""
    register_quantization_config(name)(KernelpickConfig)
