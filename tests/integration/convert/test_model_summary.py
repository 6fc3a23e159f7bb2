"""model_summary and the conversion report's summary: what each layer of a converted model
runs, its checkpoint bytes measured against the layers' own tensors, and the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import kernelpick as kp
from kernelpick.core import stored_bytes
from kernelpick.integration import (
    QuantizedLinear,
    layer_state,
    load_quantized,
    model_summary,
    quantize_model,
    save_quantized,
)

CPU = kp.device_profile("cpu")
_NOT_STORED = ("bias", "weight_shape")  # the bias is the same both sides; the shape is metadata


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(128, 96), torch.nn.Linear(96, 128))
              for _ in range(3)]  # fmt: skip
    return torch.nn.Sequential(*blocks)


@pytest.mark.parametrize(
    ("scheme", "grouping"),
    [("fp8_per_channel", {}), ("fp8_per_tensor", {}), ("fp8_block", {"block_size": 32}),
     ("int8_per_channel", {}), ("int4_weight_only", {"group_size": 32, "symmetric": False}),
     ("int8_weight_only", {})],
)  # fmt: skip
def test_stored_bytes_are_the_bytes_a_layers_state_dict_holds(
    scheme: str, grouping: dict[str, object]
) -> None:
    model = _model()
    quantize_model(model, scheme, CPU, kp.Policy(), progress=False, **grouping)  # type: ignore[arg-type]
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            held = sum(t.numel() * t.element_size() for key, t in module.state_dict().items()
                       if key not in _NOT_STORED)  # fmt: skip
            assert held == stored_bytes(layer_state(module).config)


def test_the_summary_of_a_loaded_model_is_the_converted_ones(tmp_path: Path) -> None:
    model = _model()
    report = quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), progress=False)
    summary = model_summary(model)
    assert summary == report.summary
    assert [group.count for group in summary.groups] == [3, 3]
    assert summary.groups[0].names == ("0.0", "1.0", "2.0")
    save_quantized(model, tmp_path)
    skeleton = _model()
    loaded = load_quantized(skeleton, tmp_path, CPU, kp.Policy())
    assert model_summary(skeleton).groups == summary.groups
    assert loaded.summary.groups == summary.groups
    record = json.loads(json.dumps(loaded.to_dict()))
    assert record["layers"] == 6
    assert record["measured_bytes_after"] == loaded.bytes_after
    first = summary.groups[0].decision
    assert isinstance(first, kp.Selected)
    assert record["groups"][0]["decision"]["kernel"] == first.kernel


def test_a_model_without_kernelpick_layers_is_refused_by_name() -> None:
    with pytest.raises(kp.InvalidValueError, match="a model holding kernelpick layers"):
        model_summary(_model())


def test_a_layer_kept_by_one_conversion_and_quantized_by_the_next_is_not_listed_kept() -> None:
    model = _model()
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), progress=False,
                   skip=lambda name, _: name.endswith(".1"))  # fmt: skip
    assert [layer.name for layer in model_summary(model).kept] == ["0.1", "1.1", "2.1"]
    quantize_model(model, "fp8_per_channel", CPU, kp.Policy(), progress=False)
    summary = model_summary(model)
    assert summary.kept == ()
    assert summary.layers == 6
    # Each weight counted once: the six layers' high-precision bytes, no kept ones again.
    assert summary.bytes_before == 3 * (96 * 128 + 128 * 96) * 4
