"""docs/errors.md lists every error class kernelpick defines, and nothing else."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import kernelpick
import kernelpick as kp

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def _error_classes() -> set[type[kp.KernelpickError]]:
    for module in pkgutil.walk_packages(kernelpick.__path__, "kernelpick."):
        if module.name == "kernelpick.__main__":
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as error:
            if error.name != "vllm":  # the vLLM plugin's modules import vLLM (its own venv)
                raise
    found: set[type[kp.KernelpickError]] = set()
    pending: list[type[kp.KernelpickError]] = [kp.KernelpickError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("kernelpick") and cls not in found:
            found.add(cls)
            pending.extend(cls.__subclasses__())
    return found


def test_every_error_class_is_in_the_table_and_the_table_names_only_real_ones() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", DOC.read_text(), flags=re.MULTILINE))
    names = {cls.__name__ for cls in _error_classes()}
    assert names - rows == set(), "document these in docs/errors.md"
    assert rows - names == set(), "docs/errors.md names classes that do not exist"


def test_every_error_is_a_value_error() -> None:
    for cls in _error_classes():
        assert issubclass(cls, ValueError), cls
