"""What the vLLM plugin says about its layers, against the real vLLM (0.33.0, CPU): each
layer shape's kernel on vLLM's own logger (the only one ``vllm serve`` shows), once per
(device, config) there as on kernelpick's, a degraded choice at WARNING, from the first
rank alone; and ``model_summary`` of a model built from vLLM's layer classes.

Records are captured by a handler on the ``vllm`` logger itself, set as vLLM sets it
(level INFO, no propagation), so a record that reached only the root logger would not
count. One fresh process configures vLLM's logging for real, as ``vllm serve`` does,
and its printed output is read.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp
from kernelpick.core import DEGRADED_NOTE
from kernelpick.integration import _log as log_module
from kernelpick.integration import layer_state, model_summary
from tests.engines import vllm_workers as workers

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = pytest.mark.slow  # vLLM's import alone takes seconds

ROOT = Path(__file__).resolve().parents[2]
SPAWN_TIMEOUT_S = 240  # importing vLLM takes 15-19 s here: this only bounds a broken one
HIDDEN, HEAD, HEADS, KV_HEADS, INTERMEDIATE = 128, 32, 4, 2, 192
PLUGIN_LOGGER = "vllm.plugins.kernelpick"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def vllm_records() -> Iterator[list[logging.LogRecord]]:
    """What reaches vLLM's logger, set as ``vllm serve`` sets it; kernelpick's selections
    forgotten before and after (each is logged once per process)."""
    vllm = logging.getLogger("vllm")
    saved = (vllm.level, vllm.propagate)
    capture = _Capture()
    vllm.addHandler(capture)
    vllm.setLevel(logging.INFO)
    vllm.propagate = False
    log_module.forget_logged()
    try:
        yield capture.records
    finally:
        log_module.forget_logged()
        vllm.removeHandler(capture)
        vllm.setLevel(saved[0])
        vllm.propagate = saved[1]


def _plugin(records: list[logging.LogRecord], level: int) -> list[str]:
    return [r.getMessage() for r in records if r.name == PLUGIN_LOGGER and r.levelno == level]


def _model(config: object) -> Any:  # its blocks' attributes, as vLLM's models use them
    """Two decoder blocks' linears as vLLM's Llama makes them, named as their prefixes."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    for index in range(2):
        block, prefix = torch.nn.Module(), f"layers.{index}"
        block.qkv_proj = QKVParallelLinear(
            HIDDEN, HEAD, HEADS, KV_HEADS, bias=False, params_dtype=torch.float32,
            quant_config=config, prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        block.o_proj = RowParallelLinear(
            HEADS * HEAD, HIDDEN, bias=False, params_dtype=torch.float32, quant_config=config,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        block.gate_up_proj = MergedColumnParallelLinear(
            HIDDEN, [INTERMEDIATE] * 2, bias=False, params_dtype=torch.float32,
            quant_config=config, prefix=f"{prefix}.gate_up_proj",
        )  # fmt: skip
        block.down_proj = RowParallelLinear(
            INTERMEDIATE, HIDDEN, bias=False, params_dtype=torch.float32, quant_config=config,
            prefix=f"{prefix}.down_proj",
        )  # fmt: skip
        model.layers.append(block)
    return model


def _load(model: Any) -> None:
    """Every weight through vLLM's loaders (fused ones a shard at a time), then processed."""
    for index, block in enumerate(model.layers):
        qkv, gate_up = block.qkv_proj, block.gate_up_proj
        for seed, (sid, rows) in enumerate(zip("qkv", qkv.output_partition_sizes, strict=True)):
            qkv.weight.weight_loader(qkv.weight, workers.weight(rows, HIDDEN, seed + index), sid)
        for shard in range(2):
            half = workers.weight(INTERMEDIATE, HIDDEN, 5 + shard)
            gate_up.weight.weight_loader(gate_up.weight, half, shard)
        block.o_proj.weight.weight_loader(block.o_proj.weight, workers.weight(HIDDEN, HIDDEN))
        down = workers.weight(HIDDEN, INTERMEDIATE)
        block.down_proj.weight.weight_loader(block.down_proj.weight, down)
        for layer in (qkv, block.o_proj, gate_up, block.down_proj):
            layer.quant_method.process_weights_after_loading(layer)


@pytest.mark.usefixtures("vllm_tp1")
def test_a_models_layers_are_summarised_and_each_shape_logged_once_to_vllms_logger(
    vllm_records: list[logging.LogRecord], caplog: pytest.LogCaptureFixture
) -> None:
    from kernelpick.engines.vllm import KernelpickConfig

    # kernelpick's own logger listens too: its record of a selection, made first, must not
    # stand in for vLLM's.
    caplog.set_level(logging.INFO, logger="kernelpick")
    model = _model(KernelpickConfig())
    _load(model)
    summary = model_summary(model)
    shapes = [(256, 128), (128, 128), (384, 128), (128, 192)]  # qkv, o, gate_up, down
    assert [(g.config.weight_shape, g.names) for g in summary.groups] == [
        (shape, (f"layers.0.{name}", f"layers.1.{name}"))
        for shape, name in zip(shapes, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
                               strict=True)
    ]  # fmt: skip
    assert (summary.layers, summary.kept, summary.rejected, summary.scheme) == (
        8, (), 0, "fp8_per_channel"
    )  # fmt: skip
    decision = layer_state(model.layers[0].qkv_proj).decision
    assert isinstance(decision, kp.Selected)
    kernel = decision.kernel
    selected = [g.decision for g in summary.groups if isinstance(g.decision, kp.Selected)]
    assert {d.kernel for d in selected} == {kernel}  # and none rejected (above)
    infos = _plugin(vllm_records, logging.INFO)
    assert len(infos) == 4  # one per shape, not one per layer
    for message, (n, k), name in zip(infos, shapes, ("qkv_proj", "o_proj", "gate_up_proj",
                                                     "down_proj"), strict=True):  # fmt: skip
        assert message.startswith(f'quantization="fp8_per_channel": {kernel} selected on ')
        assert f"N={n} K={k}" in message
        assert message.endswith(f"(first at layer 'layers.0.{name}')")
    assert not _plugin(vllm_records, logging.WARNING)
    ours = [r.getMessage() for r in caplog.records if r.name == "kernelpick.integration"]
    assert ours == infos  # the same text, made once, on each logger once


@pytest.mark.usefixtures("vllm_tp1")
def test_a_degraded_choice_warns_on_vllms_logger(vllm_records: list[logging.LogRecord]) -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    # An A100 runs fp8_per_tensor weight-only; selecting needs no A100, so no weights load.
    config = KernelpickConfig("fp8_per_tensor", caps=kp.device_profile("a100"))
    for index in range(2):
        ColumnParallelLinear(HIDDEN, HIDDEN, bias=False, quant_config=config, prefix=f"l.{index}")
    warnings = _plugin(vllm_records, logging.WARNING)
    assert len(warnings) == 1
    assert DEGRADED_NOTE in warnings[0]
    assert "(first at layer 'l.0')" in warnings[0]
    assert not _plugin(vllm_records, logging.INFO)


@pytest.mark.usefixtures("vllm_tp1")
def test_only_the_first_rank_logs_to_vllms_logger(
    vllm_records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.distributed
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    monkeypatch.setattr(vllm.distributed, "is_global_first_rank", lambda: False)
    layer = ColumnParallelLinear(
        HIDDEN, HIDDEN, bias=False, quant_config=KernelpickConfig(), prefix="l.0"
    )
    assert layer_state(layer).decision.kernel  # selected, and said by the first rank only
    assert not [r for r in vllm_records if r.name == PLUGIN_LOGGER]


def test_vllm_serves_logging_prints_the_selection_once() -> None:
    """In a fresh process whose logging vLLM configured as ``vllm serve`` does: the line
    is printed in vLLM's format, once (kernelpick's own logger has no handler there), for
    an INFO selection and for a degraded one's WARNING."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.engines.vllm_workers", "logging"], cwd=ROOT,
        env=os.environ | {"VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_COLOR": "0"},
        capture_output=True, text=True, timeout=SPAWN_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    kernel = json.loads(lines[-1].removeprefix("RESULT "))["kernel"]
    selected = [line for line in (result.stdout + result.stderr).splitlines()
                if 'quantization="fp8_per_channel"' in line]  # fmt: skip
    assert len(selected) == 1, selected
    line = selected[0]
    assert " INFO " in line
    assert f"{kernel} selected on " in line
    assert f"N={workers.N} K={workers.K}" in line
    assert line.endswith("(first at layer 'model.layers.0.mlp.up_proj')")
    print(line)  # the example docs/engines.md shows
    # A WARNING too is printed once, in vLLM's format: kernelpick's logger, which no one
    # configured, does not hand it to logging's last resort as well.
    degraded = [line for line in (result.stdout + result.stderr).splitlines()
                if 'quantization="fp8_per_tensor"' in line]  # fmt: skip
    assert len(degraded) == 1, degraded
    assert " WARNING " in degraded[0]


def test_only_the_selections_logger_is_quieted() -> None:
    """vLLM's logger carries the selections, so kernelpick.integration's last resort is
    quieted; kernelpick's other warnings (a build lock waited for, an ISA level that did
    not compile) still reach stderr where nothing else is configured."""
    from kernelpick.engines.vllm import _method  # noqa: F401  # the plugin's method, loaded
    from kernelpick.integration import SELECTIONS_LOGGER

    def quiet(name: str) -> bool:
        return any(isinstance(h, logging.NullHandler) for h in logging.getLogger(name).handlers)

    assert quiet(SELECTIONS_LOGGER)
    assert not quiet("kernelpick")
    assert not quiet("kernelpick.kernels")
