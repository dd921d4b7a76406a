"""Render a `Table` as a GitHub-flavoured Markdown table (header groups folded into the column names)."""

from __future__ import annotations

from .table_model import Cell, Table

__all__ = ["render_markdown", "markdown_cell"]


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_cell(cell: Cell) -> str:
    """`text (note)` with bold and footnote mark."""
    text = _escape(cell.text)
    if cell.bold:
        text = f"**{text}**"
    if cell.note:
        text += f" ({_escape(cell.note)})"
    return text + cell.mark


def render_markdown(table: Table, *, title: bool = True) -> str:
    """The table as Markdown, optionally with its title above and its notes below."""
    groups = table.column_groups()
    header = [f"{group}: {name}" if group else name for group, name in zip(groups, table.columns, strict=False)]
    lines = []
    if title:
        lines += [f"**{table.title}**", ""]
    lines.append("| " + " | ".join(_escape(h) for h in header) + " |")
    lines.append("|" + "".join("---:|" if a == "r" else "---|" for a in table.alignment))
    for row in table.rows:
        lines.append("| " + " | ".join(markdown_cell(c) for c in row) + " |")
    if table.notes:
        lines.append("")
        lines.extend(table.notes)
    return "\n".join(lines) + "\n"
