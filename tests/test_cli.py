"""The minimal ``kernelpick explain`` command: exit status, text, JSON and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import kernelpick as kp
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED, main


def _run(
    capsys: pytest.CaptureFixture[str], *argv: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    status = main(list(argv), env={} if env is None else env)
    out, err = capsys.readouterr()
    return status, out, err


def test_a100_ptpc_is_rejected_and_names_every_cuda_kernel(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = _run(capsys, "explain", "--device", "a100", "--scheme", "fp8_per_channel")
    assert status == EXIT_REJECTED
    for kernel in kp.catalog("cuda"):
        assert f"  - {kernel}: " in out
    assert out.count("cannot honour per-token activation quantization") == 2


def test_h100_ptpc_selects_rowwise(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "explain", "--device", "h100")
    assert status == EXIT_SELECTED
    assert "Selected cuda_rowwise_scaled_mm." in out


def test_json_matches_choose(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("explain", "--device", "mi300x", "--shape", "1024,512", "--out-dtype", "float16")
    status, out, _ = _run(capsys, *args, "--json")
    record = json.loads(out)
    expected = kp.choose(
        kp.device_profile("mi300x"),
        kp.scheme("fp8_per_channel", weight_shape=(1024, 512), out_dtype="float16"),
    )
    assert status == EXIT_SELECTED
    assert {k: record[k] for k in expected.to_dict()} == expected.to_dict()
    assert record["device"]["profile"] == "mi300x"


def test_environment_policy_applies_and_a_flag_wins(capsys: pytest.CaptureFixture[str]) -> None:
    env = {kp.ENV_DISABLED: "cuda_rowwise_scaled_mm"}
    _, out, _ = _run(capsys, "explain", "--device", "h100", env=env)
    assert "Selected cuda_channelwise_unfused." in out
    _, out, _ = _run(capsys, "explain", "--device", "h100", "--disable", "", env=env)
    assert "Selected cuda_rowwise_scaled_mm." in out


def test_strict_flag_rejects_the_degraded_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_tensor")
    assert _run(capsys, *args)[0] == EXIT_SELECTED
    assert _run(capsys, *args, "--strict")[0] == EXIT_REJECTED


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["explain", "--device", "a10"], "did you mean 'a10g'"),
        (["explain", "--scheme", "fp8_per_chanel"], "did you mean 'fp8_per_channel'"),
        (["explain", "--shape", "4096x4096"], "N,K"),
        (["explain", "--shape", "0,4096"], "positive"),
        (["explain", "--disable", "cuda_rowwise"], "Known kernel ids"),
        (["explain", "--out-dtype", "int8"], "Known dtypes"),
        (["explain", "--bogus"], "unrecognized arguments"),
        ([], "required"),
    ],
)
def test_bad_input_exits_1_with_a_message_naming_the_valid_choices(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    status, out, err = _run(capsys, *argv)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith("kernelpick: error: ")
    assert needle in err


def test_python_dash_m_runs_the_same_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kernelpick", "explain", "--device", "a100"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": ""},
    )
    assert result.returncode == EXIT_REJECTED, result.stderr
    assert result.stdout.startswith("device: NVIDIA A100")
