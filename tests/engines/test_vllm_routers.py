"""``kernelpick.plan.QUANTIZED_ROUTERS`` against vLLM's own model code: the models whose MoE
routers vLLM builds with the model's quant_config are the table's, every other model's
GateLinear takes none, and the plugin quantizes a GateLinear it is given."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from kernelpick.plan import QUANTIZED_ROUTERS
from tests.engines import vllm_workers as workers

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = pytest.mark.slow  # vLLM's import alone takes seconds


def _models() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None
    assert spec.submodule_search_locations is not None
    return Path(spec.submodule_search_locations[0]) / "model_executor" / "models"


def _given_quant_config(module: str) -> bool | None:
    """Whether vLLM's model module ``module`` builds its GateLinear routers with a
    quant_config (None: it builds none)."""
    tree = ast.parse((_models() / f"{module}.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "GateLinear"]  # fmt: skip
    if not calls:
        return None
    given = {
        any(kw.arg == "quant_config" and not (isinstance(kw.value, ast.Constant)
            and kw.value.value is None) for kw in call.keywords)
        for call in calls
    }  # fmt: skip
    assert len(given) == 1, f"{module} builds some routers with quant_config, some without"
    return given.pop()


def _imports_from(module: str) -> set[str]:
    """The sibling model modules ``module`` imports names from (``from .qwen3_moe import``)."""
    tree = ast.parse((_models() / f"{module}.py").read_text())
    found = {node.module or "" for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.level == 1}  # fmt: skip
    return {name.split(".")[0] for name in found}


def test_the_models_whose_routers_vllm_quantizes_are_the_table() -> None:
    import transformers
    from vllm.model_executor.models.registry import _VLLM_MODELS

    quantizing = {p.stem for p in _models().glob("*.py") if _given_quant_config(p.stem)}
    assert quantizing == {"qwen3_moe", "lfm2_moe", "k2_horizon"}  # vLLM 0.33
    # A module that builds on a quantizing module's classes builds its routers too (Qwen3-VL-
    # MoE's decoder layers are Qwen3-MoE's, Qwen3-Omni's thinker its Qwen3MoeModel): read
    # from their sources, as importing some needs torchvision.
    building = {p.stem for p in _models().glob("*.py") if _imports_from(p.stem) & quantizing}
    assert {"qwen3_vl_moe", "qwen3_omni_moe_thinker"} <= building
    modules = {arch: module for arch, (module, _) in _VLLM_MODELS.items()}
    assert {modules[arch] for arch in QUANTIZED_ROUTERS} == {
        "qwen3_moe", "qwen3_vl_moe", "lfm2_moe", "qwen3_omni_moe_thinker"
    }  # fmt: skip
    # Every transformers model vLLM builds from a quantizing module, or one building on it,
    # is in the table.
    built = {arch for arch, module in modules.items() if module in quantizing | building}
    assert {arch for arch in built if hasattr(transformers, arch)} <= QUANTIZED_ROUTERS
    for arch in ("DeepseekV3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM"):
        assert _given_quant_config(modules[arch]) is False
        assert arch not in QUANTIZED_ROUTERS


@pytest.mark.usefixtures("vllm_tp1")
def test_the_plugin_quantizes_a_router_given_the_quant_config() -> None:
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig("fp8_per_channel")
    prefix = "model.layers.0.mlp.gate"
    given = GateLinear(256, 8, quant_config=config, prefix=prefix)
    assert type(given.quant_method).__name__ == "KernelpickLinearMethod"
    assert isinstance(GateLinear(256, 8, prefix=prefix).quant_method, UnquantizedLinearMethod)
