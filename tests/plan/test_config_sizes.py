"""A model's config whose sizes transformers would build into a crash, a hang or nonsense
(zero or negative sizes, floats, strings, KV heads that do not divide the heads, more
layers than any model has) or that its strict config classes refuse: each a
CheckpointError naming the file, the key and the value, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from kernelpick.integration import CheckpointError
from kernelpick.plan import MAX_LAYERS, linear_layers
from kernelpick.plan._sizes import MAX_EXPERTS, check_sizes
from tests.support.model_configs import small_gpt2, small_llama, small_llava, write_config


def _nested(key: str, **changes: Any) -> dict[str, Any]:
    llava = small_llava()
    return {**llava, key: {**llava[key], **changes}}


@pytest.mark.parametrize(
    ("data", "key", "found"),
    [
        (small_llama(num_attention_heads=0), "num_attention_heads", "0"),  # ZeroDivisionError
        (small_llama(num_key_value_heads=0), "num_key_value_heads", "0"),
        (small_llama(hidden_size=-256), "hidden_size", "-256"),
        (small_llama(hidden_size=256.5), "hidden_size", "256.5"),
        (small_llama(hidden_size="256"), "hidden_size", "'256'"),
        (small_llama(hidden_size=True), "hidden_size", "True"),
        (small_llama(vocab_size=0), "vocab_size", "0"),  # built, with an empty head
        (small_llama(num_hidden_layers=0), "num_hidden_layers", "0"),  # no layer at all
        (small_llama(num_hidden_layers=-1), "num_hidden_layers", "-1"),
        (small_llama(num_hidden_layers=MAX_LAYERS + 1), "num_hidden_layers", "1025"),
        (small_llama(num_key_value_heads=3), "num_key_value_heads", "3"),  # 4 heads
        (small_gpt2(n_head=0), "n_head", "0"),  # the key as the file names it
        (_nested("text_config", num_key_value_heads=3), "text_config.num_key_value_heads", "3"),
        (
            _nested("vision_config", num_hidden_layers=MAX_LAYERS + 1),
            "vision_config.num_hidden_layers",
            "1025",
        ),
    ],
)
def test_a_size_no_model_can_have_is_refused_naming_the_file_key_and_value(
    tmp_path: Path, data: dict[str, Any], key: str, found: str
) -> None:
    where = write_config(tmp_path, data)
    with pytest.raises(CheckpointError) as caught:
        linear_layers(where)
    assert (caught.value.path, caught.value.key, caught.value.found) == (str(where), key, found)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),  # StrictDataclassError
        ({"layer_types": ["full_attention"]}, "layer_types"),  # one for two layers
        ({"rope_scaling": [1, 2]}, "rope_parameters"),
    ],
)
def test_a_config_transformers_strict_classes_refuse_is_a_checkpoint_error(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    where = write_config(tmp_path, small_llama(**changes))
    with pytest.raises(CheckpointError, match=named) as caught:
        linear_layers(where)
    assert str(where) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "cap"),
    [("num_global_layers", MAX_LAYERS), ("n_routed_experts", MAX_EXPERTS),
     ("num_experts", MAX_EXPERTS)],
)  # fmt: skip
def test_a_count_of_modules_under_any_name_is_capped(key: str, cap: int) -> None:
    """Mllama's vision num_global_layers, SwitchTransformers' num_experts: modules to build,
    whatever the key, capped as the layer counts are (8,000 took 6 to 13 s)."""
    check_sizes("config.json", {"vision_config": {key: cap}}, lambda _: {})
    with pytest.raises(CheckpointError, match=f"at most {cap} ") as caught:
        check_sizes("config.json", {"vision_config": {key: cap + 1}}, lambda _: {})
    assert caught.value.key == f"vision_config.{key}"


def test_layers_up_to_the_cap_are_read_and_one_more_is_refused() -> None:
    check_sizes("config.json", {"num_hidden_layers": MAX_LAYERS}, lambda _: {})
    with pytest.raises(CheckpointError, match=f"at most {MAX_LAYERS} layers"):
        check_sizes("config.json", {"num_hidden_layers": MAX_LAYERS + 1}, lambda _: {})
    # Under another name the attribute_map gives, and in a sub-config.
    with pytest.raises(CheckpointError, match=r"text_config\.n_layer"):
        check_sizes("config.json", {"text_config": {"n_layer": MAX_LAYERS + 1}},
                    lambda _: {"num_hidden_layers": "n_layer"})  # fmt: skip


def test_a_size_per_layer_and_mlas_unused_head_dim_are_read_as_the_models_give_them() -> None:
    """Gemma 3n gives intermediate_size per layer, Ernie-4.5-VL moe_intermediate_size as a
    list, GLM-5 a head_dim of 0 it does not use: real configs, not refused here."""
    check_sizes("config.json", {"intermediate_size": [16384, 8192]}, lambda _: {})
    check_sizes("config.json", {"text_config": {"head_dim": 0}}, lambda _: {})
    for not_zero in (False, 0.0):  # equal to 0, but no int
        with pytest.raises(CheckpointError, match="a positive int"):
            check_sizes("config.json", {"head_dim": not_zero}, lambda _: {})
    for bad in ([16384, 0], [], [16384, 1.5]):
        with pytest.raises(CheckpointError, match="a positive int, or a list of them"):
            check_sizes("config.json", {"intermediate_size": bad}, lambda _: {})
    # LXMERT counts its layers per stack: each is a count, and capped.
    check_sizes("config.json", {"num_hidden_layers": {"vision": 5, "language": 9}}, lambda _: {})
    with pytest.raises(CheckpointError, match="a positive int, or a list of them"):
        check_sizes("config.json", {"num_hidden_layers": {"vision": 0}}, lambda _: {})
    with pytest.raises(CheckpointError, match=f"at most {MAX_LAYERS} layers"):
        check_sizes("config.json", {"num_hidden_layers": {"vision": MAX_LAYERS + 1}}, lambda _: {})


def test_a_head_dim_of_0_a_model_uses_is_refused_when_transformers_builds_it(
    tmp_path: Path,
) -> None:
    where = write_config(tmp_path, small_llama(head_dim=0))  # ZeroDivisionError in rotary
    with pytest.raises(CheckpointError, match="cannot be built from") as caught:
        linear_layers(where)
    assert (caught.value.path, caught.value.key) == (str(where), "architectures")
