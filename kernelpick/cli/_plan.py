"""``kernelpick plan``: what every linear layer of a model would run on each device, from
its ``config.json`` alone, before anything is downloaded."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from kernelpick.cli._commands import EXIT_REJECTED, EXIT_SELECTED, device_caps, emit_json
from kernelpick.cli._output import markdown_table
from kernelpick.cli._parser import UsageError
from kernelpick.core import (
    SCHEMA_VERSION,
    DeviceCaps,
    ModelSummary,
    Policy,
    Rejected,
    Selected,
    UncoveredWeights,
    assert_never,
    collapse_names,
)

if TYPE_CHECKING:
    from kernelpick.plan import ModelPlan

__all__ = ["plan"]

_SETTINGS = ("block_size", "group_size", "symmetric")


def _devices(values: Sequence[str]) -> list[tuple[str, DeviceCaps]]:
    names = [name.strip() for value in values for name in value.split(",")]
    if not all(names):
        raise UsageError(f"--device {','.join(values)!r}: an empty device name")
    return [(name, device_caps(name)) for name in dict.fromkeys(names)]


def _describe(result: ModelPlan) -> str:
    config, recipe = result.layers.config, result.recipe
    how = ("a high-precision checkpoint quantized as it loads" if recipe.online else
           "a pre-quantized checkpoint")  # fmt: skip
    source = "--scheme" if result.source == "--scheme" else "its quantization_config"
    line = (f"model: {config.describe()}; {result.dtype.value} activations; "
            f"{recipe.scheme.value} from {source} ({how})")  # fmt: skip
    if config.dtype.itemsize == 4 and result.dtype == config.dtype:
        line += ("; vLLM's dtype 'auto' computes a float32 model in 16 bits: --dtype bfloat16 "
                 "or float16 plans that")  # fmt: skip
    return line


def _not_covered(uncovered: Sequence[UncoveredWeights]) -> str:
    if not uncovered:
        return ("not covered: nothing; every 2-D weight of the model is in a layer above or an "
                "embedding")  # fmt: skip
    modules = sum(len(u.names) for u in uncovered)
    return (f"not covered on every device: {modules} module(s) whose weights no kernelpick "
            "kernel runs (listed above, whole-model figures, counted in no total)")  # fmt: skip


def _cell(summary: ModelSummary, index: int) -> str:
    decision = summary.groups[index].decision
    match decision:
        case Selected(kernel=kernel, degraded=degraded, warnings=warnings):
            notes = (["degraded"] if degraded else []) + (["slow"] if warnings else [])
            return kernel + (f" ({', '.join(notes)})" if notes else "")
        case Rejected():
            return "rejected"
        case _:
            assert_never(decision)


def _markdown(result: ModelPlan, names: Sequence[str]) -> str:
    parts = [f"# {_describe(result)}"]
    for name, summary in zip(names, result.summaries, strict=True):
        rows = [[str(g.count), "{} x {}".format(*g.config.weight_shape), _cell(summary, i),
                 collapse_names(g.names)] for i, g in enumerate(summary.groups)]  # fmt: skip
        for names, shape, reason in summary.kept_groups():
            size = "{} x {}".format(*shape)
            rows.append([str(len(names)), size, f"high precision: {reason}", collapse_names(names)])
        details = summary.render().splitlines()
        parts += ["", f"## {name}: {summary.caps.render()}", "",
                  markdown_table(["layers", "N x K", "kernel", "layer names"], rows)]  # fmt: skip
        totals = [line for line in details if line.startswith(("weights:", "not covered:"))]
        parts += ["", *[f"{line}  " for line in totals]]
        rest = details[details.index(totals[-1]) + 1 :]  # the rejections and warnings
        if any(line.strip() for line in rest):
            parts += ["", "```text", *[line for line in rest if line != ""], "```"]
    parts += ["", _not_covered(result.uncovered)]
    return "\n".join(parts)


def _record(result: ModelPlan, names: Sequence[str]) -> dict[str, Any]:
    config, recipe = result.layers.config, result.recipe
    model = {
        "config": config.path, "architectures": list(config.architectures),
        "model_type": config.model_type, "dtype": result.dtype.value,
        "scheme": recipe.scheme.value, "source": result.source,
        "checkpoint_format": recipe.checkpoint_format.value,
        "tensor_parallel": result.layers.tensor_parallel,
    }  # fmt: skip
    plans = [{**summary.to_dict(), "profile": name}
             for name, summary in zip(names, result.summaries, strict=True)]  # fmt: skip
    not_covered = [weights.to_dict() for weights in result.uncovered]
    return {"schema_version": SCHEMA_VERSION, "model": model, "plans": plans,
            "not_covered": not_covered}  # fmt: skip


def plan(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    from kernelpick.plan import plan_model  # imports torch and transformers: only plan pays

    if args.scheme is None:
        given = [f"--{s.replace('_', '-')}" for s in _SETTINGS if getattr(args, s) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} without --scheme: the checkpoint's "
                             "quantization_config states its own")  # fmt: skip
    devices = _devices(args.device or ["auto"])
    result = plan_model(
        args.config, [caps for _, caps in devices], args.scheme, block_size=args.block_size,
        group_size=args.group_size, symmetric=True if args.symmetric is None else args.symmetric,
        tensor_parallel=args.tensor_parallel, dtype=args.dtype, policy=Policy.from_env(env),
    )  # fmt: skip
    names = [name for name, _ in devices]
    if args.format == "json":
        emit_json(_record(result, names), out)
    elif args.format == "markdown":
        print(_markdown(result, names), file=out)
    else:
        blocks = [_describe(result), *(summary.render() for summary in result.summaries),
                  _not_covered(result.uncovered)]  # fmt: skip
        print("\n\n".join(blocks), file=out)
    return EXIT_REJECTED if result.rejected else EXIT_SELECTED
