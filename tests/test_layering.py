"""Layering: the core is pure, and dependencies point one way (core <- kernels <- adapters
<- integration <- engines <- bench <- cli)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kernelpick"
LAYERS = ["core", "kernels", "adapters", "integration", "engines", "bench", "cli"]
CORE_ALLOWED_THIRD_PARTY = {"attrs"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "kernelpick":
        return None
    if len(parts) == 1:
        return None  # the package root re-exports core only
    name = parts[1].removesuffix(".py")
    return LAYERS.index(name) if name in LAYERS else None


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_core_imports_only_the_standard_library_attrs_and_itself() -> None:
    for path in (PACKAGE / "core").rglob("*.py"):
        for module in _imports(path):
            top = module.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names
                or top in CORE_ALLOWED_THIRD_PARTY
                or module.startswith("kernelpick.core")
            )
            assert allowed, f"{path.relative_to(PACKAGE)} imports {module}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_dependencies_point_one_way(path: Path) -> None:
    relative = path.relative_to(PACKAGE)
    own = _layer("kernelpick." + ".".join(relative.with_suffix("").parts))
    if own is None:
        return
    for module in _imports(path):
        target = _layer(module)
        assert target is None or target <= own, f"{relative} ({LAYERS[own]}) imports {module}"


BLOCKED = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "cupy", "numpy"}:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())
    """
)


def _run_blocked(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE.parent,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_core_chooses_with_torch_and_cupy_blocked() -> None:
    out = _run_blocked(
        """
        import kernelpick.core as core
        caps = core.device_profile("h100")
        config = core.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
        print(core.choose(caps, config).kernel)
        """
    )
    assert out.strip() == "cuda_rowwise_scaled_mm"


def test_importing_kernelpick_and_choosing_does_not_import_torch() -> None:
    out = _run_blocked(
        """
        import sys
        import kernelpick as kp
        decision = kp.choose(
            kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=(64, 64))
        )
        print(type(decision).__name__, "torch" in sys.modules)
        """
    )
    assert out.split() == ["Rejected", "False"]


def test_every_catalog_id_has_a_launch_row_and_every_launch_row_a_catalog_id() -> None:
    import kernelpick as kp
    from kernelpick.kernels import LAUNCHES

    assert set(kp.default_catalog().ids) == set(LAUNCHES)
    for kernel_id in LAUNCHES:
        spec = kp.default_catalog().kernel(kernel_id)
        assert kernel_id.startswith(str(spec.platform))
