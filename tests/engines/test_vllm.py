"""The vLLM plugin against the real vLLM (0.33.0, CPU): layers built with the kernelpick
config select, load through vLLM's loaders and match the high-precision layer; a device
no kernel fits raises before any parameter exists; the entry point is discovered and
filtered by ``VLLM_PLUGINS``; a tensor-parallel pair of ranks equals one rank.

vLLM lives in its own venv (``make test-engines`` builds ``.venv-engines``: its pins fight
the main venv's), so these tests skip where vLLM is absent. Importing vLLM takes seconds,
so the TP = 1 layers run in this process (one world-size-1 gloo group for the module) and
only what needs a fresh process (plugin discovery, the two ranks) is spawned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp
from kernelpick.integration import KernelSelectionError, layer_state
from tests.engines import vllm_workers as workers

workers.require_vllm()  # before vLLM's first import, which reads the platform

pytestmark = pytest.mark.slow  # vLLM's import alone takes seconds

ROOT = Path(__file__).resolve().parents[2]
# Each spawned process imports vLLM (15-19 s on a 2-core machine, two at a time slower):
# this only bounds a broken one.
SPAWN_TIMEOUT_S = 240
# FP8 accuracy against the high-precision layer (relative Frobenius error). Per-token
# activations and per-channel weights each round to e4m3 (3 mantissa bits): a relative
# error uniform in +-2^-4, RMS 2^-4/sqrt(3) = 0.036 each, about 0.051 for their product,
# and a sum of terms with independent errors keeps that relative size. 0.1 is twice it;
# a wrong scale, a misplaced shard or a transposed weight is off by far more.
FP8_BOUND = 0.1
FP32_BOUND = 1e-5  # a different fp32 summation order (the row-parallel all-reduce)


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _kernel(layer: torch.nn.Module) -> str:
    decision = layer_state(layer).decision
    assert isinstance(decision, kp.Selected)
    return decision.kernel


# -- TP = 1: each parallel layer selects, loads through vLLM, and matches ----------------


@pytest.mark.usefixtures("vllm_tp1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parallel_layers_select_a_cpu_kernel_load_through_vllm_and_match(
    dtype: torch.dtype,
) -> None:
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.parameter import ModelWeightParameter

    from kernelpick.engines.vllm import KernelpickConfig, KernelpickLinearMethod

    config = KernelpickConfig("fp8_per_channel")
    k, n = workers.K, workers.N
    x, w, b = workers.peaked_x(world=1), workers.weight(), workers.bias()
    column = ColumnParallelLinear(
        k, n, bias=True, params_dtype=dtype, quant_config=config, prefix="m.0.up"
    )
    row = RowParallelLinear(
        k, n, bias=True, params_dtype=dtype, quant_config=config, prefix="m.0.down"
    )
    head = 32  # q: 4 heads, k and v: 2 heads each (grouped-query attention)
    qkv = QKVParallelLinear(
        k, head, 4, 2, bias=False, params_dtype=dtype, quant_config=config, prefix="m.0.qkv"
    )
    assert qkv.output_partition_sizes == [128, 64, 64]
    shards = {
        sid: workers.weight(rows, k, seed)
        for sid, rows, seed in zip("qkv", qkv.output_partition_sizes, (3, 4, 5), strict=True)
    }
    gate_up = MergedColumnParallelLinear(
        k, [64, 64], bias=False, params_dtype=dtype, quant_config=config, prefix="m.0.gate_up"
    )
    halves = [workers.weight(64, k, seed) for seed in (6, 7)]
    for layer in (column, row, qkv, gate_up):
        assert isinstance(layer.quant_method, KernelpickLinearMethod)
        # vLLM's own parameter class, so vLLM's weight_loader_v2 narrows and places shards.
        assert isinstance(layer.weight, ModelWeightParameter)
        assert layer.weight.dtype == dtype
        assert _kernel(layer).startswith("cpu_")
    for layer in (column, row):
        layer.weight.weight_loader(layer.weight, w.to(dtype))
        layer.bias.weight_loader(layer.bias, b.to(dtype))
    for sid, tensor in shards.items():  # vLLM's fused-module path: one shard at a time
        qkv.weight.weight_loader(qkv.weight, tensor.to(dtype), sid)
    for index, half in enumerate(halves):  # gate (0) and up (1), as vLLM's models pass them
        gate_up.weight.weight_loader(gate_up.weight, half.to(dtype), index)
    for layer in (column, row, qkv, gate_up):
        layer.quant_method.process_weights_after_loading(layer)
        assert layer.weight.dtype == torch.float8_e4m3fn
    decision = kp.choose(
        kp.probe(),
        kp.quant_config("fp8_per_channel", weight_shape=(n, k), out_dtype=str(dtype)[6:]),
    )
    assert isinstance(decision, kp.Selected)
    assert _kernel(column) == decision.kernel
    reference = x @ w.T + b
    for layer in (column, row):
        out, _ = layer(x.to(dtype))
        assert out.dtype == dtype
        assert _relative(out, reference) < FP8_BOUND, layer.prefix
    out, _ = qkv(x.to(dtype))
    assert _relative(out, x @ torch.cat(list(shards.values())).T) < FP8_BOUND
    out, _ = gate_up(x.to(dtype))
    assert _relative(out, x @ torch.cat(halves).T) < FP8_BOUND


@pytest.mark.usefixtures("vllm_tp1")
def test_a_shard_never_loaded_is_refused_at_processing() -> None:
    from vllm.model_executor.layers.linear import QKVParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    qkv = QKVParallelLinear(
        64,
        16,
        2,
        1,
        bias=False,
        params_dtype=torch.float32,
        quant_config=KernelpickConfig(),
        prefix="m.1.qkv",
    )
    for index, sid in enumerate("qk"):  # v never comes
        rows = qkv.output_partition_sizes[index]
        qkv.weight.weight_loader(qkv.weight, torch.ones(rows, 64), sid)
    with pytest.raises(kp.InvalidValueError, match=r"never loaded: \[2\]"):
        qkv.quant_method.process_weights_after_loading(qkv)


@pytest.mark.usefixtures("vllm_tp1")
@pytest.mark.parametrize(
    "scheme", ["fp8_per_tensor", "fp8_weight_only", "int8_per_channel", "mxfp8"]
)
def test_the_other_online_schemes_run_through_vllm_layers(scheme: str) -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    layer = ColumnParallelLinear(
        workers.K,
        workers.N,
        bias=False,
        params_dtype=torch.float32,
        quant_config=KernelpickConfig(scheme),
        prefix="m.2.up",
    )
    w, x = workers.weight(), workers.peaked_x(world=1)
    layer.weight.weight_loader(layer.weight, w)
    layer.quant_method.process_weights_after_loading(layer)
    out, _ = layer(x)
    assert _relative(out, x @ w.T) < FP8_BOUND, _kernel(layer)


# -- a device no kernel fits -----------------------------------------------------------


@pytest.mark.usefixtures("vllm_tp1")
def test_an_a100_raises_before_any_parameter_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    a100 = kp.device_profile("a100")
    registered: list[str] = []
    original = torch.nn.Module.register_parameter

    def spy(module: torch.nn.Module, name: str, param: Any) -> None:
        registered.append(name)
        original(module, name, param)

    monkeypatch.setattr(torch.nn.Module, "register_parameter", spy)
    config = KernelpickConfig("fp8_per_channel", caps=a100)
    with pytest.raises(KernelSelectionError) as raised:
        ColumnParallelLinear(
            workers.K,
            workers.N,
            bias=True,
            params_dtype=torch.bfloat16,
            quant_config=config,
            prefix="model.layers.0.up",
        )
    assert registered == []  # the weight, the scales and the bias: none was made
    message = str(raised.value)
    assert 'quantization="fp8_per_channel"' in message
    assert "'model.layers.0.up'" in message
    expected = kp.choose(
        a100, kp.quant_config("fp8_per_channel", weight_shape=(workers.N, workers.K))
    )
    assert isinstance(expected, kp.Rejected)
    assert raised.value.rejected == expected
    for verdict in expected.trace:  # every kernel's every reason, word for word
        assert verdict.reasons
        for reason in verdict.reasons:
            assert f"{verdict.kernel}: {reason.render()}" in message
    assert expected.render() in message


# -- the config as vLLM makes it -------------------------------------------------------


def test_from_config_reads_the_checkpoint_keys_and_refuses_others() -> None:
    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig.from_config(
        {"quant_method": "kernelpick", "scheme": "fp8_block", "block_size": 64}
    )
    assert (config.scheme, config.block_size, config.get_name()) == (
        kp.Scheme.FP8_BLOCK,
        64,
        "kernelpick",
    )
    with pytest.raises(kp.InvalidValueError, match="sheme"):
        KernelpickConfig.from_config({"quant_method": "kernelpick", "sheme": "fp8_block"})
    with pytest.raises(kp.KernelpickError, match="fp8_per_chanel"):
        KernelpickConfig.from_config({"quant_method": "kernelpick", "scheme": "fp8_per_chanel"})
    with pytest.raises(kp.InvalidValueError, match="fp8_per_tensor_static"):
        KernelpickConfig.from_config({"scheme": "fp8_per_tensor_static"})  # not online
    with pytest.raises(kp.InvalidValueError, match="block_size"):
        KernelpickConfig.from_config({"scheme": "fp8_per_channel", "block_size": 64})
    with pytest.raises(kp.InvalidValueError, match="quant_method"):
        KernelpickConfig.from_config({"quant_method": "fp8"})
    # What kernelpick's transformers quantizer saves: canonical tensors, so pre-quantized.
    saved = {
        "quant_method": "kernelpick",
        "scheme": "fp8_per_tensor",
        "block_size": None,
        "modules_to_not_convert": ["lm_head"],
        "format_version": 1,
    }
    config = KernelpickConfig.from_config(saved)
    assert config.checkpoint_format.value == "pre_quantized"
    assert config.scheme is kp.Scheme.FP8_PER_TENSOR
    with pytest.raises(kp.InvalidValueError, match="format_version"):
        KernelpickConfig.from_config({**saved, "format_version": 2})


@pytest.mark.usefixtures("vllm_tp1")
def test_modules_to_not_convert_stay_unquantized() -> None:
    from vllm.model_executor.layers.linear import ColumnParallelLinear, UnquantizedLinearMethod

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig.from_config({"modules_to_not_convert": ["mlp.gate"]})
    kept = ColumnParallelLinear(64, 32, quant_config=config, prefix="model.layers.3.mlp.gate")
    converted = ColumnParallelLinear(64, 32, quant_config=config, prefix="model.mlp.gate_up")
    assert isinstance(kept.quant_method, UnquantizedLinearMethod)
    assert not isinstance(converted.quant_method, UnquantizedLinearMethod)


@pytest.mark.usefixtures("vllm_tp1")
def test_a_fused_layer_is_kept_by_its_shards_names_which_must_agree() -> None:
    from vllm.model_executor.layers.linear import (
        QKVParallelLinear,
        RowParallelLinear,
        UnquantizedLinearMethod,
    )

    from kernelpick.engines.vllm import KernelpickConfig

    def qkv(keep: list[str]) -> Any:
        config = KernelpickConfig.from_config({"modules_to_not_convert": keep})
        config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}  # vLLM's
        prefix = "model.layers.0.self_attn.qkv_proj"
        return QKVParallelLinear(64, 16, 4, 2, quant_config=config, prefix=prefix)

    assert isinstance(qkv(["q_proj", "k_proj", "v_proj"]).quant_method, UnquantizedLinearMethod)
    assert isinstance(qkv(["qkv_proj"]).quant_method, UnquantizedLinearMethod)  # vLLM's name
    assert not isinstance(qkv(["o_proj"]).quant_method, UnquantizedLinearMethod)
    with pytest.raises(kp.InvalidValueError, match="fused layer") as caught:
        qkv(["q_proj"])  # q kept, k and v quantized: one layer cannot be both
    assert "q_proj" in str(caught.value)
    # transformers' rule, as its quantizer reads the same list: "mlp" alone keeps nothing
    # inside the layers (neither a prefix nor a suffix of their names).
    config = KernelpickConfig.from_config({"modules_to_not_convert": ["mlp"]})
    down = RowParallelLinear(64, 32, quant_config=config, prefix="model.layers.0.mlp.down_proj")
    assert not isinstance(down.quant_method, UnquantizedLinearMethod)


# -- the entry point ---------------------------------------------------------------------


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engines.vllm_workers", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        output, _ = process.communicate(timeout=SPAWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"worker still running after {SPAWN_TIMEOUT_S} s:\n{output[-4000:]}")
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0, output[-4000:]
    assert lines, output[-4000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    for key, value in changes.items():
        env.pop(key, None)
        if value is not None:
            env[key] = value
    return env


def test_the_entry_point_is_discovered_and_filtered_by_vllm_plugins(tmp_path: Path) -> None:
    """In fresh processes (vLLM loads its plugins once per process), all at once: every
    plugin allowed, kernelpick listed, only another plugin listed. Where it is loaded,
    vLLM's own ModelConfig resolves each kind of checkpoint as documented: a
    compressed-tensors one stays vLLM's unless kernelpick is asked for."""
    runs = {}
    for name, plugins in (("all", None), ("listed", "kernelpick"), ("other", "some_other")):
        scratch = tmp_path / name
        scratch.mkdir()
        runs[name] = _spawn(["plugins", str(scratch)], _env(VLLM_PLUGINS=plugins))
    results = {name: _result(process) for name, process in runs.items()}
    expected = "kernelpick.engines.vllm._config"
    for name in ("all", "listed"):
        found = {key: results[name][key] for key in ("before", "after", "config_module")}
        assert found == {"before": False, "after": True, "config_module": expected}
    assert results["other"] == {"before": False, "after": False, "config_module": ""}
    assert results["all"]["model_configs"] == {
        "compressed-tensors": ["compressed-tensors"],
        "compressed-tensors, quantization=kernelpick": [
            "kernelpick", "KernelpickConfig", "fp8_per_channel", "pre_quantized",
        ],
        "kernelpick": ["kernelpick", "KernelpickConfig", "fp8_per_tensor", "high_precision"],
        "high precision, quantization=kernelpick": [
            "kernelpick", "KernelpickConfig", "fp8_per_channel", "high_precision",
        ],
    }  # fmt: skip


# -- TP = 2 ------------------------------------------------------------------------------


# Per channel: row-parallel scales spanning the split, all-reduced. Per tensor: one scale
# per layer, all-reduced in both styles. Weight-only: equal for any input.
TP_SCHEMES = ("fp8_per_channel", "fp8_per_tensor", "fp8_weight_only")


@pytest.mark.usefixtures("vllm_tp1")
def test_two_ranks_equal_one(tmp_path: Path) -> None:
    """Two gloo ranks: the row-parallel layer's all-reduced output equals TP = 1's (each
    rank's weight scales are the whole layer's, all-reduced; ``peaked_x`` gives each rank
    the whole row's activation scale), and so does the gathered column-parallel one."""
    port = workers.free_port()
    args = [str(port), ",".join(TP_SCHEMES), str(tmp_path)]
    ranks = [_spawn(["tp", str(rank), *args], _env()) for rank in range(workers.WORLD)]
    for process in ranks:
        result = _result(process)
        straddling = result["straddling"]
        # Blocks split between ranks: refused on every rank, in both styles, before the
        # loaders could narrow a checkpoint's block scales to other blocks.
        for style in ("column", "row"):
            assert straddling[style].startswith("InvalidValueError"), straddling
            assert "multiple of the scale block, 128" in straddling[style], straddling
        # vLLM's loaders are handed whole tensors only, replicated KV heads included.
        whole = result["whole"]
        assert whole["replicated_kv_error"] < FP8_BOUND, whole
        assert whole["rank_part"].startswith("KernelInputError"), whole
        assert f"shape [{workers.N}, {workers.K}]" in whole["rank_part"], whole
    part = workers.N // workers.WORLD
    for scheme in TP_SCHEMES:
        single = workers.row_and_column(scheme)  # this process's TP = 1 group
        for rank in range(workers.WORLD):
            shard = torch.load(tmp_path / f"rank{rank}.pt")[scheme]
            for style in ("row", "column"):
                out = shard[f"{style}_out"]
                error = _relative(out, single[f"{style}_out"])
                assert error < FP32_BOUND, (scheme, rank, style, error)
            # Row-parallel: the whole layer's weight scales on every rank, bit for bit.
            assert torch.equal(shard["row_scale"], single["row_scale"]), (scheme, rank)
            column = single["column_scale"]
            rows = slice(rank * part, (rank + 1) * part) if column.numel() > 1 else slice(None)
            assert torch.equal(shard["column_scale"], column[rows]), (scheme, rank)


# -- compressed-tensors FP8-dynamic checkpoints, on request ---------------------------------


def test_compressed_tensors_is_claimed_only_when_the_user_asks_for_kernelpick() -> None:
    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.integration.formats import compressed_tensors as _ct_config

    checkpoint = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ["lm_head"])
    claim = KernelpickConfig.override_quantization_method
    assert claim(checkpoint, "kernelpick") == "kernelpick"
    # Not asked for: vLLM's own compressed-tensors support serves it, as without kernelpick.
    assert claim(checkpoint, None) is None
    assert claim(checkpoint, "compressed-tensors") is None
    assert claim({"quant_method": "fp8"}, "kernelpick") is None


@pytest.mark.usefixtures("vllm_tp1")
def test_a_compressed_tensors_fp8_dynamic_checkpoint_loads_pre_quantized() -> None:
    """The checkpoint's FP8 bytes and per-channel scales, loaded through vLLM's loaders
    (fused q/k/v shards included), give the online layer's output exactly: the same
    canonical weights, whichever path made them."""
    from vllm.model_executor.layers.linear import QKVParallelLinear
    from vllm.model_executor.parameter import ChannelQuantScaleParameter

    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.integration.formats import compressed_tensors as _ct_config
    from kernelpick.kernels import quantize_canonical

    checkpoint = {
        **_ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ["lm_head"]),
        "total_num_heads": 4,  # what vLLM adds to a compressed-tensors config before reading
        "total_num_kv_heads": 2,
    }
    loaded = KernelpickConfig.from_config(checkpoint)
    assert loaded.scheme is kp.Scheme.FP8_PER_CHANNEL
    online = KernelpickConfig("fp8_per_channel")
    k, x = workers.K, workers.peaked_x(world=1)
    shards = {
        sid: workers.weight(rows, k, seed)
        for sid, rows, seed in zip("qkv", (128, 64, 64), (3, 4, 5), strict=True)
    }
    layers = {}
    for name, config in (("checkpoint", loaded), ("online", online)):
        layer = QKVParallelLinear(
            k,
            32,
            4,
            2,
            bias=False,
            params_dtype=torch.float32,
            quant_config=config,
            prefix="m.0.qkv",
        )
        for sid, tensor in shards.items():
            if name == "online":
                layer.weight.weight_loader(layer.weight, tensor, sid)
                continue
            quant = kp.quant_config(
                "fp8_per_channel", weight_shape=(tensor.shape[0], k), out_dtype="float32"
            )
            fp8, scale = quantize_canonical(tensor, quant)
            assert isinstance(layer.weight_scale, ChannelQuantScaleParameter)
            layer.weight.weight_loader(layer.weight, fp8, sid)
            layer.weight_scale.weight_loader(layer.weight_scale, scale, sid)
        layer.quant_method.process_weights_after_loading(layer)
        layers[name] = layer
    assert torch.equal(
        layers["checkpoint"].weight.view(torch.uint8), layers["online"].weight.view(torch.uint8)
    )
    assert torch.equal(layers["checkpoint"](x)[0], layers["online"](x)[0])
    with pytest.raises(kp.KernelpickError, match="kv_cache_scheme"):
        KernelpickConfig.from_config({**checkpoint, "kv_cache_scheme": {"num_bits": 8}})


@pytest.mark.usefixtures("vllm_tp1")
def test_a_compressed_tensors_ignore_list_keeps_those_layers_in_high_precision() -> None:
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.engines.vllm._method import KernelpickLinearMethod
    from kernelpick.integration.formats import compressed_tensors as _ct_config

    checkpoint = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ["model.layers.0.mlp.down"])
    config = KernelpickConfig.from_config(checkpoint)
    config.packed_modules_mapping = {"gate_up": ["gate", "up"]}  # as a vLLM model sets it
    down = RowParallelLinear(64, 32, quant_config=config, prefix="model.layers.0.mlp.down")
    kept = RowParallelLinear(64, 32, quant_config=config, prefix="model.layers.1.mlp.down")
    gate_up = MergedColumnParallelLinear(
        32, [64, 64], quant_config=config, prefix="model.layers.0.mlp.gate_up"
    )
    assert not isinstance(down.quant_method, KernelpickLinearMethod)
    assert isinstance(kept.quant_method, KernelpickLinearMethod)
    assert isinstance(gate_up.quant_method, KernelpickLinearMethod)
    split = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ["model.layers.0.mlp.gate"])
    config = KernelpickConfig.from_config(split)
    config.packed_modules_mapping = {"gate_up": ["gate", "up"]}
    with pytest.raises(kp.InvalidValueError, match="all quantized or all kept"):
        MergedColumnParallelLinear(
            32, [64, 64], quant_config=config, prefix="model.layers.0.mlp.gate_up"
        )


@pytest.mark.usefixtures("vllm_tp1")
@pytest.mark.parametrize("scheme", ["fp8_per_tensor", "int8_per_channel", "fp8_block", "mxfp8"])
def test_a_kernelpick_saved_checkpoint_loads_its_canonical_tensors(scheme: str) -> None:
    """Canonical tensors as kernelpick saves them (``format_version`` 1), one q/k/v shard at
    a time through vLLM's parameter classes: per-tensor scales one per shard (merged to the
    largest when processed), per-channel rows, and block scales."""
    from vllm.model_executor.layers.linear import QKVParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.kernels import quantize_canonical

    block = 32 if scheme == "fp8_block" else None
    config = KernelpickConfig.from_config(
        {"quant_method": "kernelpick", "scheme": scheme, "block_size": block, "format_version": 1}
    )
    k, x = workers.K, workers.peaked_x(world=1)
    layer = QKVParallelLinear(
        k, 32, 4, 2, bias=False, params_dtype=torch.float32, quant_config=config, prefix="m.qkv"
    )
    shards = {}
    for sid, rows, seed in zip("qkv", (128, 64, 64), (3, 4, 5), strict=True):
        shards[sid] = workers.weight(rows, k, seed)
        quant = kp.quant_config(
            scheme, weight_shape=(rows, k), out_dtype="float32", block_size=block
        )
        weight, scale = quantize_canonical(shards[sid], quant)
        layer.weight.weight_loader(layer.weight, weight, sid)
        layer.weight_scale.weight_loader(layer.weight_scale, scale, sid)
    layer.quant_method.process_weights_after_loading(layer)
    out, _ = layer(x)
    assert _relative(out, x @ torch.cat(list(shards.values())).T) < FP8_BOUND, _kernel(layer)
