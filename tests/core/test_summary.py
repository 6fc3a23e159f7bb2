"""ModelSummary (kernelpick.core._summary): grouping, counts, bytes, names, rendering and
the JSON record, over example tables and properties."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.core import (
    FEATURE_CPP_TOOLCHAIN,
    KeptLayer,
    ModelSummary,
    UncoveredWeights,
    collapse_names,
    stored_bytes,
)
from tests.core.test_properties import PROPERTY_SETTINGS, configs, profile_names

H100 = kp.device_profile("h100")
CPU = kp.device_profile("cpu")


def _layers(
    caps: kp.DeviceCaps, scheme: str, shapes: dict[str, tuple[int, int]], blocks: int
) -> list[tuple[str, kp.QuantConfig, kp.Decision]]:
    out = []
    for index in range(blocks):
        for name, shape in shapes.items():
            config = kp.quant_config(scheme, weight_shape=shape)
            out.append((f"model.layers.{index}.{name}", config, kp.choose(caps, config)))
    return out


DEEPSEEK = {"self_attn.kv_a_proj_with_mqa": (576, 7168), "mlp.down_proj": (7168, 18432)}


def test_layers_group_by_config_and_decision_in_model_order() -> None:
    summary = ModelSummary.of("fp8_block", H100, _layers(H100, "fp8_block", DEEPSEEK, 3))
    assert [g.count for g in summary.groups] == [3, 3]
    assert summary.groups[0].names == tuple(
        f"model.layers.{i}.self_attn.kv_a_proj_with_mqa" for i in range(3)
    )
    assert summary.layers == 6
    assert summary.degraded == 3  # N = 576 is no multiple of 128: the W8A16 fallback
    assert summary.rejected == 0
    text = summary.render()
    assert "model.layers.{0..2}.self_attn.kv_a_proj_with_mqa" in text
    # The fallback says why the block kernel ahead of it was turned down.
    assert "cuda_block_scaled_mm: requires K and N to be multiples of 128; layer has N=576" in text


def test_a_rejected_group_is_counted_and_rendered_with_every_reason_and_hint() -> None:
    t4 = kp.device_profile("t4")
    layers = _layers(t4, "fp8_per_channel", {"mlp.up_proj": (4096, 4096)}, 2)
    summary = ModelSummary.of("fp8_per_channel", t4, layers)
    assert summary.rejected == 2
    decision = summary.groups[0].decision
    assert isinstance(decision, kp.Rejected)
    text = summary.render()
    assert "REJECTED" in text
    for line in decision.render().splitlines():
        assert line in text
    record = summary.to_dict()
    assert record["rejected"] == 2
    assert record["groups"][0]["decision"]["outcome"] == "rejected"


def test_speed_warnings_are_counted_and_shown() -> None:
    caps = attrs.evolve(CPU, features=CPU.features - {FEATURE_CPP_TOOLCHAIN})
    summary = ModelSummary.of("fp8_per_tensor", caps,
                              _layers(caps, "fp8_per_tensor", {"o_proj": (64, 64)}, 2))  # fmt: skip
    assert summary.warned == 2
    decision = summary.groups[0].decision
    assert isinstance(decision, kp.Selected)
    for warning in decision.warnings:
        assert warning.render() in summary.render()


def test_kept_layers_count_alike_before_and_after_and_say_why() -> None:
    kept = KeptLayer("lm_head", (32000, 4096), 2, "the output head: kept in high precision")
    layers = _layers(H100, "fp8_per_channel", {"mlp.up_proj": (4096, 4096)}, 1)
    summary = ModelSummary.of("fp8_per_channel", H100, layers, [kept])
    assert summary.bytes_before == 4096 * 4096 * 2 + kept.weight_bytes
    # FP8: a byte a weight, and one fp32 scale a row.
    assert summary.bytes_after == 4096 * 4096 + 4096 * 4 + kept.weight_bytes
    assert "kept in high precision: lm_head (32000 x 4096): the output head" in summary.render()


def test_kept_layers_of_one_shape_and_reason_read_as_one_line() -> None:
    why = "an MoE router"
    kept = [KeptLayer(f"model.layers.{i}.mlp.gate", (256, 7168), 2, why) for i in range(3, 61)]
    summary = ModelSummary.of(
        "fp8_block", H100, [], [*kept, KeptLayer("lm_head", (9, 7168), 2, why)]
    )
    lines = [line for line in summary.render().splitlines() if "kept in high precision" in line]
    assert lines == [
        f"  kept in high precision: model.layers.{{3..60}}.mlp.gate (58 x 256 x 7168): {why}",
        f"  kept in high precision: lm_head (9 x 7168): {why}",
    ]
    assert len(summary.to_dict()["kept"]) == 59  # the record keeps every layer


def test_weights_no_decision_covers_are_listed_with_their_bytes_and_in_no_total() -> None:
    names = ("model.layers.3.mlp.experts", "model.layers.4.mlp.experts")
    experts = UncoveredWeights(names, 2 * 8 * 3 * 64 * 32, "bfloat16", "MoE experts as 3-D weights")
    layers = _layers(H100, "fp8_block", DEEPSEEK, 1)
    summary = ModelSummary.of("fp8_block", H100, layers, uncovered=[experts])
    assert summary.bytes_before == ModelSummary.of("fp8_block", H100, layers).bytes_before
    assert experts.weight_bytes == 2 * 8 * 3 * 64 * 32 * 2
    assert ("not covered: 2 module(s), model.layers.{3..4}.mlp.experts (98,304 weights in the "
            "whole model, 192.0 KiB in bfloat16): MoE experts as 3-D weights"
            ) in summary.render()  # fmt: skip
    record = json.loads(json.dumps(summary.to_dict()))
    assert record["uncovered"] == [{"count": 2, "names": list(experts.names), "elements": 98304,
                                    "dtype": "bfloat16", "bytes": 196608,
                                    "reason": experts.reason}]  # fmt: skip
    with pytest.raises(kp.InvalidValueError):
        UncoveredWeights((), 1, "bfloat16", "none")


def test_weights_a_quantization_config_stores_say_their_count_and_no_bytes() -> None:
    # A pre-quantized checkpoint's experts: FP8 and scales, or whatever its config says;
    # the config dtype's bytes would be a figure of a checkpoint that does not exist.
    experts = UncoveredWeights(("model.layers.3.mlp.experts",), 1000, None, "experts")
    assert experts.weight_bytes is None
    assert ("(1,000 weights in the whole model, stored as the checkpoint's quantization_config "
            "says: bytes not counted)") in experts.render()  # fmt: skip
    assert (experts.to_dict()["dtype"], experts.to_dict()["bytes"]) == (None, None)


def test_before_is_the_stored_weights_bytes_whatever_dtype_the_activations_compute_in() -> None:
    # A bfloat16 checkpoint planned with float32 activations: 2 bytes a weight before.
    config = kp.quant_config("fp8_per_channel", weight_shape=(64, 128), input_dtype="float32")
    layers = [("model.layers.0.mlp.up_proj", config, kp.choose(H100, config))]
    summary = ModelSummary.of("fp8_per_channel", H100, layers, weight_itemsize=2)
    assert summary.groups[0].weight_itemsize == 2
    assert summary.bytes_before == 64 * 128 * 2
    assert summary.to_dict()["groups"][0]["bytes_before"] == 64 * 128 * 2
    # Given nothing, the activations' dtype, as before.
    assert ModelSummary.of("fp8_per_channel", H100, layers).bytes_before == 64 * 128 * 4
    with pytest.raises(kp.InvalidValueError, match="weight_itemsize"):
        ModelSummary.of("fp8_per_channel", H100, layers, weight_itemsize=0)


@pytest.mark.parametrize(
    ("names", "collapsed"),
    [(["a.0.q", "a.1.q", "a.2.q"], "a.{0..2}.q"),
     (["a.0.q", "a.2.q", "a.3.q", "a.7.q"], "a.{0,2..3,7}.q"),
     (["lm_head"], "lm_head"),
     (["a.5.q"], "a.5.q"),
     (["lm_head", "a.0.q", "a.1.q", "b.0.k"], "lm_head, a.{0..1}.q, b.0.k"),
     # Only the first numbered part collapses: experts keep their own number.
     (["l.0.e.1.w", "l.1.e.1.w"], "l.{0..1}.e.1.w")],
)  # fmt: skip
def test_collapse_names(names: list[str], collapsed: str) -> None:
    assert collapse_names(names) == collapsed


@pytest.mark.parametrize(
    ("scheme", "shape", "grouping", "expected"),
    [("fp8_per_channel", (64, 128), {}, 64 * 128 + 64 * 4),
     ("fp8_per_tensor_static", (64, 128), {}, 64 * 128 + 4 + 4),
     ("fp8_block", (256, 384), {}, 256 * 384 + 2 * 3 * 4),
     ("mxfp8", (64, 128), {}, 64 * 128 + 64 * 4),  # E8M0: a byte a scale, 4 per row
     ("int8_per_channel", (64, 128), {}, 64 * 128 + 64 * 4),
     # int4 g128: 16 words a row, one fp32 scale a group.
     ("int4_weight_only", (64, 256), {}, 64 * 32 * 4 + 64 * 2 * 4),
     # Zero points pack 8 rows a word; K = 100 takes 13 words, 4 groups of 32.
     ("int4_weight_only", (20, 100), {"group_size": 32, "symmetric": False},
      20 * 13 * 4 + 20 * 4 * 4 + 3 * 4 * 4),
     ("int8_weight_only", (64, 128), {}, 64 * 32 * 4 + 64 * 4)],
)  # fmt: skip
def test_stored_bytes_table(
    scheme: str, shape: tuple[int, int], grouping: dict[str, object], expected: int
) -> None:
    config = kp.quant_config(scheme, weight_shape=shape, **grouping)  # type: ignore[arg-type]
    assert stored_bytes(config) == expected


@PROPERTY_SETTINGS
@given(config=configs, profile=profile_names, copies=st.integers(min_value=1, max_value=5))
def test_summary_counts_add_up_and_its_record_is_json(
    config: kp.QuantConfig, profile: str, copies: int
) -> None:
    caps = kp.device_profiles()[profile]
    decision = kp.choose(caps, config)
    layers = [(f"layers.{i}.proj", config, decision) for i in range(copies)]
    summary = ModelSummary.of("any", caps, layers)
    assert summary.layers == copies
    assert summary.rejected == (copies if isinstance(decision, kp.Rejected) else 0)
    assert summary.bytes_after == copies * stored_bytes(config)
    record = json.loads(json.dumps(summary.to_dict()))
    assert record["groups"][0]["count"] == copies
    assert record["groups"][0]["decision"] == json.loads(json.dumps(decision.to_dict()))
