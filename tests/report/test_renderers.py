"""Renderers: escaping in each format, HTML structure parsed back, header groups."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from oodbench.core.errors import AnalysisError
from oodbench.core.tabular import Cell, Table, render_markdown
from oodbench.report.html import render_html
from oodbench.report.latex import latex_escape, render_latex

TRICKY = Table(
    "tricky",
    "A & B: 100% of {x}_1",
    ("name", "value"),
    ((Cell("a|b"), Cell("1.0", note="d_1", bold=True)), (Cell("<script>"), Cell("2.0", mark="†"))),
    groups=(("", 1), ("grp #1", 1)),
    notes=("ρ ≥ σ ~ 5$",),
)


class _TableParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.spans: list[str] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []
            self.spans.append(dict(attrs).get("colspan", "1"))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_markdown_escapes_pipes_and_shows_notes() -> None:
    text = render_markdown(TRICKY)
    assert "| grp #1: value |" in text.splitlines()[2]
    assert "| a\\|b | **1.0** (d_1) |" in text
    assert "2.0†" in text and text.rstrip().endswith("ρ ≥ σ ~ 5$")


def test_latex_escapes_specials_and_unicode() -> None:
    assert (
        latex_escape("100% & {x}_1 #2 ~ ^ \\")
        == r"100\% \& \{x\}\_1 \#2 \textasciitilde{} \textasciicircum{} \textbackslash{}"
    )
    assert latex_escape("ρ ≥ σ − 1 †") == r"$\rho$ $\geq$ $\sigma$ $-$ 1 $^\dagger$"
    tex = render_latex(TRICKY)
    assert r"\caption{A \& B: 100\% of \{x\}\_1}" in tex
    assert r"\textbf{1.0}~{\scriptsize (d\_1)}" in tex and r"2.0$^\dagger$" in tex and "a$|$b" in tex


def test_html_escapes_and_parses_back_into_the_same_grid() -> None:
    html = render_html(TRICKY)
    assert "<script>" not in html and "&lt;script&gt;" in html
    parser = _TableParser()
    parser.feed(html)
    assert parser.rows == [["", "grp #1"], ["name", "value"], ["a|b", "1.0 (d_1)"], ["<script>", "2.0†"]]
    assert "strong" in parser.tags and "caption" in parser.tags


def test_grouped_html_header_spans_columns(supervised_rows) -> None:
    from oodbench.report.tables import table1

    parser = _TableParser()
    parser.feed(render_html(table1(supervised_rows)))
    assert parser.rows[0] == ["", "ninco", "openimage-o", "mean"]
    assert parser.spans[:4] == ["1", "2", "2", "2"]
    assert len(parser.rows[1]) == len(parser.rows[2]) == 7


def test_table_shape_is_validated() -> None:
    with pytest.raises(AnalysisError, match="row 0 has 1 cells for 2 columns"):
        Table("bad", "bad", ("a", "b"), ((Cell("x"),),))
    with pytest.raises(AnalysisError, match="groups span"):
        Table("bad", "bad", ("a", "b"), ((Cell("x"), Cell("y")),), groups=(("g", 3),))
