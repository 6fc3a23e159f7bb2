"""Terminal output: aligned tables that fit the terminal, markdown tables, and colour only
where it belongs.

Width: ``COLUMNS`` when it is set, else the terminal's width when the output is a terminal;
output into a pipe or a file is not wrapped, so ``grep`` sees each reason on one line.
"""

from __future__ import annotations

import enum
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import TextIO

import attrs

__all__ = ["Colour", "Style", "is_terminal", "markdown_table", "text_table", "wrap"]

GAP = "  "  # between table columns
INDENT = "  "  # before the continuation lines of a wrapped line


class Colour(enum.Enum):
    GREEN = "32"
    YELLOW = "33"
    RED = "31"
    BOLD = "1"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (a stream without ``isatty``, or closed, is not)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # ValueError: a closed file
        return False


def _width(stream: TextIO, env: Mapping[str, str]) -> int | None:
    try:
        columns = int(env.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    return shutil.get_terminal_size().columns if is_terminal(stream) else None


@attrs.frozen
class Style:
    """How to draw on one stream: colour only on a terminal, and never when ``NO_COLOR`` is
    set (no-color.org); lines of at most ``width`` characters (None: no limit)."""

    enabled: bool
    width: int | None = None

    @classmethod
    def for_stream(cls, stream: TextIO, env: Mapping[str, str]) -> Style:
        colour = is_terminal(stream) and not env.get("NO_COLOR") and env.get("TERM") != "dumb"
        return cls(colour, _width(stream, env))

    def paint(self, text: str, colour: Colour | None) -> str:
        if not self.enabled or colour is None or not text:
            return text
        return f"\x1b[{colour.value}m{text}\x1b[0m"

    def wrap(self, text: str, indent: str = INDENT) -> str:
        """``text`` wrapped to the width, continuation lines indented by ``indent``."""
        if self.width is None:
            return text
        return "\n".join(out for line in text.split("\n") for out in wrap(line, self.width, indent))


def wrap(text: str, width: int, indent: str = INDENT) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words only: a word
    (a kernel id, a dtype, a device name) is never cut, and one longer than the room has a
    line of its own that runs past it. Continuation lines are indented (when there is room)."""
    if len(text) <= width:
        return [text]
    indent = indent if width > len(indent) else ""
    lines: list[str] = []
    line = ""
    for space, word in re.findall(r"(\s*)(\S+)", text):  # the spacing within a line is kept
        if not line.strip() or len(line) + len(space) + len(word) <= width:
            line += (space if line.strip() else "") + word
        else:
            lines.append(line)
            line = indent + word
    lines.append(line)
    return lines


Row = Sequence[str]


def _floor(cells: list[str], natural: int) -> int:
    # The width a column may shrink to: its longest word, with room for the continuation
    # indent; never wider than the column already is.
    longest = max((len(word) for cell in cells for word in cell.split()), default=0)
    return min(natural, len(INDENT) + longest)


def _fit(columns: list[list[str]], width: int | None) -> list[int] | None:
    """Column widths whose lines fit ``width``, or None when no column may narrow enough
    without cutting a word."""
    widths = [max(len(line) for cell in cells for line in cell.split("\n")) for cells in columns]
    if width is None:
        return widths
    floors = [_floor(cells, natural) for cells, natural in zip(columns, widths, strict=True)]
    budget = width - len(GAP) * (len(widths) - 1)
    # Shrink the widest column that can still give, one character at a time.
    while sum(widths) > budget:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            return None
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1
    return widths


def text_table(
    headers: Row,
    rows: Sequence[Row],
    style: Style,
    colours: Sequence[Colour | None] | None = None,
) -> str:
    """Columns padded to their widest cell, and narrowed (their cells wrapped) until a line
    fits ``style.width``. A cell with newlines continues on the lines below, under its own
    column; ``colours`` paints whole rows. Columns too many for the width become one
    ``header: cell`` block a row, rather than columns of fragments."""
    columns = [[row[i] for row in [headers, *rows]] for i in range(len(headers))]
    widths = _fit(columns, style.width)
    if widths is None:
        return _records(headers, rows, style, colours)
    lines = _row(headers, widths, style, Colour.BOLD)
    for index, row in enumerate(rows):
        lines += _row(row, widths, style, colours[index] if colours else None)
    return "\n".join(lines)


def _records(
    headers: Row, rows: Sequence[Row], style: Style, colours: Sequence[Colour | None] | None
) -> str:
    width = style.width or 0
    blocks = []
    for index, row in enumerate(rows):
        lines: list[str] = []
        for header, cell in zip(headers, row, strict=True):
            if "\n" not in cell:
                lines += wrap(f"{header}: {cell}".rstrip(), width)
                continue
            # One line a cell line, indented under the header, as the table's column has it.
            lines += wrap(f"{header}:", width)
            room = max(1, width - len(INDENT))
            lines += [INDENT + out for line in cell.split("\n") for out in wrap(line, room)]
        colour = colours[index] if colours else None
        blocks.append("\n".join(style.paint(line, colour) for line in lines))
    return "\n\n".join(blocks)


def _row(cells: Row, widths: Sequence[int], style: Style, colour: Colour | None) -> list[str]:
    parts = [
        [out for line in cell.split("\n") for out in wrap(line, width)]
        for cell, width in zip(cells, widths, strict=True)
    ]
    lines = []
    for depth in range(max(len(p) for p in parts)):
        padded = GAP.join(
            (p[depth] if depth < len(p) else "").ljust(width)
            for p, width in zip(parts, widths, strict=True)
        )
        lines.append(style.paint(padded.rstrip(), colour))
    return lines


def markdown_table(headers: Row, rows: Sequence[Row]) -> str:
    """A GitHub-flavoured markdown table; newlines in a cell become ``<br>``."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)
