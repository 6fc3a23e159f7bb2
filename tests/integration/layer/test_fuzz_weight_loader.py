"""Fuzzing the PTPC linear method's ``create_weights`` and weight loader with hypothesis:
tensors of every wrong dtype, shape, layout and shard id load, or are refused by name
and change nothing.

The only allowed outcomes are a correct result or a documented kernelpick error: a
``kp.KernelpickError`` whose message names the bad value. Any other exception (TypeError,
AttributeError, IndexError, a ValueError of Python's own, an error from torch) is a bug of
the library, so nothing here catches more than ``kp.KernelpickError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import kernelpick as kp
from kernelpick.integration import Fp8PtpcLinearMethod, layer_state, weight_loader_of
from tests.support.fuzzing import assert_names, fuzz, positive_int

# Hypothesis fuzzers of a public entry point: seconds in all, so `make check` skips them.
pytestmark = pytest.mark.slow

LOAD_KINDS = (
    "float32",
    "bfloat16",
    "float16",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "noncontiguous",
    "strided",
    "expanded",
    "requires_grad",
    "extra_row",
    "extra_col",
    "transposed",
    "flat",
    "scalar",
    "batched",
    "int64",
    "int8",
    "bool",
    "complex64",
    "meta",
    "list",
)
CONTENTS = ("finite", "finite", "zeros", "nan", "inf", "-inf", "huge")
SHARD_ID: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(-3, 6),
    st.booleans(),
    st.sampled_from(["0", "", 0.0, 1.5, 2**64, -(2**64)]),
    st.sampled_from(["q", "k", "v", "o", "Q"]),  # vLLM's QKV names: valid for 3 shards
)
LOAD: st.SearchStrategy[tuple[str, object, str, int]] = st.tuples(
    st.sampled_from(LOAD_KINDS), SHARD_ID, st.sampled_from(CONTENTS), st.integers(0, 2**16)
)


def _values(rows: int, cols: int, content: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 4
    if content == "zeros":
        values.zero_()
    elif content in ("nan", "inf", "-inf"):
        row = seed % rows
        values[row, (seed // rows) % cols] = float(content)
    elif content == "huge":
        values *= 1e300
    return values


def _loaded(kind: str, rows: int, cols: int, content: str, seed: int) -> object:
    """The tensor (or not-a-tensor) a checkpoint hands to the loader, built for shard rows."""
    values = _values(rows, cols, content, seed)
    if kind in ("float32", "bfloat16", "float16", "float64", "float8_e4m3fn", "float8_e5m2"):
        return values.to(getattr(torch, kind))
    if kind == "noncontiguous":
        return values.float().t().contiguous().t()
    if kind == "strided":
        wide = torch.zeros(rows, 2 * cols)
        wide[:, ::2] = values.float()
        return wide[:, ::2]
    if kind == "expanded":
        return values[:1].float().expand(rows, cols)
    if kind == "requires_grad":
        return values.float().requires_grad_()
    if kind == "extra_row":
        return _values(rows + 1, cols, content, seed).float()
    if kind == "extra_col":
        return _values(rows, cols + 1, content, seed).float()
    if kind == "transposed":
        return values.float().t()
    if kind == "flat":
        return values.float().flatten()
    if kind == "scalar":
        return values.float()[0, 0]
    if kind == "batched":
        return values.float().unsqueeze(0)
    if kind in ("int64", "int8"):
        finite = torch.nan_to_num(values, nan=0.0, posinf=100.0, neginf=-100.0)
        return finite.clamp(-100, 100).to(getattr(torch, kind))
    if kind == "bool":
        return values > 0
    if kind == "complex64":
        return values.to(torch.complex64)
    if kind == "meta":
        return torch.empty(rows, cols, device="meta")
    return values.tolist()


def _load_problems(
    shard_id: object, tensor: object, sizes: Sequence[int], width: int
) -> tuple[list[str], int, int]:
    """Renderings of the bad values of one load (empty when it must load), and the rows."""
    if len(sizes) == 3 and shard_id in ("q", "k", "v"):
        shard_id = "qkv".index(str(shard_id))
    if shard_id is None:
        start, rows = 0, sum(sizes)
    elif (
        isinstance(shard_id, int) and not isinstance(shard_id, bool) and 0 <= shard_id < len(sizes)
    ):
        start, rows = sum(sizes[:shard_id]), sizes[shard_id]
    else:
        return [f"shard_id {shard_id!r}"], 0, 0
    if not isinstance(tensor, torch.Tensor):
        return [type(tensor).__name__], start, rows
    problems: list[str] = []
    if not tensor.is_floating_point() or tensor.dtype.itemsize == 1:  # FP8 is pre-quantized
        problems.append(str(tensor.dtype).removeprefix("torch."))
    if tuple(tensor.shape) != (rows, width):
        problems.append(str(list(tensor.shape)))
    if tensor.device.type == "meta":
        problems.append("meta")
    return problems, start, rows


@fuzz(400)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.integers(1, 8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    st.sampled_from(["", "model.layers.0.self_attn.qkv_proj", "mlp.gate_up", "ümlaut.x", " "]),
    st.lists(LOAD, max_size=5),
    st.sampled_from(["none", "whole", "shards"]),
    st.sampled_from(["finite", "finite", "nan", "inf", "huge"]),
)
@example([3, 2], 8, torch.bfloat16, "q", [("meta", 0, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("int64", 0, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("complex64", None, "finite", 0)], "whole", "finite")
@example([3, 2], 8, torch.bfloat16, "q", [("noncontiguous", 1, "finite", 3)], "whole", "finite")
@example([3, 2], 8, torch.float16, "q", [], "whole", "huge")
@example([3, 2], 8, torch.float32, "q.proj", [], "shards", "nan")
def test_weight_loader_loads_or_names_the_bad_value(
    sizes: list[int],
    width: int,
    params_dtype: torch.dtype,
    prefix: str,
    loads: list[tuple[str, object, str, int]],
    finish: str,
    finish_content: str,
) -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("cpu"), policy=kp.Policy())
    layer = torch.nn.Module()
    n = sum(sizes)
    method.create_weights(layer, width, sizes, width, n, params_dtype, prefix=prefix)
    param = layer.get_parameter("weight")
    assert tuple(param.shape) == (n, width)
    assert param.dtype == params_dtype
    load = weight_loader_of(param)
    state = layer_state(layer)

    if finish == "whole":
        loads = [*loads, ("float32", None, finish_content, 1)]
    elif finish == "shards":
        loads = [*loads, *[("float32", i, finish_content, 7 + i) for i in range(len(sizes))]]

    for kind, shard_id, content, seed in loads:
        index = (
            "qkv".index(shard_id) if len(sizes) == 3 and shard_id in ("q", "k", "v") else shard_id
        )
        rows_for = sizes[index] if isinstance(index, int) and 0 <= index < len(sizes) else n
        tensor = _loaded(kind, rows_for, width, content, seed)
        problems, start, rows = _load_problems(shard_id, tensor, sizes, width)
        before, loaded_before = param.detach().clone(), set(state.loaded.get("weight", set()))
        if problems:
            with pytest.raises(kp.KernelpickError) as caught:
                load(param, tensor, shard_id)  # type: ignore[arg-type]
            assert_names(caught.value, *problems)
            # A refused load changes nothing.
            assert torch.equal(param.detach().view(torch.uint8), before.view(torch.uint8))
            assert state.loaded.get("weight", set()) == loaded_before
            continue
        assert isinstance(tensor, torch.Tensor)
        load(param, tensor, shard_id)  # type: ignore[arg-type]
        torch.testing.assert_close(
            param.detach()[start : start + rows],
            tensor.to(params_dtype),
            rtol=0,
            atol=0,
            equal_nan=True,
        )

    loaded = state.loaded.get("weight", set())
    every_row = -1 in loaded or loaded >= set(range(len(sizes)))
    if not every_row:
        with pytest.raises(kp.KernelpickError) as missing:
            method.process_weights_after_loading(layer)
        assert_names(missing.value, prefix or "layer")
        return
    finite = bool(torch.isfinite(param.detach()).all())
    if not finite:
        with pytest.raises(kp.KernelpickError) as not_finite:
            method.process_weights_after_loading(layer)
        assert_names(not_finite.value, f"{prefix or 'layer'}.weight")
        return
    method.process_weights_after_loading(layer)
    assert layer.get_parameter("weight").dtype == torch.float8_e4m3fn
    x = torch.ones(2, width, dtype=params_dtype)
    y = method.apply(layer, x)
    assert tuple(y.shape) == (2, n)
    assert bool(torch.isfinite(y).all())


@fuzz(300)
@given(
    st.one_of(st.integers(-2, 8), st.sampled_from([True, 4.0, "8", None, -(2**64)])),
    st.one_of(
        st.lists(st.integers(-1, 4), max_size=3),
        st.lists(st.sampled_from([True, 2.0, "3", None, 0]), min_size=1, max_size=2),
        st.sampled_from([(), 4, "4", None, (2, 2), {1: 2}]),
    ),
    st.sampled_from(
        [
            torch.float32,
            torch.bfloat16,
            torch.float16,
            torch.float64,
            torch.int8,
            torch.float8_e4m3fn,
        ]
    ),
)
def test_create_weights_allocates_or_names_the_bad_value(
    width: object, sizes: object, params_dtype: torch.dtype
) -> None:
    method = Fp8PtpcLinearMethod(caps=kp.device_profile("cpu"), policy=kp.Policy())
    layer = torch.nn.Module()
    problems: list[str] = []
    sizes_ok = isinstance(sizes, (list, tuple)) and len(sizes) > 0 and all(map(positive_int, sizes))
    if not sizes_ok:
        problems.append(repr(sizes))
    elif not positive_int(width):
        problems.append(repr(width))
    name = str(params_dtype).removeprefix("torch.")
    if params_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        problems.append(name)
    create: Any = method.create_weights
    if problems:
        with pytest.raises(kp.KernelpickError) as caught:
            create(layer, width, sizes, width, 0, params_dtype, prefix="p")
        assert_names(caught.value, *problems)
        assert "weight" not in dict(layer.named_parameters())
        return
    assert isinstance(sizes, (list, tuple))
    create(layer, width, sizes, width, 0, params_dtype, prefix="p")
    assert tuple(layer.get_parameter("weight").shape) == (sum(sizes), width)
