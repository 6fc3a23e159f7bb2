"""``kernelpick bench``: it runs here, reports progress, refuses bad options early, and times
GPU work with CUDA events."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest
import torch

import kernelpick as kp
from kernelpick.bench import STAGES, median_seconds
from kernelpick.cli import EXIT_BAD_INPUT, EXIT_SELECTED, main
from tests.support.cli_run import Tty, assert_fits, run_cli, words

ROOT = Path(__file__).resolve().parents[2]
BENCH_TINY = ("bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1")


def test_bench_runs_on_this_machine() -> None:
    status, out, _ = run_cli(
        "bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1", "--json"
    )
    record = json.loads(out)
    assert status == EXIT_SELECTED
    decision = kp.choose(kp.probe(), kp.quant_config("fp8_per_channel", weight_shape=(64, 64)))
    assert isinstance(decision, kp.Selected)
    assert record["kernel"] == decision.kernel
    assert record["relative_error"] < 0.1
    assert record["seconds_kernel"] > 0


def test_bench_times_an_mxfp8_layer_through_the_integration() -> None:
    # mxfp8 ran through kernelpick.kernels only; with one accept it is a layer like any.
    status, out, _ = run_cli(*BENCH_TINY, "--scheme", "mxfp8", "--json")
    record = json.loads(out)
    assert status == EXIT_SELECTED
    assert record["relative_error"] < 0.1


def test_bench_reports_each_stage_on_stderr() -> None:
    args = ("bench", "--shape", "64,64", "--tokens", "8", "--repeats", "1")
    status, out, err = run_cli(*args)
    assert status == EXIT_SELECTED
    kernel = next(line.split()[0] for line in out.splitlines() if "e-" in line)
    lines = err.splitlines()
    assert [line.split("] ")[0] for line in lines] == [
        f"kernelpick bench: [{number}/{STAGES}" for number in range(1, STAGES + 1)
    ]
    assert f"timing {kernel} at M=8 N=64 K=64" in lines[1]
    assert run_cli(*args, "--quiet")[2] == ""


@pytest.mark.parametrize("width", [40, 20])
def test_bench_output_fits_the_width(width: int) -> None:
    status, out, _ = run_cli(*BENCH_TINY, "--quiet", env={"COLUMNS": str(width)})
    assert status == EXIT_SELECTED
    assert "layer: fp8_per_channel, M=8 N=64 K=64, bfloat16" in words(out)
    assert_fits(out, width, out.replace("\n", " "))  # words only: the times vary by run


BENCH_REFUSED = [
    (["--scheme", "bogus"], ["'bogus'", "fp8_per_channel"]),
    (["--scheme", "fp8_per_tensor_static"],
     ["fp8_per_channel, fp8_per_tensor, fp8_weight_only", "calibrated", "kernelpick explain"]),
    (["--out-dtype", "int8"], ["'int8'", "bfloat16"]),
    (["--json", "/nonexistent/x.json"], ["'/nonexistent/x.json'", "No such file or directory"]),
    (["--json", str(ROOT)], ["can be written", "Is a directory"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "needles"),
    BENCH_REFUSED,
    ids=[
        "unknown scheme",
        "static scheme",
        "unknown dtype",
        "no such directory",
        "a directory",
    ],
)
def test_bench_refuses_bad_options_before_it_starts(options: list[str], needles: list[str]) -> None:
    status, out, err = run_cli(*BENCH_TINY, *options)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith("kernelpick: error: ")
    assert "kernelpick bench: [" not in err  # refused before the first stage, not during it
    assert "checkpoint_format" not in err  # the Python API's remedy, not the command's
    for needle in needles:
        assert needle in err


def _one_error_line(err: str) -> str:
    """The one line of ``err``: kernelpick's error, and no traceback or progress."""
    assert err.startswith("kernelpick: error: "), err
    assert err.count("\n") == 1, err
    return err


# More than a 64-bit machine's address space: no allocator can give it, even overcommitted.
BEYOND_ANY_MEMORY = ["--shape", "10000000,10000000"]


@pytest.mark.parametrize(
    ("options", "needs"),
    [(["--shape", "200000,200000"], "335.5 GiB"), (["--tokens", "100000000"], "8011.0 GiB")],
    ids=["a huge weight", "a huge input"],
)
def test_bench_refuses_a_layer_larger_than_the_memory_before_it_starts(
    options: list[str], needs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelpick.bench._memory.available_bytes", lambda device: 16 * 2**30)
    status, out, err = run_cli("bench", *options)
    assert status == EXIT_BAD_INPUT
    assert out == ""
    line = _one_error_line(err)
    assert f"it needs {needs} of cpu memory and 16.0 GiB is available" in line
    assert "lower --tokens (M) or --shape (N,K)" in line
    # And on this machine, as it reports its memory, for a layer no machine holds.
    monkeypatch.undo()
    status, _, err = run_cli("bench", *BEYOND_ANY_MEMORY)
    assert status == EXIT_BAD_INPUT
    assert re.search(r"it needs \d+\.\d GiB of cpu memory and \d+\.\d GiB is available", err)


def test_an_allocation_that_fails_anyway_is_the_same_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No memory reading (as where none can be read): torch's own allocation fails, for real.
    monkeypatch.setattr("kernelpick.bench._memory.available_bytes", lambda device: None)
    status, out, err = run_cli("bench", *BEYOND_ANY_MEMORY, "--quiet")
    assert status == EXIT_BAD_INPUT
    assert out == ""
    line = _one_error_line(err)
    assert "'M=256 N=10000000 K=10000000'" in line
    assert "allocating failed (tried to allocate 400000000000000 bytes)" in line
    assert "DefaultCPUAllocator" not in line  # torch's words stay in the chained error

    def gpu_out_of_memory(*args: object) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has ..."
        )

    monkeypatch.setattr("kernelpick.bench._layer.processed_layer", gpu_out_of_memory)
    status, _, err = run_cli(*BENCH_TINY, "--quiet")
    assert status == EXIT_BAD_INPUT
    assert "allocating failed (tried to allocate 20.00 GiB)" in _one_error_line(err)

    def another_failure(*args: object) -> None:
        raise RuntimeError("not about memory")

    monkeypatch.setattr("kernelpick.bench._layer.processed_layer", another_failure)
    with pytest.raises(RuntimeError, match="not about memory"):
        run_cli(*BENCH_TINY, "--quiet")  # not disguised as a memory error


def test_a_gpu_benchmark_is_held_to_the_gpus_free_memory_and_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelpick.bench._memory import bench_bytes, check_fits

    gpu = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 2**30, 80 * 2**30))
    check_fits((4096, 4096), 256, 2, gpu)  # 0.1 GiB: fits
    with pytest.raises(kp.InvalidValueError, match=r"of cuda memory and 2\.0 GiB is available"):
        check_fits((32768, 32768), 256, 2, gpu)
    assert bench_bytes((32768, 32768), 256, 2) > 2 * 2**30
    # The weight is drawn in fp32 on the host first: 8 GiB of it for 32768 x 32768.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))
    monkeypatch.setattr(
        "kernelpick.bench._memory.available_bytes",
        lambda device: 80 * 2**30 if device.type == "cuda" else 4 * 2**30,
    )
    with pytest.raises(kp.InvalidValueError, match=r"8\.0 GiB of cpu memory and 4\.0 GiB"):
        check_fits((32768, 32768), 256, 2, gpu)


def test_bench_layer_refuses_a_scheme_before_announcing_a_stage() -> None:
    from kernelpick.bench import bench_layer

    heard: list[str] = []
    with pytest.raises(kp.UnknownNameError):
        bench_layer(
            kp.probe(), "bogus", (64, 64), "bfloat16", 8, 1, torch.device("cpu"),
            progress=lambda stage, number, total: heard.append(stage),
        )  # fmt: skip
    assert heard == []


def test_bench_json_to_a_path_replaces_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "bench.json"
    target.write_text("x" * 10_000)  # longer than the record: it must not survive at its end
    status, out, _ = run_cli(*BENCH_TINY, "--quiet", "--json", str(target))
    assert status == EXIT_SELECTED
    assert json.loads(target.read_text())["tokens"] == 8
    assert out.startswith("device: ")  # and the report, as without --json
    new = tmp_path / "new.json"
    assert run_cli(*BENCH_TINY, "--repeats", "0", "--json", str(new))[0] == EXIT_BAD_INPUT
    assert run_cli(*BENCH_TINY, "--scheme", "bogus", "--json", str(target))[0] == EXIT_BAD_INPUT
    assert not new.exists()
    assert json.loads(target.read_text())["tokens"] == 8  # a refused run leaves it alone

    def fails(*args: object, **kwargs: object) -> None:
        raise kp.InvalidValueError("run", "failed", "to pass")

    monkeypatch.setattr("kernelpick.bench.bench_layer", fails)
    assert run_cli(*BENCH_TINY, "--json", str(new))[0] == EXIT_BAD_INPUT
    assert not new.exists()  # opened before the run, removed when it failed


def test_the_text_and_the_json_give_each_ratio_the_same_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vs_fp32 is a run's time over fp32's in both: the kernel at a quarter of fp32's time
    reads 0.25 in the table and in the record, never 4.00 in one of them."""
    from kernelpick.bench import LayerBench

    timed = LayerBench("cpu_fp8_gemm", False, "CPU", 8, (64, 64), "bfloat16", 1.0, 4.0, 2.0, 0.01)
    monkeypatch.setattr("kernelpick.bench.bench_layer", lambda *args, **kwargs: timed)
    record = json.loads(run_cli(*BENCH_TINY, "--quiet", "--json")[1])
    assert (record["vs_fp32"], record["vs_native"]) == (0.25, 0.5)
    _, out, _ = run_cli(*BENCH_TINY, "--quiet")
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert lines[header].split()[3] == "vs_fp32"  # after run, median ms: the JSON's name
    # Each row: its label, median ms, vs_fp32, error.
    rows = {" ".join(line.split()[:-3]): line.split()[-2] for line in lines[header + 1 : -1]}
    assert rows == {"cpu_fp8_gemm": "0.25", "linear fp32": "1.00", "linear bfloat16": "0.50"}
    assert "vs_fp32 = time / fp32 time (below 1: faster than fp32)" in lines


def test_bench_draws_a_bar_on_a_terminal_and_wipes_it() -> None:
    out, err = io.StringIO(), Tty()
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
