"""A model's linear layers as transformers builds them: its own model class on the meta
device (shapes, no weights), never code from the checkpoint (``trust_remote_code``)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import torch

from kernelpick.core import KernelpickError
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats import QUANTIZATION_CONFIG
from kernelpick.plan._config import ModelConfig
from kernelpick.plan._sizes import check_sizes

__all__ = ["TransformersUnavailableError", "meta_model"]

EXTRA = "pip install 'kernelpick[transformers]'"


class TransformersUnavailableError(KernelpickError):
    """A model's shapes are to be read where transformers cannot be imported."""

    def __init__(self, cause: str = "") -> None:
        self.cause = cause
        detail = f" ({cause})" if cause else ""
        super().__init__(
            "kernelpick plan builds the model from its config with transformers' own model "
            f"classes, and transformers cannot be imported here{detail}: {EXTRA}"
        )

    def __reduce__(self) -> tuple[type[TransformersUnavailableError], tuple[str]]:
        return (type(self), (self.cause,))


def _transformers() -> ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError as error:
        raise TransformersUnavailableError(f"{type(error).__name__}: {error}") from error


@contextlib.contextmanager
def _quiet(transformers: ModuleType) -> Iterator[None]:
    # transformers' notes on a config's legacy keys are not ours to print on every plan.
    logging = transformers.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


# What transformers raises for a config it cannot read or build from: its configs are strict
# dataclasses (huggingface_hub's StrictDataclassError: a float hidden_size, a string
# tie_word_embeddings, layer_types not one per layer), and a model's __init__ computes
# with sizes check_sizes does not know by name (ArithmeticError: one of them zero).
_FAILURES: tuple[type[Exception], ...] = (
    ValueError, TypeError, KeyError, AttributeError, RuntimeError, ArithmeticError,
)  # fmt: skip


def _failures() -> tuple[type[Exception], ...]:
    try:
        strict = importlib.import_module("huggingface_hub.errors").StrictDataclassError
    except (ImportError, AttributeError):  # an older huggingface_hub: plain TypeErrors
        return _FAILURES
    return (*_FAILURES, strict)


def _aliases(mapping: Any) -> Callable[[object], Mapping[str, str]]:
    def aliases(model_type: object) -> Mapping[str, str]:
        if not isinstance(model_type, str) or model_type not in mapping:
            return {}
        found = getattr(mapping[model_type], "attribute_map", None)
        return found if isinstance(found, dict) else {}

    return aliases


def _cause(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"  # one line


def _remote(config: ModelConfig, what: str) -> CheckpointError:
    code = " (its auto_map names code in the checkpoint)" if config.data.get("auto_map") else ""
    found = config.model_type if what == "model_type" else config.architectures[0]
    return CheckpointError(
        config.path, what, repr(found),
        f"a model transformers itself implements{code}: kernelpick plan never runs a "
        "checkpoint's own code (trust_remote_code)",
    )  # fmt: skip


def _model_class(transformers: ModuleType, config: ModelConfig) -> Any:
    name = config.architectures[0]
    found = getattr(transformers, name, None)
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise _remote(config, "architectures")
    # A *PreTrainedModel is the abstract base of a model type's classes: it builds no
    # layers, so its plan would be empty, and vLLM registers no such architecture.
    if name.endswith("PreTrainedModel"):
        raise CheckpointError(
            config.path, "architectures", repr(name),
            "a model class (LlamaForCausalLM, BertModel, ...), not the abstract base of one",
        )  # fmt: skip
    return found


def meta_model(config: ModelConfig) -> torch.nn.Module:
    """``config``'s model built on the meta device by transformers' class for
    ``architectures[0]``. Refused: a model type or class transformers does not implement
    (remote code), a size ``check_sizes`` refuses, or a config transformers cannot read or
    build."""
    transformers = _transformers()
    mapping = transformers.CONFIG_MAPPING
    if config.model_type not in mapping:
        raise _remote(config, "model_type")
    data = {k: v for k, v in config.data.items() if k != QUANTIZATION_CONFIG}
    check_sizes(config.path, data, _aliases(mapping))
    failures = _failures()
    with _quiet(transformers):
        try:
            hf_config = mapping[config.model_type].from_dict(data)
        except failures as error:
            found = f"a config transformers cannot read ({_cause(error)})"
            expected = f"a {config.model_type} config transformers reads"
            raise CheckpointError(config.path, "model_type", found, expected) from error
        cls = _model_class(transformers, config)
        try:
            with torch.device("meta"):
                model: torch.nn.Module = cls._from_config(hf_config)
        except failures as error:
            found = f"a config {cls.__name__} cannot be built from ({_cause(error)})"
            expected = f"the config of a {cls.__name__}"
            raise CheckpointError(config.path, "architectures", found, expected) from error
    return model
