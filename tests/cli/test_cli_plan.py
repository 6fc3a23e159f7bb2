"""``kernelpick plan``: the text of each real model's plan on a100, h100, mi300x and cpu
against its committed snapshot, the JSON record's every key and type, the exit statuses,
and the refusals. Regenerate the snapshots with

    KERNELPICK_UPDATE_SNAPSHOTS=1 python -m pytest tests/cli/test_cli_plan.py -m slow

and read the diff before committing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from kernelpick.cli import EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED
from kernelpick.core import SCHEMA_VERSION
from tests.support.cli_run import run_cli
from tests.support.model_configs import FIXTURES, ROOT, fixture_data, small_llama, write_config

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "plan"
PROFILES = "a100,h100,mi300x,cpu"
UPDATE = os.environ.get("KERNELPICK_UPDATE_SNAPSHOTS") == "1"


def _plan(name: str, *options: str) -> tuple[int, str, str]:
    # A path relative to the repository root, as the snapshots show it.
    scheme = () if "quantization_config" in fixture_data(name) else ("--scheme", "fp8_per_channel")
    where = f"tests/fixtures/configs/{name}"
    return run_cli("plan", where, "--device", PROFILES, *scheme, *options)


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_the_text_plan_of_each_model_is_its_snapshot(name: str) -> None:
    status, out, err = _plan(name)
    assert err == ""
    assert status in (EXIT_SELECTED, EXIT_REJECTED)
    snapshot = SNAPSHOTS / f"{name}.txt"
    if UPDATE:
        snapshot.write_text(out)
    assert out == snapshot.read_text(), f"regenerate: see {Path(__file__).name}'s docstring"


class OneOf:
    """A value matching one of ``schemas``, told apart by ``key``'s value."""

    def __init__(self, key: str, **schemas: dict[str, object]) -> None:
        self.key, self.schemas = key, schemas


def _check_types(value: object, schema: object, where: str) -> None:
    """``value`` has exactly ``schema``'s keys and types: a dict of key -> schema, a
    one-element list (every item), ``OneOf``, a type, or a tuple of types."""
    if isinstance(schema, OneOf):
        assert isinstance(value, dict), where
        assert value.get(schema.key) in schema.schemas, where
        _check_types(value, schema.schemas[value[schema.key]], where)
    elif isinstance(schema, dict):
        assert isinstance(value, dict), where
        assert set(value) == set(schema), (where, sorted(set(value) ^ set(schema)))
        for key, inner in schema.items():
            _check_types(value[key], inner, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), where
        for index, item in enumerate(value):
            _check_types(item, schema[0], f"{where}[{index}]")
    else:
        assert isinstance(value, schema), (where, value)  # type: ignore[arg-type]
        assert schema is bool or not isinstance(value, bool), (where, value)


_REASON = {"code": str, "needed": str, "found": str, "message": str}
_TRACE = [{"kernel": str, "kind": str, "status": str, "degraded": bool, "reasons": [_REASON]}]
_WARNING = {"code": str, "selected": str, "passed_over": (str, type(None)),
            "reasons": [_REASON], "message": str}  # fmt: skip
_COMMON = {"schema_version": int, "outcome": str, "degraded": bool, "trace": _TRACE}
_DECISION = OneOf(
    "outcome",
    selected={**_COMMON, "kernel": str, "warnings": [_WARNING]},
    rejected={**_COMMON, "kernel": type(None), "warnings": [_WARNING], "hints": [str]},
)
_WEIGHTS = {"count": int, "names": [str], "elements": int, "dtype": (str, type(None)),
            "bytes": (int, type(None)), "reason": str}  # fmt: skip
_PLAN = {
    "schema_version": int, "scheme": str, "profile": str,
    "device": {"name": str, "description": str}, "tensor_parallel": int, "layers": int,
    "degraded": int, "rejected": int, "warned": int, "bytes_before": int, "bytes_after": int,
    "groups": [{"count": int, "names": [str], "weight_shape": [int], "config": str,
                "bytes_before": int, "bytes_after": int, "decision": _DECISION}],
    "kept": [{"name": str, "weight_shape": [int], "bytes": int, "reason": str}],
    "uncovered": [_WEIGHTS],
}  # fmt: skip
SCHEMA = {
    "schema_version": int,
    "model": {"config": str, "architectures": [str], "model_type": str, "dtype": str,
              "scheme": str, "source": str, "checkpoint_format": str, "tensor_parallel": int},
    "plans": [_PLAN],
    "not_covered": [_WEIGHTS],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_the_json_record_of_each_model_has_every_key_and_type(name: str) -> None:
    status, out, _ = _plan(name, "--format", "json")
    record: dict[str, Any] = json.loads(out)
    _check_types(record, SCHEMA, "record")
    assert record["schema_version"] == SCHEMA_VERSION
    assert [plan["profile"] for plan in record["plans"]] == PROFILES.split(",")
    rejected = sum(plan["rejected"] for plan in record["plans"])
    assert status == (EXIT_REJECTED if rejected else EXIT_SELECTED)
    for plan in record["plans"]:
        assert plan["layers"] == sum(group["count"] for group in plan["groups"])
        assert plan["uncovered"] == record["not_covered"]


def _small(tmp_path: Path, **changes: Any) -> str:
    return str(write_config(tmp_path, small_llama(**changes)))


def test_one_rejected_layer_makes_the_status_2(tmp_path: Path) -> None:
    where = _small(tmp_path)
    status, out, _ = run_cli("plan", where, "--scheme", "fp8_per_channel", "--device", "t4")
    assert status == EXIT_REJECTED
    assert "8 rejected" in out
    assert "Failed to find a kernel" in out
    status, _, _ = run_cli("plan", where, "--scheme", "fp8_per_channel", "--device", "h100")
    assert status == EXIT_SELECTED


def test_devices_repeat_or_comma_separate_and_markdown_has_a_table_each(tmp_path: Path) -> None:
    where = _small(tmp_path)
    args = ("plan", where, "--scheme", "fp8_block", "--format", "markdown")
    status, out, _ = run_cli(*args, "--device", "h100,a100", "--device", "cpu")
    assert status == EXIT_SELECTED
    assert [line for line in out.splitlines() if line.startswith("## ")] == [
        line for line in out.splitlines() if line.startswith(("## h100:", "## a100:", "## cpu:"))
    ]
    assert out.count("| layers | N x K | kernel | layer names |") == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--block-size", "64"), "--block-size without --scheme"),
        (("--scheme", "fp8_block", "--tensor-parallel", "3"), "--tensor-parallel"),
        (("--scheme", "fp8_block", "--device", "h100,,a100"), "empty device name"),
        (("--scheme", "nope"), "unknown scheme"),
    ],
)
def test_bad_input_is_status_1_with_the_reason(
    tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    status, out, err = run_cli("plan", _small(tmp_path), *extra)
    assert (status, out) == (EXIT_BAD_INPUT, "")
    assert message in err


def test_a_missing_config_is_bad_input(tmp_path: Path) -> None:
    status, _, err = run_cli("plan", str(tmp_path / "absent"), "--scheme", "fp8_block")
    assert status == EXIT_BAD_INPUT
    assert "config.json" in err


def test_the_other_commands_do_not_import_transformers() -> None:
    code = ("import sys; from kernelpick.cli import main; main(['devices'], out=sys.stderr); "
            "print('transformers' in sys.modules, 'torch' in sys.modules)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT)  # fmt: skip
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_the_readme_example_is_what_the_command_prints() -> None:
    text = (ROOT / "README.md").read_text()
    command = "python -m kernelpick plan tests/fixtures/configs/deepseek-v3 --device h100"
    shown = text.split(command, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    status, out, _ = run_cli(*command.split()[3:])
    assert status == EXIT_SELECTED
    assert out == shown
