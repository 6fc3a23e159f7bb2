"""kernelpick.plan.plan_model: each layer's config and decision per device, the recipe from
a scheme or the checkpoint's own quantization_config (its ignore lists keep layers), and
every refusal loading would make of a layer's part, made before any decision."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import kernelpick as kp
from kernelpick.core import Dtype, InvalidValueError, RejectCode, Scheme, Selected
from kernelpick.integration import CheckpointError
from kernelpick.integration.formats.compressed_tensors import to_config
from kernelpick.plan import plan_model
from tests.plan.test_layers import _mla
from tests.support.model_configs import CONFIGS, small_llama, small_qwen3_moe, write_config

H100 = kp.device_profile("h100")
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
       "weight_block_size": [128, 128]}  # fmt: skip


def _group(summary: kp.ModelSummary, name: str) -> kp.LayerGroup:
    return next(group for group in summary.groups if name in group.names)


def _block_reason(decision: kp.Decision) -> kp.Reason:
    verdict = next(v for v in decision.trace if v.kernel == "cuda_block_scaled_mm")
    (reason,) = [r for r in verdict.reasons if r.code is RejectCode.SHAPE_ALIGNMENT]
    return reason


def test_mla_without_q_lora_rank_runs_its_576_layer_on_the_fallback(tmp_path: Path) -> None:
    where = write_config(tmp_path, {**_mla(None), "quantization_config": FP8})
    (summary,) = plan_model(where, [H100]).summaries
    group = _group(summary, "model.layers.0.self_attn.kv_a_proj_with_mqa")
    assert group.config.weight_shape == (576, 7168)
    assert isinstance(group.decision, Selected)
    assert (group.decision.kernel, group.decision.degraded) == ("cuda_w8a16_torch", True)
    assert _block_reason(group.decision).found == "N=576, K=7168"
    assert "cuda_block_scaled_mm: requires K and N to be multiples of 128; layer has N=576" in (
        summary.render()
    )


@pytest.mark.slow
def test_deepseek_v3_on_h100_falls_back_for_its_fused_576_shard() -> None:
    result = plan_model(CONFIGS / "deepseek-v3", [H100])
    assert (result.recipe.scheme, result.source) == (Scheme.FP8_BLOCK, "quantization_config")
    (summary,) = result.summaries
    group = _group(summary, "model.layers.0.self_attn.fused_qkv_a_proj")
    assert group.count == 61
    assert group.config.weight_shape == (1536 + 576, 7168)
    assert isinstance(group.decision, Selected)
    assert group.decision.degraded
    assert _block_reason(group.decision).found == "N=2112, K=7168"
    others = [g for g in summary.groups if g is not group]
    assert {g.decision.kernel for g in others} == {"cuda_block_scaled_mm"}  # type: ignore[union-attr]
    assert summary.rejected == 0
    assert summary.uncovered


def test_a_compressed_tensors_ignore_list_keeps_its_layers_with_the_reason(tmp_path: Path) -> None:
    qconfig = to_config(Scheme.FP8_PER_CHANNEL, ["lm_head", "re:.*mlp\\.down_proj$"])
    where = write_config(tmp_path, small_llama(quantization_config=qconfig))
    (summary,) = plan_model(where, [H100]).summaries
    kept = {layer.name: layer.reason for layer in summary.kept}
    assert kept["model.layers.0.mlp.down_proj"] == "the checkpoint keeps it in high precision"
    assert "model.layers.1.mlp.down_proj" in kept
    assert kept["lm_head"] == kp.integration.formats.OUTPUT_HEAD_KEPT  # the head's own default
    assert not any("down_proj" in name for g in summary.groups for name in g.names)


def test_fine_grained_fp8_modules_to_not_convert_keeps_a_whole_layer(tmp_path: Path) -> None:
    qconfig = {**FP8, "modules_to_not_convert": ["model.layers.1"]}
    where = write_config(tmp_path, small_llama(quantization_config=qconfig))
    (summary,) = plan_model(where, [H100]).summaries
    why = "modules_to_not_convert keeps it in high precision"
    kept = [layer.name for layer in summary.kept if layer.reason == why]
    assert sorted(kept) == sorted(f"model.layers.1.{n}" for n in (
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"))  # fmt: skip
    assert summary.layers == 4


def test_a_fused_layer_whose_shards_the_checkpoint_keeps_apart_is_refused(tmp_path: Path) -> None:
    qconfig = to_config(Scheme.FP8_PER_CHANNEL, ["re:.*k_proj$"])
    where = write_config(tmp_path, small_llama(quantization_config=qconfig))
    with pytest.raises(CheckpointError, match="qkv_proj quantized apart"):
        plan_model(where, [H100])


def test_pre_quantized_shards_that_would_share_a_block_are_refused_as_loading_refuses(
    tmp_path: Path,
) -> None:
    # q has 5 heads of 64 rows: 320, no whole number of 128-row blocks before k.
    shape = {"hidden_size": 320, "num_attention_heads": 5, "num_key_value_heads": 1}
    pre = write_config(tmp_path / "pre", small_llama(**shape, quantization_config=FP8))
    with pytest.raises(InvalidValueError, match=r"output_partition_sizes of .*qkv_proj"):
        plan_model(pre, [H100])
    # Quantized as it loads, the fused layer is quantized whole: no shard to straddle.
    online = write_config(tmp_path / "online", small_llama(**shape))
    (summary,) = plan_model(online, [H100], "fp8_block").summaries
    assert summary.layers == 8


def test_a_block_split_between_ranks_is_refused(tmp_path: Path) -> None:
    # Two ranks hold one KV head (64 rows) of k and of v each: half a 128-row block.
    where = write_config(tmp_path, small_llama())
    with pytest.raises(InvalidValueError, match=r"qkv_proj \[128, 64, 64\].*scale block, 128"):
        plan_model(where, [H100], "fp8_block", tensor_parallel=2)
    (summary,) = plan_model(where, [H100], "fp8_per_channel", tensor_parallel=2).summaries
    assert summary.layers == 8  # a channel is no block: the same split loads


def test_an_integer_layer_cut_along_k_says_into_how_many_parts(tmp_path: Path) -> None:
    where = write_config(tmp_path, small_llama())
    (summary,) = plan_model(where, [H100], "int4_weight_only", group_size=64,
                            tensor_parallel=2).summaries  # fmt: skip
    down = _group(summary, "model.layers.0.mlp.down_proj")
    assert (down.config.k, down.config.k_parts) == (256, 2)
    assert _group(summary, "model.layers.0.mlp.gate_up_proj").config.k_parts == 1


@pytest.mark.parametrize(
    ("scheme", "qconfig", "found"),
    [(None, None, "nothing"), ("fp8_block", FP8, "beside --scheme")],
)
def test_a_config_with_neither_or_both_schemes_is_refused(
    tmp_path: Path, scheme: str | None, qconfig: dict[str, object] | None, found: str
) -> None:
    data = small_llama() if qconfig is None else small_llama(quantization_config=qconfig)
    with pytest.raises(CheckpointError, match=found):
        plan_model(write_config(tmp_path, data), [H100], scheme)


def test_every_device_gets_its_own_summary_in_order(tmp_path: Path) -> None:
    where = write_config(tmp_path, small_llama())
    devices = [kp.device_profile(name) for name in ("t4", "h100", "cpu")]
    result = plan_model(where, devices, "fp8_per_channel")
    assert [s.caps for s in result.summaries] == devices
    assert [s.rejected for s in result.summaries] == [8, 0, 0]
    assert result.rejected == 8


@pytest.mark.parametrize("ignore", [None, ["lm_head", "re:.*mlp\\.down_proj$"]])
def test_the_activations_dtype_changes_no_byte_the_checkpoint_holds(
    tmp_path: Path, ignore: list[str] | None
) -> None:
    """A bfloat16 checkpoint computed in float32: 2 bytes a weight before, in every layer,
    quantized, kept by default or kept by the checkpoint's ignore list alike."""
    if ignore is None:
        where, scheme = write_config(tmp_path, small_llama()), "fp8_per_channel"
    else:
        qconfig = to_config(Scheme.FP8_PER_CHANNEL, ignore)
        where, scheme = write_config(tmp_path, small_llama(quantization_config=qconfig)), None
    plans = {dtype: plan_model(where, [H100], scheme, dtype=dtype).summaries[0]
             for dtype in ("bfloat16", "float32")}  # fmt: skip
    wide, narrow = plans["float32"], plans["bfloat16"]
    assert wide.groups[0].config.input_dtype is Dtype.FLOAT32
    assert (wide.bytes_before, wide.bytes_after) == (narrow.bytes_before, narrow.bytes_after)
    assert {layer.itemsize for layer in wide.kept} == {2}
    n, k = wide.groups[0].config.weight_shape
    assert wide.groups[0].bytes_before == wide.groups[0].count * n * k * 2


def test_experts_are_whole_model_figures_in_the_checkpoints_dtype_or_not_counted(
    tmp_path: Path,
) -> None:
    """Quantized as it loads, the experts stay as the bfloat16 checkpoint stores them, all
    ranks together; a pre-quantized checkpoint stores them as its quantization_config
    says (FP8 and scales here), so no bytes are claimed for them."""
    online = write_config(tmp_path / "online", small_qwen3_moe())
    elements = 2 * 4 * 3 * 128 * 256  # layers x experts x (gate, up, down) x I x H
    for ranks in (1, 2):
        result = plan_model(online, [H100], "fp8_per_channel", tensor_parallel=ranks)
        (experts,) = result.uncovered
        assert (experts.elements, experts.dtype, experts.weight_bytes) == (
            elements,
            Dtype.BFLOAT16,
            elements * 2,
        )
        assert result.summaries[0].uncovered == result.uncovered
    pre = write_config(tmp_path / "pre", small_qwen3_moe(quantization_config=FP8))
    result = plan_model(pre, [H100], tensor_parallel=2)
    (experts,) = result.uncovered
    assert (experts.elements, experts.dtype, experts.weight_bytes) == (elements, None, None)
    assert result.summaries[0].uncovered == result.uncovered
    assert "bytes not counted" in result.summaries[0].render()


def test_a_quantized_router_is_kept_where_the_checkpoint_keeps_it(tmp_path: Path) -> None:
    # Qwen3-MoE FP8 checkpoints list their routers in modules_to_not_convert; vLLM then
    # skips them, as the plan does.
    qconfig = {**FP8, "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    where = write_config(tmp_path, small_qwen3_moe(quantization_config=qconfig))
    (summary,) = plan_model(where, [H100]).summaries
    kept = {layer.name: layer.reason for layer in summary.kept}
    assert kept["model.layers.0.mlp.gate"] == "modules_to_not_convert keeps it in high precision"
    assert not any(name.endswith(".gate") for group in summary.groups for name in group.names)
    # A compressed-tensors checkpoint targeting every Linear quantizes them, as vLLM's
    # GateLinear is one.
    qconfig = to_config(Scheme.FP8_PER_CHANNEL, ["lm_head"])
    where = write_config(tmp_path / "ct", small_qwen3_moe(quantization_config=qconfig))
    (summary,) = plan_model(where, [H100]).summaries
    assert _group(summary, "model.layers.1.mlp.gate").config.weight_shape == (4, 256)
