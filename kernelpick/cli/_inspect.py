"""``kernelpick inspect DIR``: what a checkpoint directory holds, read from its config and
safetensors headers (``kernelpick.integration.inspect_checkpoint``); with ``--device``,
what each quantized layer would run there. Exit status 0, or 2 when ``--device`` is given
and a layer is rejected there."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TextIO

from kernelpick.cli._commands import EXIT_REJECTED, EXIT_SELECTED, device_caps, emit_json
from kernelpick.cli._output import Style
from kernelpick.core import Policy

__all__ = ["inspect"]


def inspect(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    from kernelpick.integration import inspect_checkpoint  # imports torch: only inspect pays

    caps = None if args.device is None else device_caps(args.device)
    policy = None if caps is None else Policy.from_env(env)
    info = inspect_checkpoint(args.directory, caps, policy)
    if args.json:
        emit_json(info.to_dict(), out)
    else:
        print(Style.for_stream(out, env).wrap(info.render()), file=out)
    rejected = info.summary is not None and info.summary.rejected > 0
    return EXIT_REJECTED if rejected else EXIT_SELECTED
