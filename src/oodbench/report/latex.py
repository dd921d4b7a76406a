"""Render a `Table` as a LaTeX booktabs table (best values in bold, notes as a footnote-size paragraph)."""

from __future__ import annotations

import re

from ..core.tabular import Cell, Table

__all__ = ["render_latex", "latex_escape"]

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    # Unicode used in our tables, spelled so that pdflatex without extra packages accepts it.
    "↓": r"$\downarrow$",
    "↑": r"$\uparrow$",
    "ρ": r"$\rho$",
    "σ": r"$\sigma$",
    "±": r"$\pm$",
    "√": r"$\surd$",
    "−": r"$-$",
    "–": "--",
    "—": "---",
    "†": r"$^\dagger$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "×": r"$\times$",
    "·": r"$\cdot$",
    "|": r"$|$",
}
_PATTERN = re.compile("|".join(re.escape(k) for k in _SPECIAL))


def latex_escape(text: str) -> str:
    """Escape LaTeX specials and spell the Unicode symbols our tables use."""
    return _PATTERN.sub(lambda m: _SPECIAL[m.group(0)], text)


def _cell(cell: Cell) -> str:
    text = latex_escape(cell.text)
    if cell.bold:
        text = rf"\textbf{{{text}}}"
    if cell.note:
        text += rf"~{{\scriptsize ({latex_escape(cell.note)})}}"
    return text + latex_escape(cell.mark)


def render_latex(table: Table, *, label_prefix: str = "tab:") -> str:
    """A complete `table` environment using booktabs rules (needs \\usepackage{booktabs})."""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(table.title)}}}",
        rf"\label{{{label_prefix}{table.key}}}",
        rf"\begin{{tabular}}{{{''.join(table.alignment)}}}",
        r"\toprule",
    ]
    if table.groups and any(label for label, _ in table.groups):
        cells, rules, start = [], [], 1
        for label, span in table.groups:
            if label:
                cells.append(
                    rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(label)}}}" if span > 1 else latex_escape(label)
                )
                rules.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
            else:
                cells.extend([""] * span)
            start += span
        lines.append(" & ".join(cells) + r" \\")
        lines.append(" ".join(rules))
    lines.append(" & ".join(latex_escape(c) for c in table.columns) + r" \\")
    lines.append(r"\midrule")
    for index, row in enumerate(table.rows):
        lines.append(" & ".join(_cell(c) for c in row) + r" \\")
        if index in table.rules_after and index != len(table.rows) - 1:
            lines.append(r"\midrule")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines.append(r"\par\smallskip")
        lines.append(r"{\footnotesize " + r" \\ ".join(latex_escape(n) for n in table.notes) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
