"""``kernelpick.plan``'s ``NOT_BUILT`` against vLLM's own model code: for each architecture,
the top-level parts vLLM's loader drops (its ``hf_to_vllm_mapper`` maps their prefix to
None) are the table's."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from kernelpick.plan._table import NOT_BUILT
from tests.engines import vllm_workers as workers

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = pytest.mark.slow  # vLLM's import alone takes seconds


def _dropped(module: str) -> set[str]:
    """The prefixes vLLM's model module ``module`` maps to None as it loads, read from its
    source (importing some needs torchvision)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None
    assert spec.submodule_search_locations is not None
    path = Path(spec.submodule_search_locations[0]) / "model_executor" / "models" / f"{module}.py"
    dropped = set()
    for node in ast.walk(ast.parse(path.read_text())):
        # WeightsMapper(orig_to_new_prefix={...}): a prefix mapped to None is dropped.
        if isinstance(node, ast.keyword) and node.arg == "orig_to_new_prefix":
            mapping = node.value
            assert isinstance(mapping, ast.Dict)
            for key, value in zip(mapping.keys, mapping.values, strict=True):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str)
                        and isinstance(value, ast.Constant) and value.value is None):  # fmt: skip
                    dropped.add(key.value.removesuffix("."))
    return dropped


def test_the_parts_vllm_drops_are_the_table() -> None:
    from vllm.model_executor.models.registry import _VLLM_MODELS

    for architecture, parts in NOT_BUILT.items():
        module, _ = _VLLM_MODELS[architecture]
        assert _dropped(module) == set(parts), architecture
