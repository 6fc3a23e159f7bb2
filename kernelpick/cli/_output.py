"""Terminal output: aligned tables, markdown tables, and colour only where it belongs."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TextIO

import attrs

__all__ = ["Colour", "Style", "markdown_table", "text_table"]


class Colour(enum.Enum):
    GREEN = "32"
    YELLOW = "33"
    RED = "31"
    DIM = "2"
    BOLD = "1"


@attrs.frozen
class Style:
    """Colours text only on a terminal, and never when ``NO_COLOR`` is set (no-color.org)."""

    enabled: bool

    @classmethod
    def for_stream(cls, stream: TextIO, env: Mapping[str, str]) -> Style:
        isatty = getattr(stream, "isatty", None)
        tty = bool(isatty()) if callable(isatty) else False
        return cls(tty and not env.get("NO_COLOR") and env.get("TERM") != "dumb")

    def paint(self, text: str, colour: Colour | None) -> str:
        if not self.enabled or colour is None or not text:
            return text
        return f"\x1b[{colour.value}m{text}\x1b[0m"


Row = Sequence[str]


def text_table(
    headers: Row,
    rows: Sequence[Row],
    style: Style,
    colours: Sequence[Colour | None] | None = None,
) -> str:
    """Columns padded to their widest cell. A cell with newlines continues on the lines
    below, under its own column; ``colours`` paints whole rows."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], *(len(part) for part in cell.split("\n")))
    lines = [_line(headers, widths, style, Colour.BOLD)]
    for index, row in enumerate(rows):
        colour = colours[index] if colours else None
        parts = [cell.split("\n") for cell in row]
        for depth in range(max(len(p) for p in parts)):
            cells = [p[depth] if depth < len(p) else "" for p in parts]
            lines.append(_line(cells, widths, style, colour))
    return "\n".join(lines)


def _line(cells: Row, widths: Sequence[int], style: Style, colour: Colour | None) -> str:
    padded = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
    return style.paint(padded.rstrip(), colour)


def markdown_table(headers: Row, rows: Sequence[Row]) -> str:
    """A GitHub-flavoured markdown table; newlines in a cell become ``<br>``."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)
