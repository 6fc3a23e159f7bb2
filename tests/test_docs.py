"""The Python examples in the README and docs/ run as written, and the README's rendered
rejection is what the code renders today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kernelpick as kp

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
EXAMPLES = [
    (path.name, index, code)
    for path in PAGES
    for index, code in enumerate(BLOCK.findall(path.read_text()))
]


def test_the_readme_has_examples_to_run() -> None:
    assert sum(doc == "README.md" for doc, _, _ in EXAMPLES) >= 3


@pytest.mark.parametrize(("doc", "index", "code"), EXAMPLES, ids=lambda v: str(v)[:24])
def test_doc_example_runs(doc: str, index: int, code: str) -> None:
    exec(compile(code, f"{doc}[{index}]", "exec"), {})


@pytest.mark.parametrize(
    ("page", "lead"),
    [("README.md", "On the A100 that is a rejection"), ("docs/design.md", "on an A100:")],
)
def test_the_rejection_shown_is_the_one_the_code_renders(page: str, lead: str) -> None:
    text = (ROOT / page).read_text()
    shown = re.search(re.escape(lead) + r".*?```(?:text)?\n(.*?)```", text, re.DOTALL)
    assert shown is not None
    config = kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    decision = kp.choose(kp.device_profile("a100"), config)
    assert shown.group(1).rstrip("\n") == decision.render()


def test_no_page_points_outside_the_repository() -> None:
    for path in [*PAGES, *ROOT.glob("kernelpick/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        text = path.read_text()
        for needle in ("../" + "shared", "design " + "§"):
            assert needle not in text, f"{path.relative_to(ROOT)} cites {needle!r}"
