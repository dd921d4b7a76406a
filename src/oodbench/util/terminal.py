"""Tables on stdout: boxed at the terminal's width on a terminal; plain Markdown when piped, with whole names.

Rich sizes a table to the console: 80 columns when stdout is a pipe, so long names were cut to ``imagenet-1k-tr…``,
and a fixed ``Console(width=200)`` padded every line to 200 columns. Piped output is for reading by programs and
people alike: a Markdown table as wide as its content. Every table comes with a legend line saying what its
columns and marks mean.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["print_table", "table_markdown"]


def _plain(cell: Any) -> str:
    """A cell as plain text: rich markup (``[green]ok[/green]``) removed, pipes escaped, one line."""
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return " ".join(text.split()).replace("|", "\\|")


def table_markdown(table: Table, legend: str | None = None) -> str:
    """A rich table as a Markdown table (title line first, legend line last), each column as wide as its content."""
    header = [_plain(column.header) for column in table.columns]
    columns = [[_plain(cell) for cell in column.cells] for column in table.columns]
    rows = list(zip(*columns, strict=True)) if columns else []
    widths = [max([len(h), 3, *(len(cell) for cell in column)]) for h, column in zip(header, columns, strict=True)]
    lines = [] if not table.title else [_plain(table.title), ""]
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    if legend:
        lines += ["", legend]
    return "\n".join(lines) + "\n"


def print_table(table: Table, *, legend: str | None = None, file: TextIO | None = None) -> None:
    """Print `table` and its legend: rich boxes on a terminal (cells fold, never cut), Markdown otherwise."""
    out = file or sys.stdout
    if not out.isatty():
        out.write(table_markdown(table, legend))
        return
    for column in table.columns:
        column.overflow = "fold"  # wrap a long name inside its cell rather than cutting it with an ellipsis
    console = Console(file=out)
    console.print(table)
    if legend:
        console.print(legend, style="dim", markup=False, highlight=False)
