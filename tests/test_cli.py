"""The ``kernelpick`` command: each acceptance behaviour of the CLI is a test here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpick as kp
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED, main
from kernelpick.core import ENV_DISABLED, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(*argv: str, env: dict[str, str] | None = None, tty: bool = False) -> tuple[int, str, str]:
    out: io.StringIO = _Tty() if tty else io.StringIO()
    err = io.StringIO()
    status = main(list(argv), env={} if env is None else env, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_a100_ptpc_is_rejected_and_names_every_cuda_kernel() -> None:
    status, out, _ = _run("explain", "--device", "a100", "--scheme", "fp8_per_channel")
    assert status == EXIT_REJECTED
    lines = out.splitlines()
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert any(f"  {kernel}  " in line for line in lines), kernel
    per_token = "weight-only (W8A16) kernel cannot honour per-token activation quantization"
    for kernel in ("cuda_w8a16_cupy", "cuda_w8a16_torch"):
        assert any(kernel in line and per_token in line for line in lines), kernel
    assert "=> rejected" in out


def test_h100_ptpc_selects_rowwise() -> None:
    status, out, _ = _run("explain", "--device", "h100")
    assert status == EXIT_SELECTED
    assert "=> selected cuda_rowwise_scaled_mm" in out
    assert any("cuda_rowwise_scaled_mm" in line and "SELECTED" in line for line in out.splitlines())


def test_a_degraded_choice_is_flagged() -> None:
    status, out, _ = _run("explain", "--device", "a100", "--scheme", "fp8_per_tensor")
    assert status == EXIT_SELECTED
    assert "SELECTED (degraded)" in out
    assert "=> selected cuda_w8a16_cupy (degraded" in out


def test_json_parses_and_its_decision_matches_choose() -> None:
    args = ("explain", "--device", "mi300x", "--shape", "1024,512", "--out-dtype", "float16")
    status, out, _ = _run(*args, "--json")
    record = json.loads(out)
    expected = kp.choose(
        kp.device_profile("mi300x"),
        kp.quant_config("fp8_per_channel", weight_shape=(1024, 512), out_dtype="float16"),
    )
    assert status == EXIT_SELECTED
    assert record["schema_version"] == SCHEMA_VERSION
    assert {key: record[key] for key in expected.to_dict()} == expected.to_dict()
    assert record["device"]["profile"] == "mi300x"


def test_environment_policy_applies_and_a_flag_wins() -> None:
    env = {ENV_DISABLED: "cuda_rowwise_scaled_mm"}
    _, out, _ = _run("explain", "--device", "h100", env=env)
    assert "=> selected cuda_channelwise_unfused" in out
    assert "policy: disabled cuda_rowwise_scaled_mm" in out
    _, out, _ = _run("explain", "--device", "h100", "--disable", "", env=env)
    assert "=> selected cuda_rowwise_scaled_mm" in out


def test_strict_and_force_flags() -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_tensor")
    assert _run(*args, "--strict")[0] == EXIT_REJECTED
    status, out, _ = _run("explain", "--device", "h100", "--force", "cuda_channelwise_unfused")
    assert status == EXIT_SELECTED
    assert "not forced: policy forces cuda_channelwise_unfused" in out


BAD_INPUT = [
    (["explain", "--device", "a10"], ["did you mean 'a10g'", "a100", "kernelpick devices"]),
    (["explain", "--device", "h100", "--scheme", "fp8_per_chanel"],
     ["fp8_per_channel", "fp8_weight_only"]),
    (["explain", "--device", "h100", "--shape", "4096;4096"], ["N,K"]),
    (["explain", "--device", "h100", "--shape", "0,4096"], ["positive"]),
    (["explain", "--device", "h100", "--disable", "cuda_rowwise"],
     ["cuda_rowwise_scaled_mm", "kernelpick kernels"]),
    (["explain", "--device", "h100", "--out-dtype", "int8"], ["bfloat16"]),
    (["explain", "--bogus"], ["unrecognized arguments", "--help"]),
    (["matrix", "--format", "html"], ["invalid choice", "markdown"]),
    ([], ["required"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "needles"), BAD_INPUT)
def test_bad_input_exits_1_naming_the_valid_choices(argv: list[str], needles: list[str]) -> None:
    status, out, err = _run(*argv)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith("kernelpick: error: ")
    for needle in needles:
        assert needle in err


def test_matrix_json_covers_every_profile_and_scheme() -> None:
    status, out, _ = _run("matrix", "--format", "json")
    record = json.loads(out)
    assert status == EXIT_SELECTED
    pairs = {(e["device"], e["scheme"]) for e in record["entries"]}
    assert pairs == {(d, s.value) for d in kp.device_profiles() for s in kp.Scheme}
    a100 = next(
        e for e in record["entries"] if (e["device"], e["scheme"]) == ("a100", "fp8_per_channel")
    )
    assert a100["outcome"] == "rejected"
    assert a100["reason"]["kernel"] == "cuda_rowwise_scaled_mm"  # the first W8A8 reason
    for entry in record["entries"]:
        config = kp.quant_config(entry["scheme"], weight_shape=(4096, 4096))
        decision = kp.choose(kp.device_profile(entry["device"]), config)
        assert entry["kernel"] == (decision.kernel if isinstance(decision, kp.Selected) else None)


def test_matrix_can_pick_schemes() -> None:
    _, out, _ = _run("matrix", "--scheme", "fp8_weight_only")
    assert "fp8_weight_only" in out
    assert "fp8_per_channel" not in out


def test_the_committed_support_matrix_is_current() -> None:
    _, out, _ = _run("matrix", "--format", "markdown")
    committed = (ROOT / "docs" / "support-matrix.md").read_text()
    assert committed == out, (
        "regenerate: kernelpick matrix --format markdown > docs/support-matrix.md"
    )
    assert "docs/support-matrix.md" in (ROOT / "README.md").read_text()


def test_devices_and_kernels_list_the_profiles_and_the_catalog() -> None:
    _, out, _ = _run("devices", "--json")
    devices = json.loads(out)["devices"]
    assert [d["profile"] for d in devices] == list(kp.device_profiles())
    assert next(d for d in devices if d["profile"] == "mi300x")["fp8_format"] == "float8_e4m3fnuz"
    _, out, _ = _run("kernels", "--json")
    kernels = json.loads(out)["kernels"]
    assert [k["id"] for k in kernels] == list(kp.default_catalog().ids)
    cupy = next(k for k in kernels if k["id"] == "cuda_w8a16_cupy")
    assert cupy["kind"] == "W8A16"
    assert "cupy usable" in cupy["requires"]
    _, text, _ = _run("kernels")
    assert "activation none, or per-tensor (degraded)" in text


def test_colour_only_on_a_tty_and_never_with_no_color() -> None:
    plain = _run("explain", "--device", "h100")[1]
    coloured = _run("explain", "--device", "h100", tty=True)[1]
    muted = _run("explain", "--device", "h100", env={"NO_COLOR": "1"}, tty=True)[1]
    assert "\x1b[" not in plain
    assert "\x1b[32m" in coloured
    assert muted == plain


def test_bench_runs_on_this_machine() -> None:
    status, out, _ = _run("bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1", "--json")
    record = json.loads(out)
    assert status == EXIT_SELECTED
    decision = kp.choose(kp.probe(), kp.quant_config("fp8_per_channel", weight_shape=(64, 64)))
    assert isinstance(decision, kp.Selected)
    assert record["kernel"] == decision.kernel
    assert record["relative_error"] < 0.1
    assert record["seconds_kernel"] > 0


def _subprocess(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, check=False, cwd=ROOT,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_python_dash_m_runs_the_same_command() -> None:
    result = _subprocess("-m", "kernelpick", "explain", "--device", "a100")
    assert result.returncode == EXIT_REJECTED, result.stderr
    assert result.stdout.startswith("device: NVIDIA A100")


def test_explaining_a_profile_does_not_import_torch() -> None:
    code = (
        "import sys; from kernelpick.cli import main; "
        "main(['explain', '--device', 'h100']); print('torch' in sys.modules)"
    )
    result = _subprocess("-c", code)
    assert result.stdout.strip().splitlines()[-1] == "False", result.stderr
