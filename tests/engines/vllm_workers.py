"""What the vLLM tests run in processes of their own (``python -m tests.engines.vllm_workers
SCENARIO ...``): plugin discovery, which vLLM does once per process, and the ranks of a
tensor-parallel group. Also the seeded tensors and the vLLM set-up the test process shares.

vLLM is imported inside the functions only, after ``VLLM_TARGET_DEVICE=cpu`` is set, so
this module imports (and type-checks) where vLLM is absent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kernelpick as kp

N, K = 128, 256  # the whole layer: weight [N, K]
TOKENS = 6
WORLD = 2


def cpu_target() -> None:
    """vLLM reads its platform once, at import: CPU, whatever the machine has."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"


def require_vllm() -> None:
    """At the top of a vLLM test module: skip it where vLLM is absent (the main venv), fail
    under ``make test-engines`` (where a skip would pass it), and aim vLLM at the CPU
    before its first import."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("KERNELPICK_REQUIRE_VLLM"):
            pytest.fail("KERNELPICK_REQUIRE_VLLM is set, but vLLM cannot be imported here")
        pytest.skip(
            "vLLM is not installed in this venv; `make test-engines` runs these tests in "
            ".venv-engines, which has vllm 0.33.0",
            allow_module_level=True,
        )
    cpu_target()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def weight(n: int = N, k: int = K, seed: int = 0) -> torch.Tensor:
    """Rows of different magnitudes, so that per-channel scales differ from row to row."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.linspace(0.5, 4.0, n).unsqueeze(1)
    return torch.randn(n, k, generator=generator) * rows


def bias(n: int = N, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def peaked_x(k: int = K, world: int = WORLD) -> torch.Tensor:
    """Activations whose every row has its amax (the same |value|) in each rank's K slice,
    so each rank's per-token activation scale is the whole row's."""
    x = torch.randn(TOKENS, k, generator=torch.Generator().manual_seed(2))
    peak = x.abs().amax(dim=1) + 1.0
    part = k // world
    for rank in range(world):
        x[:, rank * part + 3] = peak if rank % 2 == 0 else -peak
    return x


@contextlib.contextmanager
def vllm_group(world: int, rank: int, port: int) -> Iterator[None]:
    """vLLM's distributed state on gloo over loopback, inside a current ``VllmConfig``."""
    cpu_target()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world, rank, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=rank,
            backend="gloo",
        )  # fmt: skip
        initialize_model_parallel(tensor_model_parallel_size=world)
        try:
            yield
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


def row_and_column(scheme: str) -> dict[str, torch.Tensor]:
    """A row-parallel layer (vLLM splits the whole ``peaked_x``, all-reduces the partial
    outputs) and a column-parallel one (outputs gathered), each loaded from the whole
    checkpoint tensors through vLLM's loaders; with this rank's weight scales."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    config = KernelpickConfig(scheme)
    x, w, b = peaked_x(), weight(), bias()
    row = RowParallelLinear(
        K, N, bias=True, input_is_parallel=False, params_dtype=torch.float32,
        quant_config=config, prefix="model.layers.0.o_proj",
    )  # fmt: skip
    column = ColumnParallelLinear(
        K, N, bias=True, gather_output=True, params_dtype=torch.float32, quant_config=config,
        prefix="model.layers.0.up_proj",
    )  # fmt: skip
    out: dict[str, torch.Tensor] = {}
    for name, layer in (("row", row), ("column", column)):
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        layer.quant_method.process_weights_after_loading(layer)
        out[f"{name}_out"] = layer(x)[0]
        out[f"{name}_scale"] = layer.weight_scale.detach().clone()
    return out


# A tiny model's config.json: vLLM reads its quantization_config when it makes a ModelConfig.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 64,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}  # fmt: skip


def _plugins(scratch: Path) -> dict[str, Any]:
    cpu_target()
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        get_quantization_config,
    )
    from vllm.plugins import load_general_plugins

    before = "kernelpick" in QUANTIZATION_METHODS
    load_general_plugins()
    after = "kernelpick" in QUANTIZATION_METHODS
    found = get_quantization_config("kernelpick").__module__ if after else ""
    result: dict[str, Any] = {"before": before, "after": after, "config_module": found}
    if after:
        result["model_configs"] = _model_configs(scratch)
    return result


def _model_configs(scratch: Path) -> dict[str, list[str]]:
    """Which quantization vLLM settles on, and the config it then makes, for checkpoints
    of each kind with and without ``quantization="kernelpick"``."""
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    from kernelpick.integration.formats import compressed_tensors as _ct_config

    ct = _ct_config.to_config(kp.Scheme.FP8_PER_CHANNEL, ["lm_head"])
    own = {"quant_method": "kernelpick", "scheme": "fp8_per_tensor"}
    cases: dict[str, tuple[dict[str, Any] | None, str | None]] = {
        "compressed-tensors": (ct, None),
        "compressed-tensors, quantization=kernelpick": (ct, "kernelpick"),
        "kernelpick": (own, None),
        "high precision, quantization=kernelpick": (None, "kernelpick"),
    }
    found: dict[str, list[str]] = {}
    for name, (quantization_config, user) in cases.items():
        config = dict(TINY_LLAMA)
        if quantization_config is not None:
            config["quantization_config"] = quantization_config
        (scratch / "config.json").write_text(json.dumps(config))
        model = ModelConfig(model=str(scratch), skip_tokenizer_init=True, quantization=user)
        made = [str(model.quantization)]
        if model.quantization == "kernelpick":
            quant = get_quant_config(model, LoadConfig())
            made += [type(quant).__name__, quant.scheme.value, quant.checkpoint_format.value]
        found[name] = made
    return found


def straddling_blocks() -> dict[str, str]:
    """A pre-quantized fp8_block layer (block 128) whose rank parts are 224 rows or inputs,
    each style: the error each raises, or "built". vLLM's loaders would narrow such a
    checkpoint's block scales to other blocks, so it must be refused before allocation."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    saved = {"quant_method": "kernelpick", "scheme": "fp8_block", "format_version": 1}
    config = KernelpickConfig.from_config({**saved, "block_size": 128})
    found: dict[str, str] = {}
    for style, layer, (k, n) in (
        ("column", ColumnParallelLinear, (256, 448)),
        ("row", RowParallelLinear, (448, 256)),
    ):
        try:
            layer(k, n, quant_config=config, prefix=f"m.{style}")
        except Exception as error:  # reported to the test process, which judges it
            found[style] = f"{type(error).__name__}: {error}"
        else:
            found[style] = "built"
    return found


def whole_tensors(rank: int) -> dict[str, Any]:
    """What kernelpick checks vLLM's loaders are handed on a rank: whole checkpoint tensors.
    A QKV layer of one KV head, which vLLM replicates on both ranks (so its checkpoint rows
    are not the rank's part times the world), loads and matches; a rank's part of a
    column-parallel weight, which vLLM would narrow again, is refused."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig

    config, head, x = KernelpickConfig("fp8_per_channel"), 32, peaked_x(world=1)
    qkv = QKVParallelLinear(
        K, head, 2, 1, bias=False, params_dtype=torch.float32, quant_config=config,
        prefix="m.qkv",
    )  # fmt: skip
    shards = {"q": weight(2 * head, K, 3), "k": weight(head, K, 4), "v": weight(head, K, 5)}
    for sid, tensor in shards.items():
        qkv.weight.weight_loader(qkv.weight, tensor, sid)
    qkv.quant_method.process_weights_after_loading(qkv)
    mine = torch.cat([shards["q"][rank * head : (rank + 1) * head], shards["k"], shards["v"]])
    out = qkv(x)[0]
    error = float((out - x @ mine.T).norm() / (x @ mine.T).norm())
    column = ColumnParallelLinear(K, N, bias=False, quant_config=config, prefix="m.up")
    try:
        column.weight.weight_loader(column.weight, weight()[: N // WORLD])
    except kp.KernelpickError as refused:
        part = f"{type(refused).__name__}: {refused}"
    else:
        part = "loaded"
    return {"replicated_kv_error": error, "rank_part": part}


def _serve_logging() -> dict[str, Any]:
    """vLLM's logging configured as ``vllm serve`` configures it (``LoggingConfig``'s
    defaults: a formatted handler on the ``vllm`` logger alone, which does not propagate),
    then one layer built, loaded and processed: what this process prints is the test's."""
    cpu_target()
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from kernelpick.engines.vllm import KernelpickConfig
    from kernelpick.integration import layer_state

    configure_logging(LoggingConfig())
    with vllm_group(1, 0, free_port()):
        layer = ColumnParallelLinear(
            K, N, bias=False, params_dtype=torch.float32, quant_config=KernelpickConfig(),
            prefix="model.layers.0.mlp.up_proj",
        )  # fmt: skip
        layer.weight.weight_loader(layer.weight, weight())
        layer.quant_method.process_weights_after_loading(layer)
        # A degraded choice (an A100 runs fp8_per_tensor weight-only): a WARNING, selected
        # only, as selecting needs no A100.
        degraded = KernelpickConfig("fp8_per_tensor", caps=kp.device_profile("a100"))
        ColumnParallelLinear(K, N, bias=False, quant_config=degraded, prefix="model.degraded")
    return {"kernel": layer_state(layer).decision.kernel}


def _tp_rank(rank: int, port: int, schemes: list[str], out: Path) -> dict[str, Any]:
    with vllm_group(WORLD, rank, port):
        tensors = {scheme: row_and_column(scheme) for scheme in schemes}
        straddling = straddling_blocks()
        whole = whole_tensors(rank)
    torch.save(tensors, out / f"rank{rank}.pt")
    return {"rank": rank, "straddling": straddling, "whole": whole}


def main(argv: list[str]) -> None:
    scenario = argv[0]
    if scenario == "plugins":
        result = _plugins(Path(argv[1]))
    elif scenario == "logging":
        result = _serve_logging()
    elif scenario == "tp":
        rank, port, schemes, out = int(argv[1]), int(argv[2]), argv[3], Path(argv[4])
        result = _tp_rank(rank, port, schemes.split(","), out)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
