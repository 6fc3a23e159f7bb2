"""The ``kernelpick`` command: each acceptance behaviour of the CLI is a test here."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpick as kp
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_SELECTED, main
from kernelpick.cli._output import wrap
from kernelpick.core import ENV_DISABLED, SCHEMA_VERSION
from tests.support.cli_run import assert_fits, run_cli, words

ROOT = Path(__file__).resolve().parents[2]


def test_a100_ptpc_is_rejected_and_names_every_cuda_kernel() -> None:
    status, out, _ = run_cli("explain", "--device", "a100", "--scheme", "fp8_per_channel")
    assert status == EXIT_REJECTED
    lines = out.splitlines()
    for kernel in kp.default_catalog().ids_for("cuda"):
        assert any(f"  {kernel}  " in line for line in lines), kernel
    per_token = "weight-only (W8A16) kernel cannot honour per-token activation quantization"
    for kernel in ("cuda_w8a16_cupy", "cuda_w8a16_torch"):
        assert any(kernel in line and per_token in line for line in lines), kernel
    assert "=> rejected" in out


def test_h100_ptpc_selects_rowwise() -> None:
    status, out, _ = run_cli("explain", "--device", "h100")
    assert status == EXIT_SELECTED
    assert "=> selected cuda_rowwise_scaled_mm" in out
    assert any("cuda_rowwise_scaled_mm" in line and "SELECTED" in line for line in out.splitlines())


def test_a_degraded_choice_is_flagged() -> None:
    status, out, _ = run_cli("explain", "--device", "a100", "--scheme", "fp8_per_tensor")
    assert status == EXIT_SELECTED
    assert "SELECTED (degraded)" in out
    assert "=> selected cuda_w8a16_cupy (degraded" in out


def test_json_parses_and_its_decision_matches_choose() -> None:
    args = ("explain", "--device", "mi300x", "--shape", "1024,512", "--out-dtype", "float16")
    status, out, _ = run_cli(*args, "--json")
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
    _, out, _ = run_cli("explain", "--device", "h100", env=env)
    assert "=> selected cuda_channelwise_unfused" in out
    assert "policy: disabled cuda_rowwise_scaled_mm" in out
    _, out, _ = run_cli("explain", "--device", "h100", "--disable", "", env=env)
    assert "=> selected cuda_rowwise_scaled_mm" in out


def test_strict_and_force_flags() -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_tensor")
    assert run_cli(*args, "--strict")[0] == EXIT_REJECTED
    status, out, _ = run_cli("explain", "--device", "h100", "--force", "cuda_channelwise_unfused")
    assert status == EXIT_SELECTED
    assert "not forced: policy forces cuda_channelwise_unfused" in out


BAD_INPUT = [
    # A name that begins several: each is offered, and nothing it does not begin.
    (["explain", "--device", "a10"],
     ["did you mean one of 'a100', 'a10g'?", "kernelpick devices"]),
    (["explain", "--device", "h100", "--scheme", "fp8"],
     ["did you mean one of 'fp8_per_channel', 'fp8_per_tensor', 'fp8_per_tensor_static', "
      "'fp8_weight_only', 'fp8_block'?"]),
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
    status, out, err = run_cli(*argv)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith("kernelpick: error: ")
    for needle in needles:
        assert needle in err


def test_matrix_json_covers_every_profile_and_scheme() -> None:
    status, out, _ = run_cli("matrix", "--format", "json")
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
    _, out, _ = run_cli("matrix", "--scheme", "fp8_weight_only")
    assert "fp8_weight_only" in out
    assert "fp8_per_channel" not in out


def test_the_committed_support_matrix_is_current() -> None:
    _, out, _ = run_cli("matrix", "--format", "markdown")
    committed = (ROOT / "docs" / "support-matrix.md").read_text()
    assert committed == out, (
        "regenerate: kernelpick matrix --format markdown > docs/support-matrix.md"
    )
    assert "docs/support-matrix.md" in (ROOT / "README.md").read_text()


def test_devices_and_kernels_list_the_profiles_and_the_catalog() -> None:
    _, out, _ = run_cli("devices", "--json")
    devices = json.loads(out)["devices"]
    assert [d["profile"] for d in devices] == list(kp.device_profiles())
    assert next(d for d in devices if d["profile"] == "mi300x")["fp8_format"] == "float8_e4m3fnuz"
    _, out, _ = run_cli("kernels", "--json")
    kernels = json.loads(out)["kernels"]
    assert [k["id"] for k in kernels] == list(kp.default_catalog().ids)
    cupy = next(k for k in kernels if k["id"] == "cuda_w8a16_cupy")
    assert cupy["kind"] == "W8A16"
    assert "cupy usable" in cupy["requires"]
    _, text, _ = run_cli("kernels")
    assert "activation none, or per-tensor or per-token-group (degraded)" in text


def test_colour_only_on_a_tty_and_never_with_no_color() -> None:
    wide = {"COLUMNS": "1000"}  # a terminal's output is wrapped to its width: fix the width
    plain = run_cli("explain", "--device", "h100", env=wide)[1]
    coloured = run_cli("explain", "--device", "h100", env=wide, tty=True)[1]
    muted = run_cli("explain", "--device", "h100", env={"NO_COLOR": "1", **wide}, tty=True)[1]
    assert "\x1b[" not in plain
    assert "\x1b[32m" in coloured
    assert muted == plain


def test_rejected_rows_are_drawn_at_normal_intensity() -> None:
    args = ("explain", "--device", "a100", "--scheme", "fp8_per_channel")
    _, out, _ = run_cli(*args, env={"COLUMNS": "1000"}, tty=True)
    assert "\x1b[1m" in out  # colour is on: the header is bold
    assert "\x1b[2m" not in out  # and nothing is faint
    rows = [line for line in out.splitlines() if "  rejected  " in line]
    assert len(rows) == len(kp.default_catalog().ids_for("cuda"))
    assert all("\x1b[" not in row for row in rows)


def test_text_and_json_give_each_kernel_the_same_status() -> None:
    for device in ("h100", "a100"):
        _, text, _ = run_cli("explain", "--device", device, "--scheme", "fp8_per_tensor")
        _, raw, _ = run_cli("explain", "--device", device, "--scheme", "fp8_per_tensor", "--json")
        for entry in json.loads(raw)["trace"]:
            row = next(line for line in text.splitlines() if f"  {entry['kernel']}  " in line)
            assert row.split()[3].lower() == entry["status"], row


def test_version_prints_the_package_version() -> None:
    assert run_cli("--version") == (EXIT_SELECTED, f"kernelpick {kp.__version__}\n", "")


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"]])
def test_help_lists_the_schemes_and_the_device_profiles(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help, and may break at a hyphen
    status, out, _ = run_cli(*argv)
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
    _, out, _ = run_cli(*args)
    lines = out.splitlines()
    assert lines[-len(decision.hints) :] == [f"hint: {hint}" for hint in decision.hints]
    _, raw, _ = run_cli(*args, "--json")
    assert json.loads(raw)["hints"] == list(decision.hints)


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
@pytest.mark.parametrize("width", [80, 40, 20])
def test_text_output_fits_the_width_without_cuttingwords(
    argv: list[str], tty: bool, width: int
) -> None:
    _, out, _ = run_cli(*argv, env={"COLUMNS": str(width), "NO_COLOR": "1"}, tty=tty)
    assert out
    assert_fits(out, width, run_cli(*argv)[1])
    if width == 80:  # every word fits in 80 columns
        assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize("width", [80, 40, 20])
def test_wrapped_text_keeps_every_word(width: int) -> None:
    env = {"COLUMNS": str(width)}
    _, out, _ = run_cli(*EXPLAIN_A100, env=env)
    decision = kp.choose(
        kp.device_profile("a100"), kp.quant_config("fp8_per_channel", weight_shape=(4096, 4096))
    )
    assert isinstance(decision, kp.Rejected)
    # Each reason's continuation lines hold nothing else, so its words follow one another.
    for text in [r.render() for r in decision.reasons] + [f"hint: {h}" for h in decision.hints]:
        assert words(text) in words(out), text
    _, out, _ = run_cli("kernels", env=env)
    for spec in kp.default_catalog().kernels:
        for rule in spec.rules:
            assert words(rule.render()) in words(out), rule.render()
    _, out, _ = run_cli("matrix", env=env)
    for entry in json.loads(run_cli("matrix", "--format", "json")[1])["entries"]:
        if entry["reason"]:
            assert words(entry["reason"]["message"]) in words(out), entry


def test_output_into_a_pipe_is_not_wrapped() -> None:
    _, out, _ = run_cli(*EXPLAIN_A100)  # no COLUMNS and not a terminal: a file or a pipe
    per_token = "weight-only (W8A16) kernel cannot honour per-token activation quantization"
    assert max(len(line) for line in out.splitlines()) > 80
    assert any(per_token in line for line in out.splitlines())


@pytest.mark.parametrize("width", [1, 2, 3, 7, 12, 30])
def test_wrap_breaks_between_words_only(width: int) -> None:
    text = "requires  cuda_rowwise_scaled_mm on NVIDIA A100-SXM4-80GB; has 8.0"
    lines = wrap(text, width)
    assert_fits("\n".join(lines), width, text)
    assert "".join("".join(lines).split()) == "".join(text.split())
    assert all(line.strip() for line in lines)
    # Whole at every width (on a line of its own where it is wider than the line).
    for word in ("cuda_rowwise_scaled_mm", "A100-SXM4-80GB;"):
        assert any(word in line.split() for line in lines), (word, lines)


EVERY_PROFILE_EXPLAINED = [
    (profile, scheme)
    for profile in kp.device_profiles()
    for scheme in ("fp8_per_channel", "fp8_block", "int8_per_channel", "int4_weight_only")
]


@pytest.mark.parametrize("width", [60, 40])
@pytest.mark.parametrize(("profile", "scheme"), EVERY_PROFILE_EXPLAINED)
def test_explain_never_splits_a_kernel_id(profile: str, scheme: str, width: int) -> None:
    argv = ("explain", "--device", profile, "--scheme", scheme)
    _, out, _ = run_cli(*argv, env={"COLUMNS": str(width)})
    assert_fits(out, width, run_cli(*argv)[1])
    said = set(out.split())
    config = kp.quant_config(scheme, weight_shape=(4096, 4096))
    for verdict in kp.choose(kp.device_profile(profile), config).trace:
        assert verdict.kernel in said, (verdict.kernel, out)


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


CUT_SHORT = [
    ["matrix"], EXPLAIN_A100, ["kernels"], ["devices", "--json"],
    ["--help"], ["--version"], ["matrix", "--help"],
]  # fmt: skip


def _own_status(argv: list[str]) -> int:
    return run_cli(*argv)[0]


@pytest.mark.parametrize("argv", CUT_SHORT, ids=" ".join)
@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_a_reader_gone_before_the_first_write_leaves_the_status_alone(
    argv: list[str], unbuffered: bool
) -> None:
    # `kernelpick matrix | head -1`, with the reader gone before the first write, so that
    # the write fails every time. Unbuffered, the first write fails at once, inside argparse
    # for --help and --version.
    env = {"PATH": "", "PYTHONPATH": str(ROOT)} | ({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "kernelpick", *argv], stdout=write, stderr=subprocess.PIPE,
            text=True, check=False, cwd=ROOT, env=env,
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == _own_status(argv)  # 2 for the rejection, 0 for the others


class _GoneAt(io.StringIO):
    """Standard output whose reader leaves at the first ``write`` or at the ``flush`` after
    the whole output was written, as a pipe's buffer would show either."""

    def __init__(self, at: str) -> None:
        super().__init__()
        self.at = at

    def write(self, text: str) -> int:
        if self.at == "write":
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)

    def flush(self) -> None:
        if self.at == "flush":
            raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("argv", CUT_SHORT, ids=" ".join)
def test_the_status_is_the_same_whenever_the_reader_goes(argv: list[str]) -> None:
    statuses = {"never": _own_status(argv)}
    for at in ("write", "flush"):
        err = io.StringIO()
        statuses[at] = main(argv, env={}, out=_GoneAt(at), err=err)
        assert err.getvalue() == ""
    assert set(statuses.values()) == {EXIT_REJECTED if argv == EXPLAIN_A100 else EXIT_SELECTED}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash, for set -o pipefail")
def test_a_pipeline_cut_short_by_head_succeeds_under_pipefail() -> None:
    # All of matrix fits a pipe's buffer, so head may leave before or after the last write,
    # by timing; neither may fail the pipeline, so it runs twice.
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-c", 'set -o pipefail; "$@" matrix | head -1', "bash",
             sys.executable, "-m", "kernelpick"],
            capture_output=True, text=True, check=False, cwd=ROOT,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (EXIT_SELECTED, "")
        assert len(done.stdout.splitlines()) == 1


def _shell(command: str, *argv: str) -> subprocess.CompletedProcess[str]:
    # ``command`` runs in sh, "$@" standing for ``python -m kernelpick ARGV``: a stream can be
    # closed there (2>&-) as a user closes it, which Python then gives as sys.stderr = None.
    return subprocess.run(
        ["/bin/sh", "-c", command, "sh", sys.executable, "-m", "kernelpick", *argv],
        capture_output=True, text=True, check=False, cwd=ROOT,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


BENCH_TINY = ("bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1")


@pytest.mark.slow  # 5 s: three benchmarks, each in a fresh process
def test_with_stderr_closed_json_on_stdout_is_only_json() -> None:
    result = _shell('exec "$@" 2>&-', *BENCH_TINY, "--json")
    assert result.returncode == EXIT_SELECTED
    assert json.loads(result.stdout)["tokens"] == 8  # no progress line before it
    result = _shell('exec "$@" 2>&-', "explain", "--shape", "0,1")
    assert (result.returncode, result.stdout) == (EXIT_BAD_INPUT, "")  # no error line either
    # Descriptor 2 closed after Python started: sys.stderr is there, its writes would fail.
    code = "import os, sys; os.close(2); from kernelpick.cli import main; sys.exit(main())"
    result = _subprocess("-c", code, *BENCH_TINY, "--json")
    assert result.returncode == EXIT_SELECTED
    assert json.loads(result.stdout)["tokens"] == 8


def test_with_stdout_closed_a_command_ends_without_a_traceback() -> None:
    result = _shell('exec "$@" >&-', "kernels")
    assert (result.returncode, result.stderr) == (EXIT_SELECTED, "")


def test_a_closed_stream_given_to_main_takes_nothing() -> None:
    err = io.StringIO()
    err.close()
    out = io.StringIO()
    assert main(["explain", "--shape", "0,1"], env={}, out=out, err=err) == EXIT_BAD_INPUT
    assert out.getvalue() == ""


def test_explain_takes_the_block_size_and_the_tokens_per_call() -> None:
    status, out, _ = run_cli(
        "explain", "--device", "a100", "--scheme", "int8_per_channel", "--json"
    )
    assert status == 0
    assert json.loads(out)["kernel"] == "cuda_int8_int_mm_padded"
    status, out, _ = run_cli(
        "explain", "--device", "a100", "--scheme", "int8_per_channel", "--min-tokens", "17"
    )
    assert status == 0
    assert "M >= 17" in out
    assert out.rstrip().endswith("=> selected cuda_int8_int_mm")
    status, out, _ = run_cli(
        "explain", "--device", "h100", "--scheme", "fp8_block", "--block-size", "64", "--json"
    )
    record = json.loads(out)
    config = kp.quant_config("fp8_block", weight_shape=(4096, 4096), block_size=64)
    assert record["config"]["description"] == config.render()
    assert record["kernel"] == kp.choose(kp.device_profile("h100"), config).to_dict()["kernel"]
    status, _, err = run_cli(
        "explain", "--device", "h100", "--scheme", "fp8_per_channel", "--block-size", "128"
    )
    assert status == 1
    assert "only fp8_block takes a block size" in err
