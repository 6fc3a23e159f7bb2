"""Patterns on which Python's backtracking ``re`` runs for ever, read and matched through
each of kernelpick's pattern readers, timed in a process of their own (``python -m
tests.support.pattern_timing READER...``; ``timings`` runs it) so that a matcher that hangs cannot
hang the test run: it prints one ``RESULT`` line per pattern as it finishes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kernelpick as kp

ROOT = Path(__file__).resolve().parents[2]
# Each pattern, and a 1000-character name on which Python's re backtracks exponentially.
SLOW = {
    "(.*.*)*X": ("model.layers.10.self_attn.q_proj." * 31)[:1000],
    "(a+)+$": "a" * 999 + "b",
    "(x|x)*y": "x" * 1000,
}
Matcher = Callable[[str], object]
LINEAR = torch.nn.Linear(2, 2)


def _transformers(pattern: str) -> Matcher:
    from kernelpick.engines.transformers import KernelpickConfig
    from kernelpick.engines.transformers._kept import keep_rule

    config = KernelpickConfig(modules_to_not_convert=[pattern])
    rule = keep_rule(torch.nn.Module(), config.modules_to_not_convert)  # as the quantizer does
    return lambda name: rule(name, LINEAR)


def _fine_grained_fp8(pattern: str) -> Matcher:
    from kernelpick.integration.formats import read_layout

    layout = read_layout("config.json", {"quant_method": "fp8",
                                         "modules_to_not_convert": [pattern]})  # fmt: skip
    return lambda name: layout.role(name, LINEAR, lambda _: False)


def _compressed_tensors(where: str) -> Callable[[str], Matcher]:
    def reader(pattern: str) -> Matcher:
        from kernelpick.integration.formats import compressed_tensors as _ct_config
        from kernelpick.integration.formats import read_layout

        ignore = [f"re:{pattern}"] if where == "ignore" else []
        config = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ignore)
        if where == "targets":
            config["config_groups"]["group_0"]["targets"] = [f"re:{pattern}"]
        layout = read_layout("config.json", config)
        return lambda name: layout.role(name, LINEAR, lambda _: False)

    return reader


def _vllm(kind: str) -> Callable[[str], Matcher]:
    def reader(pattern: str) -> Matcher:
        from tests.engines.vllm_workers import cpu_target

        cpu_target()
        from kernelpick.engines.vllm import KernelpickConfig
        from kernelpick.integration.formats import compressed_tensors as _ct_config

        if kind == "modules_to_not_convert":
            config: Any = KernelpickConfig.from_config({"modules_to_not_convert": [pattern]})
            return lambda name: config._keeps(name)  # what get_quant_method asks
        checkpoint = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, [f"re:{pattern}"])
        config = KernelpickConfig.from_config(checkpoint)
        return lambda name: config._quantizes(LINEAR, name)

    return reader


READERS: dict[str, Callable[[str], Matcher]] = {
    "transformers": _transformers,
    "fine_grained_fp8": _fine_grained_fp8,
    "compressed_tensors_targets": _compressed_tensors("targets"),
    "compressed_tensors_ignore": _compressed_tensors("ignore"),
    "vllm": _vllm("modules_to_not_convert"),
    "vllm_compressed_tensors": _vllm("ignore"),
}


def _run(readers: list[str]) -> None:
    for reader in readers:
        READERS[reader]("lm_head")("lm_head")  # imports the engine, untimed
        for pattern, name in SLOW.items():
            start = time.perf_counter()
            try:
                READERS[reader](pattern)(name)
                outcome = f"{time.perf_counter() - start:.3f} s"
            except kp.KernelpickError as error:  # refused when the config is read
                outcome = f"refused: {error}"
            print("RESULT " + json.dumps([reader, pattern, outcome]), flush=True)


def timings(readers: list[str], timeout_s: float) -> dict[tuple[str, str], str]:
    """What each reader made of each pattern (``"0.001 s"``, or ``"refused: ..."``), from a
    fresh process; one still running after ``timeout_s`` is ``"still running"``, and so
    is every one after it."""
    command = [sys.executable, "-m", "tests.support.pattern_timing", *readers]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
        output, failed = done.stdout, done.returncode != 0 and done.stderr[-4000:]
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout
        output, failed = (out.decode() if isinstance(out, bytes) else out or ""), False
    assert not failed, failed
    results = {(r, p): "still running" for r in readers for p in SLOW}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            reader, pattern, outcome = json.loads(line.removeprefix("RESULT "))
            results[reader, pattern] = outcome
    return results


def seconds(outcome: str) -> float:
    """The time an outcome of ``timings`` took: 0 for a refusal, infinite when running."""
    if outcome.startswith("refused: "):
        return 0.0
    if outcome == "still running":
        return float("inf")
    return float(outcome.removesuffix(" s"))


if __name__ == "__main__":
    _run(sys.argv[1:])
