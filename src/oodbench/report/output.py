"""Write a built report to a directory: tables as .md/.tex/.html, figures as PNG/PDF, and report.{md,tex,html}."""

from __future__ import annotations

import base64
import csv
import io
import os
import time
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import AnalysisError
from ..core.tabular import Table, render_markdown
from ..util.atomic import atomic_write_text, remove_stale_temporaries
from .build import FigureItem, ReportContent
from .figures import save_figure
from .html import render_html
from .html_report import render_html_document
from .latex import latex_escape, render_latex

__all__ = ["TABLE_FORMATS", "parse_formats", "write_report"]

TABLE_FORMATS = ("md", "tex", "html")


def parse_formats(text: str | Sequence[str]) -> list[str]:
    """['md', 'tex', 'html'] from 'md,tex,html' (or a list), validated."""
    items = [p.strip().lower() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    aliases = {"markdown": "md", "latex": "tex", "htm": "html"}
    items = [aliases.get(i, i) for i in items]
    unknown = sorted(set(items) - set(TABLE_FORMATS))
    if unknown or not items:
        raise AnalysisError(f"unknown report formats {unknown or items}; choose from {', '.join(TABLE_FORMATS)}")
    return list(dict.fromkeys(items))


def _markdown_document(content: ReportContent) -> str:
    lines = [f"# {content.title}", "", "Runs: " + ", ".join(f"`{r}`" for r in content.runs), ""]
    for section in content.sections:
        lines += [f"## {section.title}", ""]
        if section.text:
            lines += [section.text, ""]
        for item in section.items:
            if isinstance(item, Table):
                lines.append(render_markdown(item))
            else:
                lines += [f"![{item.caption}](figures/{item.stem}.png)", "", f"*{item.caption}*", ""]
    if content.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in content.notes] + [""]
    return "\n".join(lines)


def _latex_document(content: ReportContent, has_pdf: bool) -> str:
    lines = [
        r"\documentclass{article}",
        r"\usepackage[margin=2cm,landscape]{geometry}",
        r"\usepackage{booktabs}",
        r"\usepackage{graphicx}",
        r"\begin{document}",
        rf"\section*{{{latex_escape(content.title)}}}",
    ]
    for section in content.sections:
        lines.append(rf"\subsection*{{{latex_escape(section.title)}}}")
        for paragraph in section.text.split("\n\n") if section.text else ():
            lines += [latex_escape(paragraph), ""]
        for item in section.items:
            if isinstance(item, Table):
                lines.append(render_latex(item).replace(r"\begin{table}[t]", r"\begin{table}[!htbp]"))
            elif has_pdf:
                lines += [
                    r"\begin{figure}[!htbp]",
                    r"\centering",
                    rf"\includegraphics[width=0.9\linewidth]{{figures/{item.stem}.pdf}}",
                    rf"\caption{{{latex_escape(item.caption)}}}",
                    r"\end{figure}",
                ]
        lines.append(r"\clearpage")
    lines.append(r"\end{document}")
    return "\n".join(lines) + "\n"


def write_report(
    content: ReportContent,
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = TABLE_FORMATS,
    figure_formats: Sequence[str] = ("png", "pdf"),
) -> dict[str, list[Path]]:
    """Write every table in each format, every figure once per figure format, and one report per format."""
    formats = parse_formats(list(formats))
    out = Path(out_dir)
    started = time.time()
    written: dict[str, list[Path]] = {"tables": [], "figures": [], "reports": []}
    renderers = {"md": render_markdown, "tex": render_latex, "html": render_html}
    for table in content.tables():
        for fmt in formats:
            path = out / "tables" / f"{table.key}.{fmt}"
            atomic_write_text(path, renderers[fmt](table))
            written["tables"].append(path)
    figure_formats = list(dict.fromkeys(["png", *figure_formats]))  # PNG is what Markdown and HTML embed
    pngs: dict[str, str] = {}
    for item in content.figures():
        figure = item.make()
        paths = save_figure(figure, out / "figures", item.stem, figure_formats)
        written["figures"].extend(paths)
        pngs[item.stem] = base64.b64encode((out / "figures" / f"{item.stem}.png").read_bytes()).decode("ascii")
        del figure
    if content.published:
        from .published import comparison_records

        records = comparison_records(content.published)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in records)
        atomic_write_text(out / "published-comparison.csv", buffer.getvalue())
        written["reports"].append(out / "published-comparison.csv")
    for relative, text in content.exports.items():  # e.g. OpenOOD's CSV layout (report/conventions.py)
        atomic_write_text(out / relative, text)
        written["reports"].append(out / relative)
    if "md" in formats:
        atomic_write_text(out / "report.md", _markdown_document(content))
        written["reports"].append(out / "report.md")
    if "tex" in formats:
        atomic_write_text(out / "report.tex", _latex_document(content, "pdf" in figure_formats))
        written["reports"].append(out / "report.tex")
    if "html" in formats:

        def embedded(item: FigureItem) -> str:
            return pngs[item.stem]

        atomic_write_text(out / "report.html", render_html_document(content, embedded))
        written["reports"].append(out / "report.html")
    remove_stale_temporaries([p for paths in written.values() for p in paths], started)
    return written
