"""The integer weight-only schemes are decided and run by the core and the kernels, but no
layer, conversion, checkpoint or engine takes them yet: each path refuses them by name,
before anything changes, rather than building a layer another scheme's way."""

from __future__ import annotations

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import Recipe, quantize_model


@pytest.mark.parametrize("scheme", ["int4_weight_only", "int8_weight_only"])
@pytest.mark.parametrize("checkpoint_format", ["high_precision", "pre_quantized"])
def test_a_recipe_refuses_them_by_name(scheme: str, checkpoint_format: str) -> None:
    with pytest.raises(kp.InvalidValueError, match=f"do not take {scheme} yet"):
        Recipe.of(scheme, checkpoint_format=checkpoint_format)


@pytest.mark.parametrize("scheme", ["int4_weight_only", "int8_weight_only"])
def test_quantize_model_refuses_them_and_leaves_the_model_as_it_was(scheme: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(kp.InvalidValueError, match=scheme):
        quantize_model(model, scheme=scheme)
    assert isinstance(model[0], torch.nn.Linear)
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
