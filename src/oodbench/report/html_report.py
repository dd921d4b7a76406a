"""One self-contained HTML report: inline CSS, figures as base64 PNG, no scripts, no external resources.

A Content-Security-Policy in the page forbids every external load, so what renders offline is all there is.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from html import escape
from pathlib import Path
from typing import Any

from ..core.tabular import Table
from ..util.atomic import atomic_write_text
from .build import FigureItem, ReportContent, ReportOptions, build_report
from .html import render_html

__all__ = ["CSS", "render_html_document", "write_html_report"]

CSS = """
:root { --ink: #1d2430; --muted: #5b6575; --line: #d5dae1; --accent: #1f5fa8; --bg: #ffffff; --band: #f4f6f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: var(--bg); }
header { padding: 24px 32px 12px; border-bottom: 3px solid var(--accent); background: var(--band); }
header h1 { margin: 0 0 6px; font-size: 24px; }
.meta { color: var(--muted); margin: 2px 0; font-size: 12px; word-break: break-all; }
nav { padding: 8px 32px; border-bottom: 1px solid var(--line); font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; }
main { padding: 8px 32px 48px; max-width: 1400px; }
section { margin-top: 28px; }
h2 { font-size: 19px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
figure { margin: 16px 0 22px; }
/* A table wider than the window scrolls inside its figure, and says so: a shadow on each edge that has more
   columns beyond it (no script: the "local" covers travel with the content and hide a shadow at that end). */
figure.table { overflow-x: auto;
  background: linear-gradient(to right, var(--bg) 40%, rgba(255, 255, 255, 0)) left / 36px 100% no-repeat local,
              linear-gradient(to left, var(--bg) 40%, rgba(255, 255, 255, 0)) right / 36px 100% no-repeat local,
              radial-gradient(farthest-side at 0 50%, rgba(29, 36, 48, .35), rgba(29, 36, 48, 0)) left / 14px 100%
                no-repeat scroll,
              radial-gradient(farthest-side at 100% 50%, rgba(29, 36, 48, .35), rgba(29, 36, 48, 0)) right / 14px 100%
                no-repeat scroll; }
table.oodb { border-collapse: collapse; font-size: 12.5px; font-variant-numeric: tabular-nums; }
table.oodb caption { text-align: left; font-weight: 600; padding: 4px 0 8px; font-size: 14px; white-space: nowrap; }
table.oodb thead tr:first-child th { border-top: 2px solid var(--ink); }
table.oodb thead tr:last-child th { border-bottom: 1px solid var(--ink); }
table.oodb th.group { text-align: center; border-bottom: 1px solid var(--line); }
table.oodb th, table.oodb td { padding: 3px 9px; white-space: nowrap; }
table.oodb tbody tr:last-child td { border-bottom: 2px solid var(--ink); }
/* The band is translucent (the same colour on white) so that the scroll shadows show through it. */
table.oodb tbody tr:nth-child(even) { background: rgba(35, 75, 135, .05); }
table.oodb tr.rule td { border-bottom: 1px solid var(--line); }
table.oodb .num { text-align: right; }
table.oodb .txt { text-align: left; }
table.oodb .note { color: var(--muted); font-size: 11px; }
/* Provenance: free text (hashes, paths, head descriptions) wraps inside the page instead of running off to the
   right; a hash may break anywhere. Keys (the first column) and column headings keep their words whole: with
   "anywhere" a narrow column would read "directo ry". */
table.oodb.wrap { width: 100%; }
table.oodb.wrap th, table.oodb.wrap td { white-space: normal; overflow-wrap: anywhere; vertical-align: top; }
table.oodb.wrap th { overflow-wrap: normal; }
table.oodb.wrap td:first-child { white-space: nowrap; overflow-wrap: normal; }
table.oodb.wrap caption { white-space: normal; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 4px; max-width: 1000px; }
figure.plot img { max-width: 100%; height: auto; border: 1px solid var(--line); }
ul.notes { color: var(--muted); }
/* A phone: less padding, and captions wrap within the window (the table under them still scrolls). */
@media (max-width: 600px) {
  header { padding: 16px 12px 10px; }
  nav { padding: 8px 12px; }
  main { padding: 8px 12px 32px; }
  table.oodb caption { white-space: normal; max-width: calc(100vw - 24px); }
}
"""


def _figure_html(item: FigureItem, png_base64: str) -> str:
    return (
        f'<figure class="plot" id="{escape(item.stem)}">'
        f'<img alt="{escape(item.caption)}" src="data:image/png;base64,{png_base64}">'
        f"<figcaption>{escape(item.caption)}</figcaption></figure>\n"
    )


def _text_html(text: str) -> list[str]:
    """Paragraphs (blank-line separated) and their ``- `` bullet lines as lists, escaped."""
    parts: list[str] = []
    for block in text.split("\n\n") if text else ():
        prose: list[str] = []
        items: list[str] = []
        for line in block.splitlines():
            if line.startswith("- "):
                if prose:
                    parts.append(f"<p>{escape(' '.join(prose))}</p>")
                    prose = []
                items.append(f"<li>{escape(line[2:])}</li>")
            else:
                if items:
                    parts.append("<ul>" + "".join(items) + "</ul>")
                    items = []
                prose.append(line)
        if prose:
            parts.append(f"<p>{escape(' '.join(prose))}</p>")
        if items:
            parts.append("<ul>" + "".join(items) + "</ul>")
    return parts


def render_html_document(
    content: ReportContent, figure_png: Callable[[FigureItem], str] | None = None, *, generated: str | None = None
) -> str:
    """The full HTML page; `figure_png(item)` returns base64 PNG (default: render the figure now)."""
    if figure_png is None:
        from .figures import figure_png_base64

        def figure_png(item: FigureItem) -> str:
            return figure_png_base64(item.make())

    generated = generated or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # Nothing outside this file may load: the report must be complete offline.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">",
        f"<title>{escape(content.title)}</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        f"<header><h1>{escape(content.title)}</h1>",
        f'<p class="meta">Generated {escape(generated)} by oodbench from {len(content.runs)} run(s): '
        f"{escape(', '.join(content.runs))}</p></header>",
    ]
    parts.append(
        "<nav>" + "".join(f'<a href="#{escape(s.key)}">{escape(s.title)}</a>' for s in content.sections) + "</nav>"
    )
    parts.append("<main>")
    for section in content.sections:
        parts.append(f'<section id="{escape(section.key)}"><h2>{escape(section.title)}</h2>')
        parts += _text_html(section.text)
        for item in section.items:
            parts.append(render_html(item) if isinstance(item, Table) else _figure_html(item, figure_png(item)))
        parts.append("</section>")
    if content.notes:
        parts.append(
            '<section id="notes"><h2>Notes</h2><ul class="notes">'
            + "".join(f"<li>{escape(n)}</li>" for n in content.notes)
            + "</ul></section>"
        )
    parts += ["</main>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_html_report(
    run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    *,
    options: ReportOptions | None = None,
    progress: bool = False,
    **option_values: Any,
) -> Path:
    """Build the report of one or more run directories and write it as one self-contained HTML file."""
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    if option_values:
        base = options or ReportOptions()
        options = replace(base, **option_values)
    content = build_report(list(run_dirs), options, progress=progress)
    out_path = Path(out_path)
    atomic_write_text(out_path, render_html_document(content))
    return out_path


def render_audit_html(title: str, sections: Sequence[tuple[str, str, str, list[Any]]], subject: str) -> str:
    """An audit document (title, (key, title, text, tables) sections, subject) as one self-contained HTML page."""
    from .build import Section

    return render_html_document(ReportContent(title, [Section(*section) for section in sections], [subject]))
