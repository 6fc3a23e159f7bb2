"""The ``kernelpick`` command: each acceptance behaviour of the CLI is a test here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelpick as kp
from kernelpick.bench import STAGES, median_seconds
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_REJECTED, EXIT_SELECTED, main
from kernelpick.cli._output import wrap
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
    wide = {"COLUMNS": "1000"}  # a terminal's output is wrapped to its width: fix the width
    plain = _run("explain", "--device", "h100", env=wide)[1]
    coloured = _run("explain", "--device", "h100", env=wide, tty=True)[1]
    muted = _run("explain", "--device", "h100", env={"NO_COLOR": "1", **wide}, tty=True)[1]
    assert "\x1b[" not in plain
    assert "\x1b[32m" in coloured
    assert muted == plain


def test_rejected_rows_are_drawn_at_normal_intensity() -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_channel")
    _, out, _ = _run(*args, env={"COLUMNS": "1000"}, tty=True)
    assert "\x1b[1m" in out  # colour is on: the header is bold
    assert "\x1b[2m" not in out  # and nothing is faint
    rows = [line for line in out.splitlines() if "  rejected  " in line]
    assert len(rows) == len(kp.default_catalog().ids_for("cuda"))
    assert all("\x1b[" not in row for row in rows)


def test_text_and_json_give_each_kernel_the_same_status() -> None:
    for device in ("h100", "a100"):
        _, text, _ = _run("explain", "--device", device, "--scheme", "fp8_per_tensor")
        _, raw, _ = _run("explain", "--device", device, "--scheme", "fp8_per_tensor", "--json")
        for entry in json.loads(raw)["trace"]:
            row = next(line for line in text.splitlines() if f"  {entry['kernel']}  " in line)
            assert row.split()[3].lower() == entry["status"], row


def test_version_prints_the_package_version() -> None:
    assert _run("--version") == (EXIT_SELECTED, f"kernelpick {kp.__version__}\n", "")


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"]])
def test_help_lists_the_schemes_and_the_device_profiles(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help, and may break at a hyphen
    status, out, _ = _run(*argv)
    assert status == EXIT_SELECTED
    for name in [*(s.value for s in kp.Scheme), *kp.device_profiles()]:
        assert name in out, name


def test_explain_prints_the_hints_that_choose_computes() -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_channel")
    decision = kp.choose(
        kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    )
    assert isinstance(decision, kp.Rejected)
    assert decision.hints
    _, out, _ = _run(*args)
    lines = out.splitlines()
    assert lines[-len(decision.hints) :] == [f"hint: {hint}" for hint in decision.hints]
    _, raw, _ = _run(*args, "--json")
    assert json.loads(raw)["hints"] == list(decision.hints)


def _words(text: str) -> str:
    return " ".join(text.split())


EXPLAIN_A100 = ["explain", "--device", "a100", "--scheme", "fp8_per_channel"]
NARROW = [
    EXPLAIN_A100,
    ["explain", "--device", "a100", "--scheme", "fp8_per_tensor"],
    ["explain", "--device", "cpu"],
    ["kernels"],
    ["devices"],
    ["matrix"],
]


@pytest.mark.parametrize("argv", NARROW, ids=" ".join)
@pytest.mark.parametrize("tty", [False, True])
def test_text_output_fits_80_columns(argv: list[str], tty: bool) -> None:
    _, out, _ = _run(*argv, env={"COLUMNS": "80", "NO_COLOR": "1"}, tty=tty)
    assert out
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert not too_wide


def test_wrapped_text_keeps_every_word() -> None:
    _, out, _ = _run(*EXPLAIN_A100, env={"COLUMNS": "80"})
    decision = kp.choose(
        kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    )
    assert isinstance(decision, kp.Rejected)
    # Each reason's continuation lines hold nothing else, so its words follow one another.
    for text in [r.render() for r in decision.reasons] + [f"hint: {h}" for h in decision.hints]:
        assert _words(text) in _words(out), text
    _, out, _ = _run("kernels", env={"COLUMNS": "80"})
    for spec in kp.default_catalog().kernels:
        for rule in spec.rules:
            assert _words(rule.render()) in _words(out), rule.render()
    _, out, _ = _run("matrix", env={"COLUMNS": "80"})
    for entry in json.loads(_run("matrix", "--format", "json")[1])["entries"]:
        if entry["reason"]:
            assert _words(entry["reason"]["message"]) in _words(out), entry


def test_output_into_a_pipe_is_not_wrapped() -> None:
    _, out, _ = _run(*EXPLAIN_A100)  # no COLUMNS and not a terminal: a file or a pipe
    per_token = "weight-only (W8A16) kernel cannot honour per-token activation quantization"
    assert max(len(line) for line in out.splitlines()) > 80
    assert any(per_token in line for line in out.splitlines())


@pytest.mark.parametrize("width", [1, 2, 3, 7, 12, 30])
def test_wrap_breaks_words_only_where_it_must(width: int) -> None:
    text = "requires  cuda_rowwise_scaled_mm on NVIDIA A100-SXM4-80GB; has 8.0"
    lines = wrap(text, width)
    assert all(len(line) <= width for line in lines)
    assert "".join("".join(lines).split()) == "".join(text.split())
    if width >= 2 + len("cuda_rowwise_scaled_mm"):
        assert any("cuda_rowwise_scaled_mm" in line for line in lines)


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


@pytest.mark.parametrize(
    "argv",
    [["matrix"], EXPLAIN_A100, ["kernels"], ["devices", "--json"], ["--help"], ["--version"]],
    ids=" ".join,
)
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    # `kernelpick matrix | head -1`, with the reader gone before the first write, so that
    # the write fails every time (a reader that leaves after one line may be too late).
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "kernelpick", *argv], stdout=write, stderr=subprocess.PIPE,
            text=True, check=False, cwd=ROOT, env={"PATH": "", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE


def test_bench_reports_each_stage_on_stderr() -> None:
    args = ("bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1")
    status, out, err = _run(*args)
    assert status == EXIT_SELECTED
    kernel = next(line.split()[0] for line in out.splitlines() if "e-" in line)
    lines = err.splitlines()
    assert [line.split("] ")[0] for line in lines] == [
        f"kernelpick bench: [{number}/{STAGES}" for number in range(1, STAGES + 1)
    ]
    assert f"timing {kernel} at M=8 N=64 K=64" in lines[1]
    assert _run(*args, "--quiet")[2] == ""


def test_bench_draws_a_bar_on_a_terminal_and_wipes_it() -> None:
    out, err = io.StringIO(), _Tty()
    args = ["bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1"]
    assert main(args, env={}, out=out, err=err) == EXIT_SELECTED
    frames = err.getvalue().split("\r")
    assert "kernelpick bench: [" not in err.getvalue()  # not the plain lines
    assert any(f"quantizing the 64x64 weight  [0/{STAGES} done" in frame for frame in frames)
    assert any(f"[{STAGES - 1}/{STAGES} done" in frame for frame in frames)
    assert frames[-1] == ""  # the bar is gone once the results are printed
    assert frames[-2].strip() == ""


class _FakeEvent:
    """A CUDA event on a clock that only the timed work advances."""

    clock = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.stamp = -1.0

    def record(self) -> None:
        self.stamp = _FakeEvent.clock

    def synchronize(self) -> None:
        assert self.stamp >= 0

    def elapsed_time(self, end: _FakeEvent) -> float:
        return end.stamp - self.stamp  # milliseconds


def test_gpu_timing_uses_cuda_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())

    def run() -> None:
        _FakeEvent.clock += 3.0  # 3 ms of GPU work, and no host time worth measuring

    assert median_seconds(run, 5, torch.device("cuda")) == pytest.approx(0.003)
    assert median_seconds(run, 5, torch.device("cuda", 1)) == pytest.approx(0.003)


def test_cpu_timing_uses_the_host_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_events(*args: object, **kwargs: object) -> None:
        raise AssertionError("CUDA events on a CPU")

    monkeypatch.setattr(torch.cuda, "Event", no_events)
    seconds = median_seconds(lambda: time.sleep(0.002), 3, torch.device("cpu"))
    assert 0.002 <= seconds < 1.0
