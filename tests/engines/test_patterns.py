"""The one ``modules_to_not_convert`` rule both engine plugins use is transformers' own:
checked against ``should_convert_module`` on a table of names and patterns, so that a
list means the same to the vLLM plugin as to the transformers quantizer."""

from __future__ import annotations

import pytest
from transformers.quantizers.quantizers_utils import should_convert_module

import kernelpick as kp
from kernelpick.integration.formats._patterns import check_patterns, kept

NAMES = [
    "lm_head",
    "model.layers.1.mlp.up_proj",
    "model.layers.11.mlp.up_proj",
    "model.layers.0.mlp.down_proj",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.mlp.gate_proj",
    "model.decoder.layers.23.fc1",
]
PATTERNS = [
    ["lm_head"],
    ["model.layers.1"],
    ["model.layers.1.mlp"],
    ["model.layers.*"],
    ["model.layers.[0-1].mlp"],
    ["down_proj"],
    ["mlp"],
    ["mlp.gate"],
    ["_proj"],
    ["layers.0"],
    ["fc1", "lm_head"],
    [],
]


@pytest.mark.parametrize("patterns", PATTERNS, ids=repr)
@pytest.mark.parametrize("name", NAMES)
def test_kept_is_transformers_rule(name: str, patterns: list[str]) -> None:
    assert kept(name, patterns) == (not should_convert_module(name, patterns))


@pytest.mark.parametrize(
    ("patterns", "named"),
    [
        ("lm_head", "'lm_head'"),
        (["["], "'['"),
        (["(?i)LM_HEAD"], "'(?i)LM_HEAD'"),  # compiles alone, not inside kept()'s group
        ([""], "''"),
        ([3], "3"),
        (None, "None"),
    ],
)
def test_a_pattern_list_that_cannot_be_read_is_refused(patterns: object, named: str) -> None:
    with pytest.raises(kp.InvalidValueError) as caught:
        check_patterns(patterns)
    assert named in str(caught.value)
