"""What the package promises to install and print, read from its own files: the runtime
dependencies (ninja, which builds the CPU kernels at first use), the transformers extra
(accelerate, which transformers needs for any device_map) and `make demo` saying what it
installs before the minutes it takes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tomllib is Python 3.11's", allow_module_level=True)
import tomllib  # type: ignore[import-not-found]  # mypy checks as Python 3.10

ROOT = Path(__file__).resolve().parents[1]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower() for req in requirements}


def test_ninja_is_a_runtime_dependency_and_accelerate_comes_with_transformers() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "ninja" in _names(project["dependencies"])
    assert {"transformers", "accelerate"} <= _names(
        project["optional-dependencies"]["transformers"]
    )


def test_make_demo_says_what_it_installs_before_installing() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed-demo:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()[1:]]
    assert lines[0].startswith("@echo"), lines
    assert "a few minutes" in lines[0], lines
    assert "--quiet" not in recipe  # pip's own progress shows while it works
