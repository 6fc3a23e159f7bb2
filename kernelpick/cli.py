"""The ``kernelpick`` command line: ``kernelpick explain`` answers "which kernel, and why?".

Exit status: 0 when a kernel is selected, 2 when every kernel was turned down, 1 on bad
input (usage errors included, so that argparse's own status 2 is never read as a rejection).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

import kernelpick as kp

__all__ = ["EXIT_BAD_INPUT", "EXIT_REJECTED", "EXIT_SELECTED", "main"]

EXIT_SELECTED = 0
EXIT_BAD_INPUT = 1
EXIT_REJECTED = 2
AUTO = "auto"


class _UsageError(kp.KernelpickError):
    """A command line argparse could not read."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _shape(text: str) -> tuple[int, int]:
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise kp.InvalidValueError("--shape", text, "N,K: two positive integers, e.g. 4096,4096")
    return (int(parts[0]), int(parts[1]))


def _ids(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _parser() -> _Parser:
    parser = _Parser(
        prog="kernelpick",
        description="Choose the GEMM kernel for a quantized (FP8) linear layer, and say why.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    explain = commands.add_parser(
        "explain",
        help="the decision for one layer, with every kernel's reasons",
        description="The decision for one layer on one device, with every kernel's reasons. "
        "Reads KERNELPICK_DISABLED_KERNELS, KERNELPICK_FORCE_KERNEL and KERNELPICK_STRICT; "
        "a flag wins over the environment.",
    )
    explain.add_argument(
        "--device",
        default=AUTO,
        help="a device profile name, or 'auto' to probe this machine (default: auto)",
    )
    explain.add_argument("--scheme", default=kp.Scheme.FP8_PER_CHANNEL.value, help="scheme name")
    explain.add_argument(
        "--shape", default="4096,4096", help="weight shape N,K (default 4096,4096)"
    )
    explain.add_argument("--out-dtype", default="bfloat16", help="output dtype (default bfloat16)")
    explain.add_argument("--bias", action="store_true", help="the layer has a bias")
    explain.add_argument("--disable", default=None, help="kernel ids to skip, comma-separated")
    explain.add_argument("--force", default=None, help="the only kernel to consider")
    explain.add_argument("--strict", action="store_true", default=None, help="refuse degraded")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _caps(device: str) -> kp.DeviceCaps:
    return kp.probe() if device.strip().lower() == AUTO else kp.device_profile(device)


def _policy(args: argparse.Namespace, env: Mapping[str, str]) -> kp.Policy:
    base = kp.Policy.from_env(env)
    disabled = base.disabled if args.disable is None else frozenset(_ids(args.disable))
    force = base.force if args.force is None else args.force
    strict = base.strict if args.strict is None else bool(args.strict)
    policy = kp.Policy(disabled=disabled, force=force, strict=strict)
    kp.default_catalog().check_ids(sorted(policy.kernel_ids))
    return policy


def _explain(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    caps = _caps(args.device)
    config = kp.scheme(
        args.scheme, weight_shape=_shape(args.shape), out_dtype=args.out_dtype, bias=args.bias
    )
    decision = kp.choose(caps, config, _policy(args, env))
    if args.json:
        record = {
            **decision.to_dict(),
            "device": {"profile": args.device, "description": caps.describe()},
            "config": {"scheme": args.scheme, "description": config.describe()},
        }
        print(json.dumps(record, indent=2, sort_keys=True))
    else:
        print(f"device: {caps.describe()}")
        print(f"layer:  {config.describe()}")
        print(decision.render())
    match decision:
        case kp.Selected():
            return EXIT_SELECTED
        case kp.Rejected():
            return EXIT_REJECTED
        case _:
            kp.assert_never(decision)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the command line; returns the exit status instead of exiting."""
    try:
        args = _parser().parse_args(argv)
        return _explain(args, os.environ if env is None else env)
    except kp.KernelpickError as error:
        print(f"kernelpick: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
