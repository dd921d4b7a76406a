"""A renderer-neutral table: header groups, columns, cells with bold/notes/marks, footnotes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import AnalysisError

__all__ = ["Cell", "Table", "percent", "MISSING"]

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
