"""Renderer-neutral tables (header groups, columns, cells with bold/notes/marks, footnotes), their Markdown rendering,
and the per-detector result table that `evaluate`, the runner and zero-shot runs write as ``table.md``.

A core module: the evaluation layer writes tables with it, and the report adds LaTeX and HTML renderers and the
paper's layouts on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .errors import AnalysisError

__all__ = [
    "Cell",
    "Table",
    "percent",
    "MISSING",
    "render_markdown",
    "markdown_cell",
    "detector_table",
    "detector_table_markdown",
    "MetricRow",
]

MISSING = "–"


@dataclass(frozen=True)
class Cell:
    """One cell: main text, an optional secondary note (e.g. a detector name), bold, and a footnote mark."""

    text: str
    note: str = ""
    bold: bool = False
    mark: str = ""


@dataclass(frozen=True)
class Table:
    """A table in one of the paper's layouts, ready for the Markdown, LaTeX and HTML renderers."""

    key: str  # file stem and anchor, e.g. "table1"
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    groups: tuple[tuple[str, int], ...] = ()  # spanning header labels over consecutive columns ("" = none)
    align: tuple[str, ...] = ()  # "l" or "r" per column
    notes: tuple[str, ...] = ()
    rules_after: tuple[int, ...] = field(default=())  # body row indices followed by a rule
    wrap: bool = False  # long free-text values (provenance): wrap them instead of widening the table

    def __post_init__(self) -> None:
        width = len(self.columns)
        for index, row in enumerate(self.rows):
            if len(row) != width:
                raise AnalysisError(f"table {self.key}: row {index} has {len(row)} cells for {width} columns")
        if self.groups and sum(span for _, span in self.groups) != width:
            raise AnalysisError(
                f"table {self.key}: header groups span {sum(s for _, s in self.groups)} of {width} columns"
            )
        if self.align and len(self.align) != width:
            raise AnalysisError(f"table {self.key}: {len(self.align)} alignments for {width} columns")

    @property
    def alignment(self) -> tuple[str, ...]:
        return self.align or ("l",) + ("r",) * (len(self.columns) - 1)

    def column_groups(self) -> list[str]:
        """The group label of each column ('' where none)."""
        labels: list[str] = []
        for label, span in self.groups:
            labels.extend([label] * span)
        return labels or [""] * len(self.columns)


def percent(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage string; the missing-value dash for None/NaN."""
    if value is None or value != value:
        return MISSING
    return f"{100 * value:.{digits}f}"


# ------------------------------------------------------------------------------------------------------ Markdown


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
    """The table as GitHub-flavoured Markdown (header groups folded into the column names), optionally with its
    title above; its notes follow below."""
    groups = table.column_groups()
    header = [f"{group}: {name}" if group else name for group, name in zip(groups, table.columns, strict=True)]
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


# ------------------------------------------------------------------------------------------- the detector table


class MetricRow(Protocol):
    """What the detector table reads of a result row (`oodbench.core.results.ResultRow` has it; core imports nothing
    above itself). Read-only, as a frozen dataclass's fields are."""

    @property
    def model(self) -> str: ...
    @property
    def id_dataset(self) -> str: ...
    @property
    def ood_dataset(self) -> str: ...
    @property
    def detector(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def n_ood(self) -> int: ...


def detector_table(
    rows: Sequence[MetricRow],
    detectors: Sequence[str] | None = None,
    ood_datasets: Sequence[str] | None = None,
    *,
    key: str = "detectors",
    title: str = "Detectors × OOD sets",
    convention: str | None = None,
    aupr: bool = False,
) -> Table:
    """One (model, ID set)'s detectors × OOD sets: cells FPR@95 / AUROC (%), the lowest FPR@95 per OOD set in bold,
    and each detector's mean over the OOD sets where it has both metrics.

    `rows` hold one model on one ID set (the caller selects them); `detectors` and `ood_datasets` choose and order the
    rows and columns (default: order of first appearance). `convention` adds its note (the rows carry its plain
    metric names: `results.convention_rows`); `aupr` adds AUPR-In / AUPR-Out to every cell.
    """
    pairs = {(r.model, r.id_dataset) for r in rows}
    if len(pairs) > 1:
        raise AnalysisError(f"a detector table shows one (model, ID set); got {sorted(pairs)}")
    values = {(r.detector, r.ood_dataset, r.metric): r.value for r in rows}
    detectors = list(detectors) if detectors is not None else list(dict.fromkeys(r.detector for r in rows))
    oods = list(ood_datasets) if ood_datasets is not None else list(dict.fromkeys(r.ood_dataset for r in rows))
    n_ood = {r.ood_dataset: r.n_ood for r in rows}
    best: dict[str, float] = {}
    for ood in oods:
        fprs = [values[(d, ood, "fpr95")] for d in detectors if (d, ood, "fpr95") in values]
        if fprs:
            best[ood] = min(fprs)
    body = []
    shown = ("fpr95", "auroc", "aupr_in", "aupr_out") if aupr else ("fpr95", "auroc")
    for detector in detectors:
        line: list[Cell] = [Cell(detector)]
        kept: list[tuple[float, ...]] = []
        for ood in oods:
            cell = tuple(values.get((detector, ood, m)) for m in shown)
            if any(v is None for v in cell):
                line.append(Cell(MISSING))
                continue
            kept.append(cell)  # type: ignore[arg-type]
            line.append(Cell(" / ".join(percent(v) for v in cell), bold=cell[0] == best.get(ood)))
        means = [sum(column) / len(kept) for column in zip(*kept, strict=True)] if kept else []
        line.append(Cell(" / ".join(percent(v) for v in means)) if kept else Cell(MISSING))
        body.append(tuple(line))
    columns = ("detector",) + tuple(f"{o} (n={n_ood[o]})" if o in n_ood else o for o in oods) + ("mean",)
    what = "FPR@95 / AUROC / AUPR-In / AUPR-Out" if aupr else "FPR@95 / AUROC"
    notes = [f"Cells: {what} (%); the lowest FPR@95 per OOD set in bold; mean over the OOD sets."]
    if convention is not None:
        from .metrics import CONVENTION_NOTES, check_convention

        notes.append(CONVENTION_NOTES[check_convention(convention)])
    return Table(key, title, columns, tuple(body), notes=tuple(notes))


def detector_table_markdown(
    rows: Sequence[MetricRow],
    detectors: Sequence[str] | None = None,
    ood_datasets: Sequence[str] | None = None,
    *,
    convention: str | None = None,
    aupr: bool = False,
) -> str:
    """The detector table of one (model, ID set) as Markdown, without a title (``table.md`` of a run)."""
    table = detector_table(rows, detectors, ood_datasets, convention=convention, aupr=aupr)
    return render_markdown(table, title=False)
