"""Tensor parallelism on this machine: a Llama MLP block split over two CPU processes.

Starts two processes (``torch.multiprocessing``, spawn) joined in a gloo process group,
builds the same tiny random ``transformers`` Llama on each (same seed), and splits its
first MLP block as Megatron-LM does, with ``kernelpick.integration.shard_linear``:
``gate_proj`` and ``up_proj`` column-parallel (each rank keeps half the intermediate
channels), ``down_proj`` row-parallel (each rank keeps the matching half of its inputs).
Each rank computes ``act(gate(x)) * up(x)`` on its own half, with no communication, then
its partial ``down_proj`` output, and one all-reduce (sum) gives the block's output. Each
rank reports the kernel it got for each shard and how far the sharded output is from the
same block quantized whole in one process (``quantize_model`` on a copy); the parent prints
the reports in rank order, then what they mean.

    python examples/tensor_parallel.py      # needs transformers: pip install 'kernelpick[test]'

transformers comes with the ``test`` extra (compressed-tensors brings it). The kernels are
those a probe of this machine selects. The script exits with status 1 if a rank fails, and
stops every process after ``DEADLINE_S`` seconds rather than wait for a stuck peer.
"""

from __future__ import annotations

import copy
import datetime
import importlib.util
import os
import queue
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
HIDDEN = 256  # K of gate_proj and up_proj, N of down_proj
INTERMEDIATE = 512  # split in two: 256 channels per rank
TOKENS = 8
SEED = 0
# Each wait for a peer (the rendezvous, the weight amax all-reduce, the output all-reduce)
# gives up after this long; the parent stops every rank after DEADLINE_S in all.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
DEADLINE_S = 120.0
GRACE_S = 5.0  # for the ranks to leave the process group once the answers are in
PREFIX = "model.layers.0.mlp"


@dataclass(frozen=True)
class Shard:
    name: str  # gate_proj, up_proj, down_proj
    style: str  # column or row
    shape: tuple[int, int]  # this rank's (N, K)
    kernel: str
    degraded: bool


@dataclass(frozen=True)
class RankResult:
    rank: int
    shards: tuple[Shard, ...]
    reference_kernels: tuple[tuple[str, str], ...]  # the whole block's: (layer, kernel)
    same_weights: bool  # every shard's FP8 bytes and scales are the whole block's part
    hidden_max_abs: float  # max |this rank's act(gate) * up - the whole block's half|
    max_abs: float  # max |sharded output - whole quantized block's|
    scale: float  # max |whole quantized block's output|
    fp8_vs_fp32: float  # max |whole quantized - fp32|, for scale: what FP8 itself costs

    @property
    def relative(self) -> float:
        return self.max_abs / self.scale


@dataclass(frozen=True)
class RankFailure:
    rank: int
    error: str  # the traceback, or how the process ended
    said: bool = True  # False: the process ended without a word; its traceback may follow


def build_mlp() -> torch.nn.Module:
    """The first MLP block of a tiny random Llama, the same on every rank (same seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).train(False)
    mlp: torch.nn.Module = model.model.layers[0].mlp
    return mlp


def linear(mlp: torch.nn.Module, name: str) -> torch.nn.Linear:
    module = mlp.get_submodule(name)
    assert isinstance(module, torch.nn.Linear)
    return module


def run_rank(rank: int, init_file: str) -> RankResult:
    """One rank's part: shard the block, run it, compare with the whole quantized block."""
    from kernelpick.integration import layer_state, quantize_model, shard_linear

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
        timeout=COLLECTIVE_TIMEOUT,
    )  # fmt: skip
    try:
        mlp = build_mlp()
        x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(SEED + 1))
        whole = copy.deepcopy(mlp)
        report = quantize_model(whole, progress=False)  # caps=None: a probe of this machine
        styles = {"gate_proj": "column", "up_proj": "column", "down_proj": "row"}
        shards = {
            name: shard_linear(
                linear(mlp, name), style, timeout=COLLECTIVE_TIMEOUT, prefix=f"{PREFIX}.{name}"
            )
            for name, style in styles.items()
        }  # every rank makes the same shards in the same order: down_proj all-reduces its amax
        act = mlp.get_submodule("act_fn")
        with torch.inference_mode():
            expected = whole(x)
            fp32 = mlp(x)
            hidden = act(shards["gate_proj"](x)) * shards["up_proj"](x)  # this rank's half
            out = shards["down_proj"](hidden)  # a partial sum over this rank's inputs
            dist.all_reduce(out)  # Megatron's one collective per MLP block
            whole_hidden = act(whole.get_submodule("gate_proj")(x)) * whole.get_submodule(
                "up_proj"
            )(x)
        part = INTERMEDIATE // WORLD_SIZE
        hidden_diff = (hidden - whole_hidden[:, rank * part : (rank + 1) * part]).abs().max()
        same = all(
            same_as_part(shard, whole.get_submodule(name), styles[name], rank)
            for name, shard in shards.items()
        )
        described = []
        for name, shard in shards.items():
            state = layer_state(shard)
            n, k = state.config.weight_shape
            decision = state.decision
            described.append(Shard(name, styles[name], (n, k), decision.kernel, decision.degraded))
        return RankResult(
            rank, tuple(described),
            tuple((layer.name, layer.kernel) for layer in report.layers), same,
            float(hidden_diff), float((out - expected).abs().max()), float(expected.abs().max()),
            float((expected - fp32).abs().max()),
        )  # fmt: skip
    finally:
        dist.destroy_process_group()


def same_as_part(shard: torch.nn.Module, whole: torch.nn.Module, style: str, rank: int) -> bool:
    """Whether ``shard`` holds ``whole``'s FP8 bytes and scales for this rank's part:
    rows (and their scales) under column parallelism, columns (and every scale) under row
    parallelism."""
    weight, scale = shard.get_parameter("weight"), shard.get_parameter("weight_scale")
    dim = 0 if style == "column" else 1
    size = weight.shape[dim]
    part = whole.get_parameter("weight").narrow(dim, rank * size, size)
    scales: torch.Tensor = whole.get_parameter("weight_scale")  # per channel: [N, 1]
    if style == "column":
        scales = scales.narrow(0, rank * size, size)
    same_bytes = torch.equal(weight.view(torch.uint8), part.view(torch.uint8))
    return same_bytes and torch.equal(scale, scales)


def worker(rank: int, init_file: str, results: Queue[RankResult | RankFailure]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # two processes on one machine
    torch.set_num_threads(1)  # two ranks on two cores
    try:
        results.put(run_rank(rank, init_file))
    except BaseException:
        results.put(RankFailure(rank, traceback.format_exc()))
        sys.exit(1)


def collect(
    processes: list[SpawnProcess], results: Queue[RankResult | RankFailure]
) -> list[RankResult | RankFailure]:
    """Every rank's answer, or as many as came before the first failure or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    answers: list[RankResult | RankFailure] = []
    while len(answers) < len(processes) and time.monotonic() < deadline:
        try:
            answer = results.get(timeout=0.5)
        except queue.Empty:
            answered = {a.rank for a in answers}
            for rank, process in enumerate(processes):
                if rank not in answered and process.exitcode not in (None, 0):
                    ended = f"exited with status {process.exitcode}"
                    answers.append(RankFailure(rank, ended, said=False))
            if any(isinstance(a, RankFailure) for a in answers):
                break
            continue
        answers.append(answer)
        if isinstance(answer, RankFailure):
            break  # its peers stop at their next collective; no need to wait for them
    return answers


def drain(
    results: Queue[RankResult | RankFailure], answers: list[RankResult | RankFailure]
) -> list[RankResult | RankFailure]:
    """``answers`` with those still in the queue once every process has stopped: one per
    rank that gave one, a rank's own word before what its exit status says."""
    by_rank = {answer.rank: answer for answer in answers}
    while True:
        try:
            answer = results.get(timeout=0.1)
        except queue.Empty:
            return [by_rank[rank] for rank in sorted(by_rank)]
        known = by_rank.get(answer.rank)
        if known is None or (isinstance(known, RankFailure) and not known.said):
            by_rank[answer.rank] = answer


def stop(processes: list[SpawnProcess], grace_s: float) -> None:
    """Join every process; those still running ``grace_s`` seconds on are terminated, then
    killed."""
    end = time.monotonic() + grace_s
    for process in processes:
        process.join(timeout=max(0.0, end - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


def show(done: list[RankResult]) -> None:
    """Each rank's kernels and differences, in rank order."""
    print(
        f"{PREFIX} of a tiny Llama (hidden {HIDDEN}, intermediate {INTERMEDIATE}), {TOKENS} "
        f"tokens,\nsplit over {WORLD_SIZE} ranks (gloo, CPU); differences are from the block "
        "quantized whole."
    )
    for result in done:
        label = f"rank {result.rank}:"
        print()
        for shard in result.shards:
            n, k = shard.shape
            degraded = " (degraded)" if shard.degraded else ""
            style = f"{shard.style}-parallel"
            print(f"{label} {shard.name:9}  {style:15}  N={n} K={k}  {shard.kernel}{degraded}")
        same = "equal" if result.same_weights else "NOT equal"
        print(f"{label} FP8 weights and scales {same} to the whole block's part")
        print(f"{label} act(gate) * up: max abs difference {result.hidden_max_abs:.3g}")
        print(
            f"{label} output: max abs difference {result.max_abs:.3g}, relative "
            f"{result.relative:.3g} (max |output| {result.scale:.3g})"
        )


def explain(first: RankResult) -> None:
    """What the figures mean (rank 0's view)."""
    kernels = ", ".join(sorted({kernel for _, kernel in first.reference_kernels}))
    print(
        f"""
The whole block, quantized in one process, runs on {kernels}; its output is within
{first.fp8_vs_fp32:.3g} of fp32's (what FP8 itself costs here). Split over the ranks:
  - gate_proj and up_proj are column-parallel: a rank holds half the output channels,
    each with its own per-channel scale, so the rank computes its half of act(gate) * up
    alone, from the same FP8 values as the whole block.
  - down_proj is row-parallel: a rank holds half the inputs of every output channel.
    Each channel's scale spans both halves, so its amax was all-reduced (MAX) as the
    shard was made, and every rank holds the whole layer's FP8 bytes for its half.
  - Activation scales are each rank's own: down_proj scales its half of a token by that
    half's amax, at most the token's, so no element is rounded more coarsely than in
    the whole block. The output differs from the whole block's by that activation
    rounding (and the order of the fp32 sum), typically well below what FP8 costs."""
    )


def main() -> int:
    if importlib.util.find_spec("transformers") is None:
        print("this example needs transformers: pip install 'kernelpick[test]'", file=sys.stderr)
        return 1
    context = mp.get_context("spawn")
    results: Queue[RankResult | RankFailure] = context.Queue()
    with tempfile.TemporaryDirectory() as directory:
        init_file = os.path.join(directory, "rendezvous")
        processes = [
            context.Process(target=worker, args=(rank, init_file, results))
            for rank in range(WORLD_SIZE)
        ]
        for process in processes:
            process.start()
        answers: list[RankResult | RankFailure] = []
        try:
            answers = collect(processes, results)
        finally:  # a rank that failed lets its peers go in seconds; a deadline, at once
            timed_out = len(answers) < WORLD_SIZE and not any(
                isinstance(a, RankFailure) for a in answers
            )
            stop(processes, 0.0 if timed_out else GRACE_S)
    answers = drain(results, answers)  # and what came as the others stopped
    failures = [a for a in answers if isinstance(a, RankFailure)]
    done = [a for a in answers if isinstance(a, RankResult)]
    for failure in failures:
        print(f"rank {failure.rank} failed:\n{failure.error}", file=sys.stderr)
    missing = sorted(set(range(WORLD_SIZE)) - {a.rank for a in answers})
    for rank in missing:
        code = processes[rank].exitcode
        if code in (-signal.SIGTERM, -signal.SIGKILL):
            why = "after a peer failed" if failures else f"after {DEADLINE_S:g} s"
            ended = f"stopped by this script {why}"
        else:
            ended = f"exited with status {code}"
        print(f"rank {rank} gave no answer: {ended}", file=sys.stderr)
    if failures or missing:
        return 1
    show(done)
    explain(done[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
