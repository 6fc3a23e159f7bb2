"""``kernelpick bench``: time the selected kernel on this machine, saying on stderr what it is
measuring while it measures (a run takes seconds)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from kernelpick.cli._commands import EXIT_SELECTED, emit_json
from kernelpick.cli._output import Style, is_terminal, text_table
from kernelpick.cli._parser import shape
from kernelpick.core import SCHEMA_VERSION, InvalidValueError, Platform, Scheme, quant_config

if TYPE_CHECKING:
    from tqdm import tqdm

    from kernelpick.bench import Progress

__all__ = ["bench", "progress_to"]


@contextlib.contextmanager
def _json_file(target: str) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """A writer of the record to ``target``, opened before the benchmark runs: a path that
    cannot be written is an error in the first second, not after the run. The file is
    emptied only as the record is written, and a new one is removed if none was."""
    existed = os.path.lexists(target)
    try:
        file = open(target, "a")  # noqa: SIM115 (closed below; "a": not emptied yet)
    except OSError as error:
        raise _unwritable(target, error) from None
    written = False

    def write(record: Mapping[str, Any]) -> None:
        nonlocal written
        try:
            if file.seekable():  # not a pipe, such as /dev/stdout into one
                file.seek(0)
                file.truncate()
            emit_json(record, file)
            file.flush()  # here, so that a full disk is reported as this path's fault
        except OSError as error:
            raise _unwritable(target, error) from None
        written = True

    try:
        with file:
            yield write
    finally:
        if not written and not existed:
            with contextlib.suppress(OSError):
                os.remove(target)


def _unwritable(target: str, error: OSError) -> InvalidValueError:
    reason = error.strerror or type(error).__name__
    return InvalidValueError("--json", target, f"a path that can be written ({reason})")


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
            # write, not print(file=err): print sends to stdout when err is None.
            err.write(f"kernelpick bench: [{number}/{total}] {stage}\n")
            err.flush()

        yield line
    else:
        bar = _Bar(err)
        try:
            yield bar
        finally:
            bar.close()


def bench(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    if args.tokens < 1 or args.repeats < 1:
        raise InvalidValueError("--tokens/--repeats", (args.tokens, args.repeats), "positive")
    # Every option is read before the first progress line, and before torch is imported.
    weight_shape, scheme = shape(args.shape), Scheme.parse(args.scheme)
    quant_config(scheme, weight_shape=weight_shape, out_dtype=args.out_dtype)
    from kernelpick.adapters import probe_device

    # Imports torch: only this command pays for it.
    from kernelpick.bench import RATIO, bench_layer, ratio
    from kernelpick.integration import ONLINE_SCHEMES, Recipe

    try:  # the recipe's own rule: bench quantizes a random layer, online
        Recipe.of(scheme)
    except InvalidValueError:
        # Said for the command, which loads no checkpoint.
        online = ", ".join(s.value for s in ONLINE_SCHEMES)
        expected = (
            f"one of {online}: bench quantizes a random layer, and {scheme.value} needs "
            "activation scales calibrated on data; 'kernelpick explain --device auto "
            f"--scheme {scheme.value}' gives the kernel it would select here"
        )
        raise InvalidValueError("--scheme", args.scheme, expected) from None
    caps = probe_device()
    import torch

    device = torch.device("cpu") if caps.platform is Platform.CPU else torch.device("cuda")
    layer = (caps, args.scheme, weight_shape, args.out_dtype, args.tokens, args.repeats)
    to_file = args.json not in (None, "-")
    with _json_file(args.json) if to_file else contextlib.nullcontext() as write:
        with progress_to(err, args.quiet) as progress:
            result = bench_layer(*layer, device, progress=progress)
        record = {"schema_version": SCHEMA_VERSION, **result.to_dict()}
        if write is not None:
            write(record)
    if args.json == "-":
        emit_json(record, out)
        return EXIT_SELECTED
    n, k = result.shape
    style = Style.for_stream(out, env)
    print(style.wrap(f"device: {caps.render()}", " " * 8), file=out)
    layer_line = f"layer:  {args.scheme}, M={result.tokens} N={n} K={k}, {result.dtype}"
    print(style.wrap(layer_line, " " * 8), file=out)
    flag = " (degraded)" if result.degraded else ""

    def row(label: str, seconds: float, error: str) -> list[str]:
        return [label, f"{seconds * 1e3:.3f}", f"{ratio(seconds, result.seconds_fp32):.2f}", error]

    rows = [
        row(f"{result.kernel}{flag}", result.seconds_kernel, f"{result.relative_error:.2e}"),
        row("linear fp32", result.seconds_fp32, "0"),
        row(f"linear {result.dtype}", result.seconds_native, "-"),
    ]
    # The column is the JSON's vs_fp32, for every run: one ratio, one direction.
    headers = ["run", "median ms", "vs_fp32", "relative error vs fp32"]
    print(text_table(headers, rows, style), file=out)
    print(style.wrap(RATIO.format(baseline="fp32")), file=out)
    return EXIT_SELECTED
