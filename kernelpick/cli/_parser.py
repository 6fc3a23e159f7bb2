"""The argument parser of the ``kernelpick`` command."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from kernelpick._version import __version__
from kernelpick.core import (
    ENV_DISABLED,
    ENV_FORCE,
    ENV_STRICT,
    InvalidValueError,
    KernelpickError,
    Scheme,
    device_profiles,
)

__all__ = ["AUTO", "UsageError", "parser", "shape"]

AUTO = "auto"
# ASCII digits only: str.isdigit() accepts "³", which int() refuses.
_SHAPE = re.compile(r"^\s*([0-9]{1,18})\s*[,x]\s*([0-9]{1,18})\s*$")


class UsageError(KernelpickError):
    """A command line the parser could not read."""


class _Parser(argparse.ArgumentParser):
    # argparse exits with status 2 on a usage error, which a script would read as a
    # rejection; raising lets main() exit 1 instead.
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# What a command that decides reads, as its help says it.
_READS_POLICY = f"{ENV_DISABLED}, {ENV_FORCE} and {ENV_STRICT}"


def shape(text: str) -> tuple[int, int]:
    """``N,K`` (or ``NxK``) as two positive integers."""
    match = _SHAPE.match(text)
    if match is None or int(match.group(1)) == 0 or int(match.group(2)) == 0:
        raise InvalidValueError("--shape", text, "N,K: two positive integers, e.g. 4096,4096")
    return (int(match.group(1)), int(match.group(2)))


def _schemes() -> str:
    return ", ".join(s.value for s in Scheme)


def _profiles() -> str:
    return ", ".join(device_profiles())


def _layer_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--scheme", default="fp8_per_channel", help=f"{_schemes()} (default fp8_per_channel)"
    )
    command.add_argument(
        "--shape", default="4096,4096", help="weight shape N,K (default 4096,4096)"
    )
    command.add_argument("--out-dtype", default="bfloat16", help="output dtype (default bfloat16)")


def _inspect_parser(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="what a checkpoint directory holds, from its safetensors headers",
        description="What a checkpoint directory holds (format, scheme, ignored modules, "
        "tensors and bytes by dtype per file, the quantized layers), read from config.json "
        "and the safetensors headers; no tensor data but each pack-quantized layer's "
        "weight_shape. With --device, what each layer would run there (reads "
        f"{_READS_POLICY}). Exit "
        "status 2 when --device is given and a layer is rejected there.",
    )
    inspect.add_argument("directory", metavar="DIR", help="the checkpoint directory")
    inspect.add_argument(
        "--device", default=None, help=f"a profile ({_profiles()}), or auto: this machine"
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")


def parser() -> argparse.ArgumentParser:
    root = _Parser(
        prog="kernelpick",
        description="Choose the GEMM kernel for a quantized (FP8) linear layer, and say why.",
        epilog=f"Schemes: {_schemes()}. Device profiles: {_profiles()}; or auto, this "
        "machine. Exit status: 0 selected, 2 rejected, 1 bad input; a reader that goes away "
        "early (| head) leaves the status as it would have been.",
    )
    root.add_argument(
        "--version", action="version", version=f"kernelpick {__version__}",
        help="show the version and exit",
    )  # fmt: skip
    commands = root.add_subparsers(dest="command", required=True, parser_class=_Parser)

    explain = commands.add_parser(
        "explain",
        help="the decision for one layer, with every kernel's verdict and reasons",
        description="The decision for one layer on one device, with every kernel's verdict "
        f"and reasons. Reads {_READS_POLICY}; a flag wins over the environment.",
    )
    explain.add_argument(
        "--device", default=AUTO, help=f"a profile ({_profiles()}), or auto: this machine (default)"
    )
    _layer_options(explain)
    explain.add_argument("--bias", action="store_true", help="the layer has a bias")
    explain.add_argument(
        "--block-size", type=int, default=None, help="fp8_block's block size (default 128)"
    )
    explain.add_argument(
        "--min-tokens",
        type=int,
        default=1,
        help="the fewest rows (tokens) one call passes; 1, the default, includes decode",
    )
    explain.add_argument("--disable", default=None, help="kernel ids to skip, comma-separated")
    explain.add_argument("--force", default=None, help="the only kernel to consider")
    explain.add_argument(
        "--strict", action="store_true", default=None, help="refuse degraded choices"
    )
    explain.add_argument("--json", action="store_true", help="machine-readable output")

    matrix = commands.add_parser(
        "matrix", help="every device profile x every scheme", description="The selected kernel "
        "for every device profile and scheme (N=K=4096, bfloat16), or why none fits."
    )  # fmt: skip
    matrix.add_argument("--scheme", action="append", help=f"{_schemes()} (repeatable; default all)")
    matrix.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    for name, what in (("devices", "the device profiles and their facts"),
                       ("kernels", "the kernel catalog: kind and requirements")):  # fmt: skip
        listing = commands.add_parser(name, help=what, description=f"List {what}.")
        listing.add_argument("--json", action="store_true", help="machine-readable output")

    _inspect_parser(commands)

    bench = commands.add_parser(
        "bench",
        help="time the selected kernel on this machine against the unquantized linear",
        description="Run the kernel kernelpick selects on this machine for one layer, against "
        "the unquantized linear in fp32 and in the layer's dtype: time and error.",
    )
    _layer_options(bench)
    bench.add_argument("--tokens", type=int, default=256, help="rows M of the input (default 256)")
    bench.add_argument("--repeats", type=int, default=10, help="timed runs (default 10)")
    bench.add_argument(
        "-q", "--quiet", action="store_true",
        help="no progress on stderr (a bar on a terminal, one line a stage elsewhere)",
    )  # fmt: skip
    bench.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="PATH",
        help="machine-readable output, to PATH or (without one) to stdout",
    )  # fmt: skip
    _plan_parser(commands)
    return root


def _plan_parser(commands: Any) -> None:
    plan = commands.add_parser(
        "plan",
        help="what every linear layer of a model would run, from its config.json",
        description="What every linear layer of a model runs on each device, from its "
        "config.json alone (shapes from transformers' own model class on the meta device; "
        "q/k/v and gate/up fused and split over tensor-parallel ranks as vLLM does), before "
        "anything is downloaded: groups, bytes, every rejection and speed warning. Reads "
        f"{_READS_POLICY}. Exit "
        "status 2 when any layer is rejected on any device. Needs transformers.",
    )
    plan.add_argument("config", help="a model's config.json, or a directory holding one")
    plan.add_argument(
        "--scheme", default=None,
        help=f"{_schemes()}; default: the config's own quantization_config",
    )  # fmt: skip
    plan.add_argument("--block-size", type=int, default=None, help="fp8_block's block size")
    plan.add_argument("--group-size", type=int, default=None, help="int4/int8 weight-only groups")
    symmetry = plan.add_mutually_exclusive_group()
    symmetry.add_argument("--symmetric", dest="symmetric", action="store_true", default=None,
                          help="integer weight-only: no zero points (the default)")  # fmt: skip
    symmetry.add_argument("--asymmetric", dest="symmetric", action="store_false",
                          help="integer weight-only: zero points")  # fmt: skip
    plan.add_argument(
        "--device", action="append", default=None,
        help=f"profiles ({_profiles()}) or auto, repeatable or comma-separated (default auto)",
    )  # fmt: skip
    plan.add_argument("--tensor-parallel", type=int, default=1,
                      help="ranks; shapes are one rank's (default 1)")  # fmt: skip
    plan.add_argument("--dtype", default=None,
                      help="activations' dtype (default: the config's)")  # fmt: skip
    plan.add_argument("--format", choices=("text", "markdown", "json"), default="text")
