"""``kernelpick bench``: time the selected kernel on this machine, saying on stderr what it is
measuring while it measures (a run takes seconds)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import kernelpick as kp
from kernelpick.cli._commands import EXIT_SELECTED, emit_json
from kernelpick.cli._output import Style, is_terminal, text_table
from kernelpick.cli._parser import shape
from kernelpick.core import SCHEMA_VERSION

if TYPE_CHECKING:
    from tqdm import tqdm

    from kernelpick.bench import Progress

__all__ = ["bench", "progress_to"]


def _write_json(record: Mapping[str, Any], target: str, out: TextIO) -> None:
    if target == "-":
        emit_json(record, out)
        return
    with open(target, "w") as file:
        emit_json(record, file)


class _Bar:
    """A progress bar, drawn from the first stage on and wiped once done: the results
    follow on stdout."""

    def __init__(self, err: TextIO) -> None:
        self._err = err
        self._bar: tqdm[Any] | None = None

    def __call__(self, stage: str, number: int, total: int) -> None:
        from tqdm import tqdm  # imported here, as torch is: only bench pays for it

        if self._bar is None:
            self._bar = tqdm(total=total, desc=stage, file=self._err, leave=False, bar_format=_BAR)
            return
        self._bar.update(number - 1 - self._bar.n)
        self._bar.set_description_str(stage)  # and redraw: a stage can take seconds

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


_BAR = "{desc}  [{n}/{total} done, {elapsed}]"


@contextlib.contextmanager
def progress_to(err: TextIO, quiet: bool = False) -> Iterator[Progress | None]:
    """A progress report on ``err``: a bar on a terminal, one line a stage elsewhere (a log
    keeps every line), nothing when ``quiet``."""
    if quiet:
        yield None
    elif not is_terminal(err):

        def line(stage: str, number: int, total: int) -> None:
            print(f"kernelpick bench: [{number}/{total}] {stage}", file=err, flush=True)

        yield line
    else:
        bar = _Bar(err)
        try:
            yield bar
        finally:
            bar.close()


def bench(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    from kernelpick.bench import bench_layer  # imports torch: only this command pays for it

    if args.tokens < 1 or args.repeats < 1:
        raise kp.InvalidValueError("--tokens/--repeats", (args.tokens, args.repeats), "positive")
    caps = kp.probe()
    import torch

    device = torch.device("cpu") if caps.platform is kp.Platform.CPU else torch.device("cuda")
    layer = (caps, args.scheme, shape(args.shape), args.out_dtype, args.tokens, args.repeats)
    with progress_to(err, args.quiet) as progress:
        result = bench_layer(*layer, device, progress=progress)
    if args.json:
        _write_json({"schema_version": SCHEMA_VERSION, **result.to_dict()}, args.json, out)
        if args.json == "-":
            return EXIT_SELECTED
    n, k = result.shape
    style = Style.for_stream(out, env)
    print(style.wrap(f"device: {caps.render()}", " " * 8), file=out)
    print(f"layer:  {args.scheme}, M={result.tokens} N={n} K={k}, {result.dtype}", file=out)
    flag = " (degraded)" if result.degraded else ""
    kernel_time = result.seconds_kernel

    def row(label: str, seconds: float, error: str) -> list[str]:
        return [label, f"{seconds * 1e3:.3f}", f"{seconds / kernel_time:.2f}", error]

    rows = [
        row(f"{result.kernel}{flag}", kernel_time, f"{result.relative_error:.2e}"),
        row("linear fp32", result.seconds_fp32, "0"),
        row(f"linear {result.dtype}", result.seconds_native, "-"),
    ]
    headers = ["run", "median ms", "time / kernel time", "relative error vs fp32"]
    print(text_table(headers, rows, style), file=out)
    return EXIT_SELECTED
