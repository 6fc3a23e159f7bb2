"""The subcommands explain, matrix, devices and kernels (bench, which needs torch, is in
_bench). Each returns an exit status."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from kernelpick.cli._output import Colour, Style, markdown_table, text_table
from kernelpick.cli._parser import AUTO, shape
from kernelpick.core import (
    SCHEMA_VERSION,
    CpuArch,
    Decision,
    DeviceCaps,
    KernelKind,
    Policy,
    Reason,
    RejectCode,
    Rejected,
    Scheme,
    Selected,
    Verdict,
    assert_never,
    choose,
    default_catalog,
    device_profile,
    device_profiles,
    quant_config,
    split_ids,
)

__all__ = [
    "COMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_REJECTED",
    "EXIT_SELECTED",
    "Command",
    "device_caps",
    "emit_json",
]

EXIT_SELECTED = 0
EXIT_BAD_INPUT = 1
EXIT_REJECTED = 2
MATRIX_SHAPE = (4096, 4096)
_NONE_FITS = "=> rejected: no kernel can implement this layer"
_HANG = " " * 8  # continuation lines of "device: ...", under the text after the label


def emit_json(record: Mapping[str, Any], out: TextIO) -> None:
    """``record`` as indented JSON with sorted keys, the layout of every ``--json``."""
    print(json.dumps(record, indent=2, sort_keys=True), file=out)


def device_caps(device: str) -> DeviceCaps:
    """A device profile's caps, or this machine's for ``auto``."""
    if device.strip().lower() != AUTO:
        return device_profile(device)
    from kernelpick.adapters import probe_device  # imports torch: only --device auto pays

    return probe_device()


def _policy(args: argparse.Namespace, env: Mapping[str, str]) -> Policy:
    base = Policy.from_env(env)
    # Flag ids are checked by choose, which refuses any id its catalog lacks.
    return Policy(
        disabled=base.disabled if args.disable is None else frozenset(split_ids(args.disable)),
        force=base.force if args.force is None else args.force,
        strict=base.strict if args.strict is None else bool(args.strict),
    )


def _verdict(verdict: Verdict, chosen: str | None) -> tuple[str, Colour | None]:
    # A rejected row keeps normal intensity: it is what a reader of a rejection came to read.
    flag = " (degraded)" if verdict.degraded and verdict.ok else ""
    status = verdict.status(chosen)
    if verdict.kernel == chosen:
        return f"{status.upper()}{flag}", Colour.YELLOW if flag else Colour.GREEN
    return f"{status}{flag}", None


def _describe_policy(policy: Policy) -> str:
    parts = [f"disabled {', '.join(sorted(policy.disabled))}"] if policy.disabled else []
    parts += [f"forced {policy.force}"] if policy.force else []
    parts += ["strict"] if policy.strict else []
    return "; ".join(parts) or "default"


def _conclusion(decision: Decision, style: Style) -> str:
    match decision:
        case Selected(kernel=kernel, degraded=degraded, warnings=warnings):
            note = " (degraded: weight-only, activations not quantized)" if degraded else ""
            lines = [style.paint(style.wrap(f"=> selected {kernel}{note}"), Colour.BOLD)]
            # Why what runs may be slower than the unquantized layer (the --json "warnings").
            lines += [
                style.paint(style.wrap(f"warning: {w.render()}", indent=" " * 9), Colour.YELLOW)
                for w in warnings
            ]
            return "\n".join(lines)
        case Rejected(hints=hints):
            lines = [style.paint(style.wrap(_NONE_FITS), Colour.RED)]
            # What would work instead, computed by choose (the same lines as --json "hints").
            lines += [style.wrap(f"hint: {hint}", indent=" " * 6) for hint in hints]
            return "\n".join(lines)
        case _:
            assert_never(decision)


def explain(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    caps = device_caps(args.device)
    config = quant_config(
        args.scheme,
        weight_shape=shape(args.shape),
        out_dtype=args.out_dtype,
        bias=args.bias,
        block_size=args.block_size,
        min_tokens=args.min_tokens,
    )
    policy = _policy(args, env)
    decision = choose(caps, config, policy)
    chosen = decision.kernel if isinstance(decision, Selected) else None
    if args.json:
        emit_json(
            {
                **decision.to_dict(),
                "device": {"profile": args.device, "description": caps.render()},
                "config": {"scheme": args.scheme, "description": config.render()},
                "policy": {"disabled": sorted(policy.disabled), "force": policy.force,
                           "strict": policy.strict},
            },
            out,
        )  # fmt: skip
    else:
        style = Style.for_stream(out, env)
        rows, colours = [], []
        for index, verdict in enumerate(decision.trace, start=1):
            text, colour = _verdict(verdict, chosen)
            reasons = "\n".join(r.render() for r in verdict.reasons)
            rows.append([str(index), verdict.kernel, str(verdict.kind), text, reasons])
            colours.append(colour)
        print(style.wrap(f"device: {caps.render()}", _HANG), file=out)
        print(style.wrap(f"layer:  {args.scheme}: {config.render()}", _HANG), file=out)
        print(style.wrap(f"policy: {_describe_policy(policy)}", _HANG) + "\n", file=out)
        print(
            text_table(["#", "kernel", "kind", "verdict", "reasons"], rows, style, colours),
            file=out,
        )
        print(file=out)
        print(_conclusion(decision, style), file=out)
    return EXIT_SELECTED if chosen is not None else EXIT_REJECTED


_OTHER_FORMAT = frozenset({RejectCode.FP8_DTYPE, RejectCode.QUANT_DTYPE})


def _nearest_miss(verdict: Verdict) -> tuple[bool, int]:
    # A kernel for another format (an FP8 kernel for an int8 layer) is the farthest miss.
    return (any(r.code in _OTHER_FORMAT for r in verdict.reasons), len(verdict.reasons))


def _first_w8a8_reason(decision: Rejected) -> Reason | None:
    # The nearest miss among the W8A8 kernels (the first of equals): an int8 layer on an
    # A100 names _int_mm's token floor, not an FP8 kernel's arch or format.
    misses = [v for v in decision.trace if v.kind is KernelKind.W8A8 and v.reasons]
    if misses:
        return min(misses, key=_nearest_miss).reasons[0]
    return decision.reasons[0] if decision.reasons else None


def matrix_entries(schemes: list[Scheme]) -> list[dict[str, Any]]:
    """One record per device profile and scheme, at N=K=4096 in bfloat16."""
    entries = []
    for name, caps in device_profiles().items():
        for item in schemes:
            decision = choose(caps, quant_config(item, weight_shape=MATRIX_SHAPE))
            arch = caps.arch.machine if isinstance(caps.arch, CpuArch) else str(caps.arch)
            entry: dict[str, Any] = {"device": name, "arch": arch, "scheme": item.value}
            if isinstance(decision, Selected):
                entry |= {"outcome": "selected", "kernel": decision.kernel,
                          "degraded": decision.degraded, "reason": None}  # fmt: skip
            else:
                first = _first_w8a8_reason(decision)
                reason = None if first is None else {"kernel": first.kernel, **first.to_dict()}
                entry |= {
                    "outcome": "rejected",
                    "kernel": None,
                    "degraded": False,
                    "reason": reason,
                }
            entries.append(entry)
    return entries


def _cell(entry: Mapping[str, Any]) -> str:
    if entry["outcome"] == "selected":
        return str(entry["kernel"]) + (" (degraded)" if entry["degraded"] else "")
    reason = entry["reason"]
    return "rejected" if reason is None else f"rejected: {reason['kernel']}: {reason['message']}"


def matrix(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    schemes = [Scheme.parse(s) for s in args.scheme] if args.scheme else list(Scheme)
    entries = matrix_entries(schemes)
    if args.format == "json":
        layer = {"weight_shape": list(MATRIX_SHAPE), "out_dtype": "bfloat16"}
        emit_json({"schema_version": SCHEMA_VERSION, "layer": layer, "entries": entries}, out)
        return EXIT_SELECTED
    if args.format == "text":
        rows = [[e["device"], e["arch"], e["scheme"], _cell(e)] for e in entries]
        table = text_table(["device", "arch", "scheme", "kernel"], rows, Style.for_stream(out, env))
        print(table, file=out)
        return EXIT_SELECTED
    print(_markdown_matrix(schemes, entries), file=out)
    return EXIT_SELECTED


def _markdown_matrix(schemes: list[Scheme], entries: list[dict[str, Any]]) -> str:
    parts = [
        "# Support matrix",
        "",
        "Generated by `kernelpick matrix --format markdown` from the catalog and the device "
        "profiles; a test fails when this file differs from what the code generates. Each "
        "cell is the kernel selected for a 4096x4096 layer in bfloat16, or `rejected` with the "
        "first reason of the first W8A8 kernel. `kernelpick explain --device D --scheme S` "
        "gives every kernel's reasons.",
    ]
    for item in schemes:
        rows = [[e["device"], e["arch"], _cell(e)] for e in entries if e["scheme"] == item.value]
        parts += ["", f"## {item.value}", "", markdown_table(["device", "arch", "kernel"], rows)]
    return "\n".join(parts)


def _device_record(name: str, caps: DeviceCaps) -> dict[str, Any]:
    return {
        "profile": name, "name": caps.name, "platform": str(caps.platform),
        "arch": str(caps.arch), "toolkit": caps.toolkit, "torch": str(caps.torch_version),
        "fp8_format": caps.fp8_format.value, "libraries": sorted(caps.libraries),
        "features": sorted(caps.features), "isa_class": caps.isa_class,
    }  # fmt: skip


def devices(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    profiles = device_profiles()
    if args.json:
        records = [_device_record(name, caps) for name, caps in profiles.items()]
        emit_json({"schema_version": SCHEMA_VERSION, "devices": records}, out)
        return EXIT_SELECTED
    headers = ["profile", "name", "platform", "arch", "toolkit", "torch", "fp8", "extras"]
    rows = [
        [name, caps.name, str(caps.platform),
         str(caps.arch) + ("" if caps.isa_class is None else f": {caps.isa_class}"), caps.toolkit,
         str(caps.torch_version), caps.fp8_format.value,
         ", ".join(sorted(caps.libraries) + sorted(caps.features))]
        for name, caps in profiles.items()
    ]  # fmt: skip
    print(text_table(headers, rows, Style.for_stream(out, env)), file=out)
    return EXIT_SELECTED


def kernels(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    specs = default_catalog().kernels
    if args.json:
        records = [
            {"id": s.id, "platform": str(s.platform), "kind": s.kind.value,
             "compute": s.compute.value, "summary": s.summary,
             "requires": [r.render() for r in s.rules]}
            for s in specs
        ]  # fmt: skip
        emit_json({"schema_version": SCHEMA_VERSION, "kernels": records}, out)
        return EXIT_SELECTED
    rows = [
        [s.id, str(s.platform), str(s.kind), str(s.compute),
         "\n".join(r.render() for r in s.rules)]
        for s in specs
    ]  # fmt: skip
    headers = [
        "kernel",
        "platform",
        "kind",
        "compute",
        "requires (in preference order per platform)",
    ]
    print(text_table(headers, rows, Style.for_stream(out, env)), file=out)
    return EXIT_SELECTED


Command = Callable[[argparse.Namespace, Mapping[str, str], TextIO, TextIO], int]
"""A subcommand: parsed arguments, environment, stdout and stderr in; exit status out."""

COMMANDS: dict[str, Command] = {
    "explain": explain,
    "matrix": matrix,
    "devices": devices,
    "kernels": kernels,
}
