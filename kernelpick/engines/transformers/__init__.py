"""kernelpick as a transformers quantizer: ``quantization_config=KernelpickConfig(...)``.

Importing this module registers the config and the quantizer under the name
``"kernelpick"`` (transformers has no entry points for quantizers, so import it before
``from_pretrained``). Then::

    import kernelpick.engines.transformers  # registers "kernelpick"
    from kernelpick.engines.transformers import KernelpickConfig

    model = AutoModel.from_pretrained(path, quantization_config=KernelpickConfig())
    model.save_pretrained(out)  # compressed-tensors: stock readers load it quantized
    again = AutoModel.from_pretrained(out)  # transformers' compressed-tensors support
    kp.integration.load_quantized(skeleton, out)  # or kernelpick's kernels again

Quantize-on-load selects a kernel for every eligible ``nn.Linear`` on the meta skeleton
before any weight is allocated (a rejection raises ``KernelSelectionError`` with every
reason), swaps it for an ``QuantizedLinear`` and quantizes each weight as it loads; a weight
kernelpick refuses (NaN, say) raises kernelpick's error, not transformers' generic one.

The output head stays in high precision unless ``modules_to_not_convert`` says otherwise
(None, the default: the model's output heads, whatever they are called, are kept; a list,
even ``[]``, is used as given). Once loaded, the model's summary (what each layer runs and
which were kept, and why: ``kernelpick.integration.model_summary(model)``) is logged once
at INFO on the ``kernelpick.engines.transformers`` logger.

``save_pretrained`` writes one format, the one ``save_quantized`` writes: the canonical
tensors with a compressed-tensors ``quantization_config``, which transformers (with
compressed-tensors installed), vLLM and SGLang load as the quantized model it is, with or
without kernelpick. Checkpoints an earlier kernelpick wrote under ``quant_method``
``"kernelpick"`` (``format_version`` 1) still load here, pre-quantized, every tensor
checked; without this import transformers would only warn about that unknown method and
cast their FP8 or int8 weights into plain linears, with no scales.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, cast

import attrs
import torch
from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin, QuantizationMethod

from kernelpick.adapters import default_caps
from kernelpick.core import DeviceCaps, InvalidValueError, ModelSummary, Policy, Scheme
from kernelpick.engines.transformers._kept import keep_rule
from kernelpick.engines.transformers._layers import HfLayers
from kernelpick.engines.transformers._stored import check_high_precision
from kernelpick.integration import CheckpointError, model_summary, quantization_config
from kernelpick.integration.convert import kept_layers, record_kept
from kernelpick.integration.formats import check_patterns, kernelpick_v1
from kernelpick.integration.layer import (
    CheckpointFormat,
    LayerSteps,
    Recipe,
    accept_before_loading,
    refuse_integer,
)

__all__ = ["LOGGER", "METHOD", "KernelpickConfig", "KernelpickHfQuantizer"]

LOGGER = logging.getLogger("kernelpick.engines.transformers")

METHOD = kernelpick_v1.METHOD
FORMAT_VERSION = kernelpick_v1.FORMAT_VERSION  # what an earlier save_pretrained wrote
_KEYS = kernelpick_v1.KEYS
_QUANTIZED_DTYPES = ("F8_E4M3", "F8_E5M2", "I8")  # safetensors' names
_WHERE = "transformers from_pretrained"


class KernelpickConfig(QuantizationConfigMixin):
    """What ``from_pretrained`` quantizes with kernelpick: ``scheme`` (one of
    ``kernelpick.integration.ONLINE_SCHEMES``), the modules kept in high precision
    (``modules_to_not_convert``: transformers' patterns, a name prefix at a module
    boundary, a regex or a suffix; None keeps the model's output heads, and is saved as
    None, so a reload applies the same default), for ``fp8_block``
    ``block_size`` (None: 128), and for the integer weight-only schemes
    ``group_size`` (None: the scheme's; -1 per channel) and ``symmetric``. ``caps`` and
    ``policy`` (not saved) choose the device to select for (default ``kp.probe`` of the
    load device) and the policy (default ``Policy.from_env``). Every value is checked
    here; a bad one raises ``InvalidValueError`` naming it and the valid ones."""

    def __init__(
        self,
        scheme: Scheme | str = Scheme.FP8_PER_CHANNEL,
        modules_to_not_convert: list[str] | None = None,
        block_size: int | None = None,
        *,
        group_size: int | None = None,
        symmetric: bool = True,
        caps: DeviceCaps | None = None,
        policy: Policy | None = None,
        **saved: object,
    ) -> None:
        method, version = saved.pop("quant_method", METHOD), saved.pop("format_version", 1)
        if saved:
            raise InvalidValueError("KernelpickConfig keys", sorted(saved), f"only {_KEYS}")
        if method != METHOD:
            raise InvalidValueError("quant_method", method, repr(METHOD))
        if version != FORMAT_VERSION:
            raise InvalidValueError(
                "format_version", version, f"{FORMAT_VERSION} (this kernelpick's)"
            )
        recipe = Recipe.of(  # what every layer is made with
            scheme, block_size=block_size, group_size=group_size, symmetric=symmetric
        )
        skip = None if modules_to_not_convert is None else check_patterns(modules_to_not_convert)
        if caps is not None and not isinstance(caps, DeviceCaps):
            raise InvalidValueError("caps", type(caps).__name__, "None or a kp.DeviceCaps")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidValueError("policy", type(policy).__name__, "None or a kp.Policy")
        self.quant_method = cast(QuantizationMethod, METHOD)
        self.recipe = recipe
        self.scheme = recipe.scheme.value
        self.modules_to_not_convert = None if skip is None else list(skip)
        self.block_size = block_size
        self.group_size = group_size
        self.symmetric = symmetric
        self._caps = caps
        self._policy = policy

    @property
    def caps(self) -> DeviceCaps | None:
        """The device kernels are selected for; None: ``kp.probe`` of the load device."""
        return self._caps

    @property
    def policy(self) -> Policy | None:
        """The selection policy; None: ``Policy.from_env(os.environ)``."""
        return self._policy

    def to_dict(self) -> dict[str, Any]:
        """This config's settings, as a ``format_version`` 1 checkpoint holds them. A model
        quantized with it saves compressed-tensors' config instead (see the module)."""
        skip = self.modules_to_not_convert  # None: the default, saved as it is (see __init__)
        return {
            "quant_method": METHOD, "scheme": self.scheme,
            "modules_to_not_convert": None if skip is None else list(skip),
            "block_size": self.block_size, "group_size": self.group_size,
            "symmetric": self.symmetric, "format_version": FORMAT_VERSION,
        }  # fmt: skip

    def __iter__(self) -> Any:
        yield from copy.deepcopy(self.to_dict()).items()


class _Quantize(ConversionOps):
    """transformers' quantize op: a loaded high-precision weight in, canonical out."""

    def __init__(self, layers: HfLayers) -> None:
        self.hf_quantizer = None  # not a load op (transformers reads this attribute)
        self._layers = layers

    def convert(self, input_dict: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        missing = kwargs.get("missing_keys")  # transformers' set of keys not yet loaded
        return self._layers.quantize(input_dict, missing if isinstance(missing, set) else None)


def _device(device_map: object) -> torch.device:
    """The one device ``device_map`` loads onto (the CPU for None)."""
    if device_map is None:
        return torch.device("cpu")
    places = set(device_map.values()) if isinstance(device_map, dict) else {device_map}
    if len(places) == 1:
        place = places.pop()
        if isinstance(place, (str, int, torch.device)) and place not in ("auto", "disk", "meta"):
            return torch.device(place)
    raise InvalidValueError(
        "device_map", device_map,
        "None, one device, or a map onto one device: kernelpick selects for the device the "
        "layers run on (pass caps= in the config to select for another)",
    )  # fmt: skip


class KernelpickHfQuantizer(HfQuantizer):
    """The ``"kernelpick"`` quantizer: see the module's docstring."""

    requires_calibration = False
    quantization_config: KernelpickConfig

    def __init__(self, quantization_config: QuantizationConfigMixin, **kwargs: Any) -> None:
        if not isinstance(quantization_config, KernelpickConfig):
            name = type(quantization_config).__name__
            raise InvalidValueError("quantization_config", name, "a KernelpickConfig")
        # Checked again: transformers' update() and from_dict(**kwargs) set attributes
        # without calling __init__.
        config = quantization_config
        KernelpickConfig(**config.to_dict(), caps=config.caps, policy=config.policy)
        super().__init__(config, **kwargs)
        self._layers: HfLayers | None = None

    @property
    def quantized_element_size(self) -> float:
        return 1.0

    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        config = self.quantization_config
        device = _device(kwargs.get("device_map"))
        caps = config.caps
        if caps is None:
            caps = default_caps(device)
        online = not self.pre_quantized
        if not online:  # kernelpick saves compressed-tensors' config, never this one
            refuse_integer(config.recipe.scheme, "a format_version 1 kernelpick checkpoint")
        fmt = CheckpointFormat.HIGH_PRECISION if online else CheckpointFormat.PRE_QUANTIZED
        recipe = attrs.evolve(config.recipe, checkpoint_format=fmt)
        steps = LayerSteps.create(recipe, caps, config.policy)
        layers = HfLayers(steps, online)
        layers.swap(model, keep_rule(model, config.modules_to_not_convert))
        if online:  # transformers casts each tensor before the quantize op sees it
            check_high_precision(kwargs.get("checkpoint_files"))
        self._layers = layers
        return model

    def _hf_layers(self) -> HfLayers:
        if self._layers is None:
            raise InvalidValueError("quantizer", "unused", "a quantizer from_pretrained ran")
        return self._layers

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        return self._layers is not None and self._layers.quantizes(param_name)

    def get_quantize_ops(self) -> _Quantize:
        return _Quantize(self._hf_layers())

    def get_new_dtype(self, converter: Any, param: Any, dtype: Any) -> torch.dtype | None:
        """No cast for a pre-quantized layer's tensors (they are checked as stored), and
        no FP8 or int8 tensor cast into a module that is not a kernelpick layer."""
        target = str(getattr(converter, "target_patterns", [""])[0])
        layers = self._hf_layers()
        if layers.owns(target):
            return None
        stored = param.get_dtype() if hasattr(param, "get_dtype") else str(param.dtype)
        if stored in _QUANTIZED_DTYPES or stored in ("torch.float8_e4m3fn", "torch.int8"):
            raise CheckpointError(
                _WHERE, target, f"a {stored} tensor for a module kernelpick does not quantize",
                "the same modules_to_not_convert the checkpoint was saved with: casting "
                "quantized bytes without their scale gives wrong outputs",
            )  # fmt: skip
        new: torch.dtype | None = super().get_new_dtype(converter, param, dtype)
        return new

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        layers = self._hf_layers()
        layers.finish()
        kept = kept_layers(model, layers.kept)  # their loaded shapes and dtypes
        record_kept(model, kept)
        if layers.layers:  # what save_pretrained writes: compressed-tensors, not this config
            model.config.quantization_config = quantization_config(model)
            accept_before_loading(model)
            if LOGGER.isEnabledFor(logging.INFO):
                summary = model_summary(model).render()
                LOGGER.info("%s from_pretrained with kernelpick:\n%s", type(model).__name__,
                            summary)  # fmt: skip
        else:  # every linear kept, or none an nn.Linear (GPT-2's Conv1D): never in silence
            steps = layers.steps
            nothing = ModelSummary.of(steps.scheme.value, steps.caps, (), kept).render()
            LOGGER.warning("%s from_pretrained with kernelpick quantized no layer:\n%s",
                           type(model).__name__, nothing)  # fmt: skip
            # Nothing kernelpick made is left: the model is a plain high-precision one, and
            # save_pretrained must write it so (not quant_method "kernelpick").
            self.remove_quantization_config(model)  # type: ignore[no-untyped-call]
        return model

    def get_state_dict_and_metadata(self, model: Any) -> tuple[None, dict[str, Any]]:
        """Called by ``save_pretrained`` before it writes the config: the model's
        compressed-tensors ``quantization_config``, described as the model is now."""
        if self._layers is not None and self._layers.layers:
            model.config.quantization_config = quantization_config(model)
        return None, {}

    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def _register() -> None:
    """Register both classes as ``"kernelpick"``; again on a reload of this module."""
    if METHOD in AUTO_QUANTIZATION_CONFIG_MAPPING or METHOD in AUTO_QUANTIZER_MAPPING:
        AUTO_QUANTIZATION_CONFIG_MAPPING[METHOD] = KernelpickConfig  # a reload: replace
        AUTO_QUANTIZER_MAPPING[METHOD] = KernelpickHfQuantizer
        return
    register_quantization_config(METHOD)(KernelpickConfig)
    register_quantizer(METHOD)(KernelpickHfQuantizer)


_register()
