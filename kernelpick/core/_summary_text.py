"""Text of a model summary: layer names collapsed to patterns, columns, sizes in bytes."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["collapse_names", "columns", "size"]


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = [cell.rjust(w) if i == 0 else cell.ljust(w) for i, (cell, w) in
                 enumerate(zip(row, widths, strict=False))]  # fmt: skip
        out.append("  " + "  ".join([*cells, row[-1]]).rstrip())
    return out


def size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


_NUMBER = re.compile(r"(?<=\.)(\d+)(?=\.|$)")


def collapse_names(names: Sequence[str]) -> str:
    """Layer names as few patterns as their first numbered part allows:
    ``model.layers.{0..31}.mlp.down_proj`` for 32 layers, joined by ``, ``."""
    templates: dict[str, list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = _NUMBER.search(name)
        if match is None:
            plain.append(name)
            continue
        key = f"{name[: match.start()]}{{}}{name[match.end() :]}"
        templates.setdefault(key, []).append(int(match.group(1)))
    parts = [key.replace("{}", _ranges(indices) if len(indices) > 1 else str(indices[0]))
             for key, indices in templates.items()]  # fmt: skip
    return ", ".join([*plain, *parts])


def _ranges(indices: list[int]) -> str:
    spans: list[list[int]] = []
    for index in sorted(set(indices)):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    text = ",".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)
    return f"{{{text}}}"
