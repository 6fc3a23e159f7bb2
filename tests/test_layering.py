"""Layering: the core is pure, dependencies point one way (core <- kernels <- adapters
<- integration <- engines <- plan <- bench <- cli), packages meet at their public faces (a
private module is imported only from its own package or one inside it), and no library
module reaches back through the facade (``import kernelpick``)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kernelpick"
LAYERS = ["core", "kernels", "adapters", "integration", "engines", "plan", "bench", "cli"]
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


# The facade: kernelpick/__init__.py and kernelpick/rules.py, the names `kp` gives users.
FACADE = {"kernelpick", "kernelpick.rules"}


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    """The package ``path`` belongs to: the package itself for an ``__init__.py``. The root's
    modules (the facade, kernelpick/rules.py) belong to ``kernelpick``, outside every
    subpackage."""
    module = _module_of(path)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _root_modules() -> set[str]:
    """The modules and subpackages directly under kernelpick/, the facade's excepted: what
    ``from kernelpick import X`` may name without reaching into the facade."""
    names = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    return names - {"__init__", "__main__", "rules"}


def _resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ImportFrom names (relative ones resolved from ``package``)."""
    if node.level == 0:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Every dotted name imported anywhere in ``tree`` (functions and ``if TYPE_CHECKING:``
    included), with its line: ``from a import b`` gives ``a`` and ``a.b``, since ``b`` may be
    a module or a name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _private_part(module: str) -> tuple[str, str] | None:
    """The first private module or name in ``module`` (up to its first part with a leading
    underscore) and the package it lives in, or None when every part is public. Dunders
    (``__version__``) are not private."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[: index + 1]), ".".join(parts[:index])
    return None


def private_imports(source: str, path: Path) -> list[str]:
    """The private modules (or names) that ``source``, attributed to ``path``, imports from
    outside its own package and the packages that contain it."""
    package = _package_of(path)
    problems: dict[tuple[int, str], str] = {}
    for line, module in _imported(ast.parse(source, str(path)), package):
        private = _private_part(module) if module.split(".")[0] == "kernelpick" else None
        if private is None:
            continue
        name, owner = private
        if package == owner or package.startswith(owner + "."):
            continue
        problems[line, name] = f"line {line}: {name} is private to {owner}; use {owner}'s names"
    return list(problems.values())


def facade_imports(source: str, path: Path) -> list[str]:
    """Where ``source``, a library module attributed to ``path``, imports the facade
    (``import kernelpick``, ``from kernelpick import choose``, ``kernelpick.rules``) or
    reads a name through it (``kernelpick.choose`` after ``import kernelpick.core``)."""
    package = _package_of(path)
    root = _root_modules()
    tree = ast.parse(source, str(path))
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            problems.extend(f"line {node.lineno}: import {n}" for n in names if n in FACADE)
            problems.extend(
                f"line {node.lineno}: import {n}"
                for n in names
                if n.startswith("kernelpick.rules.")
            )
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            if module == "kernelpick":
                problems.extend(
                    f"line {node.lineno}: from kernelpick import {alias.name}"
                    for alias in node.names
                    if alias.name not in root
                )
            elif module == "kernelpick.rules" or module.startswith("kernelpick.rules."):
                problems.append(f"line {node.lineno}: from {module} import ...")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "kernelpick"
            and node.attr not in root
        ):
            problems.append(f"line {node.lineno}: kernelpick.{node.attr}")
    return problems


def _library_modules() -> list[Path]:
    return [path for path in _modules() if path != PACKAGE / "__init__.py"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_private_modules_are_imported_only_inside_their_package(path: Path) -> None:
    problems = private_imports(path.read_text(), path)
    assert not problems, f"{path.relative_to(PACKAGE)} ({_package_of(path)}):\n" + "\n".join(
        problems
    )


@pytest.mark.parametrize("path", _library_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_library_modules_do_not_import_the_facade(path: Path) -> None:
    problems = facade_imports(path.read_text(), path)
    assert not problems, (
        f"{path.relative_to(PACKAGE)} imports the facade (use the names of kernelpick.core, "
        "kernelpick.kernels, ... instead):\n" + "\n".join(problems)
    )


_VIOLATING = textwrap.dedent(
    """
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from kernelpick.core._errors import InvalidValueError

    def late():
        import kernelpick as kp
        from kernelpick.integration.layer import _state
        return kp.choose
    """
)


def test_the_private_import_check_can_fail() -> None:
    fake = PACKAGE / "integration" / "checkpoints" / "_fake.py"
    problems = private_imports(_VIOLATING, fake)
    assert [p.split(":")[0] for p in problems] == ["line 4", "line 8"], problems
    # The same imports are fine from inside the packages that own them...
    assert (
        private_imports("from kernelpick.core._errors import X", PACKAGE / "core" / "_x.py") == []
    )
    inner = PACKAGE / "integration" / "layer" / "_x.py"
    assert private_imports("from kernelpick.integration._errors import X", inner) == []
    assert private_imports("from kernelpick.integration.layer import _state", inner) == []
    # ...but not from the root package (the facade is outside every subpackage), nor a sibling.
    assert private_imports("from kernelpick.core._select import X", PACKAGE / "rules.py")
    sibling = "from kernelpick.integration.layer._state import X"
    assert private_imports(sibling, PACKAGE / "integration" / "checkpoints" / "_x.py")
    assert private_imports("from ..core import _errors", PACKAGE / "kernels" / "_x.py")


def test_the_facade_check_can_fail() -> None:
    fake = PACKAGE / "kernels" / "_fake.py"
    problems = facade_imports(_VIOLATING, fake)
    assert [p.split(":")[0] for p in problems] == ["line 7"], problems
    assert facade_imports("from kernelpick import choose", fake)
    assert facade_imports("from kernelpick.rules import MinTokens", fake)
    assert facade_imports("import kernelpick.core\nkernelpick.choose", fake)
    # Subpackages are not the facade, whichever way they are spelled.
    fine = "from kernelpick import kernels\nimport kernelpick.core\nkernelpick.core.choose"
    assert facade_imports(fine, fake) == []


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
