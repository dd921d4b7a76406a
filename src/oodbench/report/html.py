"""Render a `Table` as an HTML fragment (no scripts, no external resources); the report's CSS styles it."""

from __future__ import annotations

from html import escape

from ..core.tabular import Cell, Table

__all__ = ["render_html", "html_cell"]


def html_cell(cell: Cell) -> str:
    """Escaped cell content with <strong> for bold and a smaller span for the note."""
    text = escape(cell.text)
    if cell.bold:
        text = f"<strong>{text}</strong>"
    if cell.note:
        text += f' <span class="note">({escape(cell.note)})</span>'
    if cell.mark:
        text += f"<sup>{escape(cell.mark)}</sup>"
    return text


def render_html(table: Table) -> str:
    """`<figure class="table">` with caption, grouped header, body and notes."""
    align = table.alignment
    lines = [
        f'<figure class="table" id="{escape(table.key)}">',
        f'<table class="oodb{" wrap" if table.wrap else ""}" data-table="{escape(table.key)}">',
        f"<caption>{escape(table.title)}</caption>",
        "<thead>",
    ]
    if table.groups and any(label for label, _ in table.groups):
        cells = "".join(
            f'<th colspan="{span}" class="group">{escape(label)}</th>'
            if span > 1
            else f'<th class="group">{escape(label)}</th>'
            for label, span in table.groups
        )
        lines.append(f"<tr>{cells}</tr>")
    lines.append(
        "<tr>"
        + "".join(
            f'<th class="{"num" if a == "r" else "txt"}">{escape(c)}</th>'
            for c, a in zip(table.columns, align, strict=False)
        )
        + "</tr>"
    )
    lines += ["</thead>", "<tbody>"]
    for index, row in enumerate(table.rows):
        rule = ' class="rule"' if index in table.rules_after else ""
        lines.append(
            f"<tr{rule}>"
            + "".join(
                f'<td class="{"num" if a == "r" else "txt"}">{html_cell(c)}</td>'
                for c, a in zip(row, align, strict=False)
            )
            + "</tr>"
        )
    lines += ["</tbody>", "</table>"]
    if table.notes:
        lines.append('<figcaption class="notes">' + "<br>".join(escape(n) for n in table.notes) + "</figcaption>")
    lines.append("</figure>")
    return "\n".join(lines) + "\n"
