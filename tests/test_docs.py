"""The Python examples in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
EXAMPLES = [
    (path.name, index, code)
    for path in sorted(DOCS.glob("*.md"))
    for index, code in enumerate(BLOCK.findall(path.read_text()))
]


@pytest.mark.parametrize(("doc", "index", "code"), EXAMPLES, ids=lambda v: str(v)[:24])
def test_doc_example_runs(doc: str, index: int, code: str) -> None:
    exec(compile(code, f"{doc}[{index}]", "exec"), {})
