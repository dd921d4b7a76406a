"""Zero-shot tables: the Fi-ImageNet-1k paper's Table-2 layout (rows = models, columns = vocabulary families)
and k/M sweeps.

Columns: the best logit-space score (MCM, MaxLogit, Energy, GEN, entropy, margin, GL-MCM; the winner is named),
EOE, WN (WordNet NegMining), LLM siblings, WN+LLM and oracle. Cells are FPR@95 in % averaged over the run's OOD
sets (or one chosen set). The best *deployable* vocabulary column of each row is bold; the oracle column uses the
benchmark's own OOD labels, is a lower bound and is never marked best.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ZeroShotError
from ..core.results import ResultRow, read_rows
from ..core.rundir import RunDir
from ..core.tabular import detector_table_markdown

__all__ = [
    "RunView",
    "load_run",
    "find_runs",
    "table2_markdown",
    "sweep_markdown",
    "render_run_tables",
    "TABLE2_COLUMNS",
]

TABLE2_COLUMNS = ("logit", "EOE", "WN", "LLM siblings", "WN+LLM", "oracle")
_HEADERS = {"logit": "best logit-space", "oracle": "oracle†"}
_DEPLOYABLE = ("EOE", "WN", "LLM siblings", "WN+LLM")
_LOWER_IS_BETTER = {"fpr95"}
_ORACLE_NOTE = (
    "† oracle: the benchmark's own OOD labels as negatives, a lower bound that no deployed detector "
    "can use (non-deployable)."
)


@dataclass
class RunView:
    """One model's zero-shot run: its rows and the description of each detector column."""

    model: str
    rows: list[ResultRow]
    detectors: dict[str, dict[str, Any]]
    ood_datasets: list[str]


def load_run(run_dir: str | os.PathLike[str]) -> RunView:
    """A zero-shot run directory (results.parquet + run.json with a 'zeroshot' section)."""
    run_dir = Path(run_dir)
    info_path = run_dir / "run.json"
    if not info_path.is_file():
        raise ZeroShotError(f"{run_dir} is not a run directory (no run.json)")
    info = RunDir(run_dir).read_info()
    if "zeroshot" not in info:
        raise ZeroShotError(
            f"{run_dir} is not a zero-shot run (run.json has no 'zeroshot' section); "
            "make one with `oodbench zeroshot evaluate`"
        )
    if not (run_dir / "results.parquet").is_file():
        raise ZeroShotError(f"{run_dir} has no results.parquet: the run did not finish; rerun it to resume")
    return RunView(
        info["model"],
        read_rows(run_dir / "results.parquet"),
        info["zeroshot"]["detectors"],
        list(info.get("ood_datasets", [])),
    )


def find_runs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Zero-shot run directories at or below `paths` (a directory with run.json, or a parent of several)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / "run.json").is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p.parent for p in path.rglob("run.json")))
        else:
            raise ZeroShotError(f"no run directory at {path}")
    runs = [p for p in dict.fromkeys(found) if "zeroshot" in RunDir(p).read_info()]
    if not runs:
        raise ZeroShotError(f"no zero-shot run directories under {', '.join(map(str, paths))}")
    return runs


def _value(rows: Sequence[ResultRow], detector: str, metric: str, oods: Sequence[str]) -> float | None:
    """Mean of `metric` over `oods` for `detector`, or None unless every set has a value."""
    lookup = {r.ood_dataset: r.value for r in rows if r.detector == detector and r.metric == metric}
    if not oods or any(o not in lookup for o in oods):
        return None
    return sum(lookup[o] for o in oods) / len(oods)


def _better(metric: str) -> Callable[[float, float], bool]:
    return (lambda a, b: a < b) if metric in _LOWER_IS_BETTER else (lambda a, b: a > b)


def _cells(view: RunView, metric: str, oods: Sequence[str]) -> dict[str, tuple[float, str]]:
    """Best (value, detector) per Table-2 column; sweep points (m or k set) are not candidates."""
    better = _better(metric)
    cells: dict[str, tuple[float, str]] = {}
    for detector, info in view.detectors.items():
        if info.get("m") is not None or info.get("k") is not None:
            continue
        column = info.get("column")
        if column not in TABLE2_COLUMNS:
            continue
        value = _value(view.rows, detector, metric, oods)
        if value is not None and (column not in cells or better(value, cells[column][0])):
            cells[column] = (value, detector)
    return cells


def table2_markdown(views: Sequence[RunView], *, metric: str = "fpr95", ood: str | None = None) -> str:
    """Markdown table in the Fi-ImageNet-1k paper's Table-2 layout: a row per model, best deployable vocabulary bold."""
    if not views:
        raise ZeroShotError("no runs to tabulate")
    better = _better(metric)
    headers = [_HEADERS.get(c, c) for c in TABLE2_COLUMNS]
    lines = ["| model | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    notes: list[str] = []
    averaged: set[tuple[str, ...]] = set()
    for view in views:
        if ood is not None and ood not in view.ood_datasets:
            raise ZeroShotError(f"OOD set {ood!r} is not in the run of {view.model} (it has {view.ood_datasets})")
        oods = [ood] if ood is not None else view.ood_datasets
        averaged.add(tuple(oods))
        cells = _cells(view, metric, oods)
        deployable = [c for c in _DEPLOYABLE if c in cells]
        best = None
        for column in deployable:
            if best is None or better(cells[column][0], cells[best][0]):
                best = column
        texts = []
        for column in TABLE2_COLUMNS:
            if column not in cells:
                texts.append("–")
                continue
            value, detector = cells[column]
            text = f"{100 * value:.1f}"
            if column == "logit":
                text += f" ({detector})"
            else:
                notes.append(f"{view.model} / {_HEADERS.get(column, column)}: {detector}")
            texts.append(f"**{text}**" if column == best else text)
        lines.append(f"| {view.model} | " + " | ".join(texts) + " |")
    label = {"fpr95": "FPR@95 (%)", "auroc": "AUROC (%)", "aupr_in": "AUPR-In (%)", "aupr_out": "AUPR-Out (%)"}
    over = "; ".join(", ".join(o) for o in sorted(averaged))
    footer = [
        "",
        f"{label.get(metric, metric)}, {'lower' if metric in _LOWER_IS_BETTER else 'higher'} is better; "
        f"{'mean over' if ood is None else 'on'} OOD set(s): {over}. Bold: best deployable vocabulary of the row.",
        _ORACLE_NOTE,
    ]
    if notes:
        footer.append("Columns: " + "; ".join(notes) + ".")
    return "\n".join(lines + footer) + "\n"


def sweep_markdown(view: RunView, *, metric: str = "fpr95") -> str:
    """One table per swept vocabulary column: rows = k or M, columns = OOD sets and their mean ('' if no sweep)."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for detector, info in view.detectors.items():
        for param in ("k", "m"):
            if info.get(param) is not None:
                base = f"{info['score']}@{info['vocabulary']}"
                groups.setdefault((base, param), []).append((int(info[param]), detector))
    blocks = []
    for (base, param), points in groups.items():
        header = f"| {param} | " + " | ".join(view.ood_datasets) + " | mean |"
        lines = [
            f"{base}: {metric} (%) by {'siblings per class k' if param == 'k' else 'WordNet prefix size M'}",
            "",
            header,
            "|---:|" + "---:|" * (len(view.ood_datasets) + 1),
        ]
        for value, detector in sorted(points):
            cells = [_value(view.rows, detector, metric, [o]) for o in view.ood_datasets]
            mean = _value(view.rows, detector, metric, view.ood_datasets)
            lines.append(
                f"| {value} | "
                + " | ".join("–" if c is None else f"{100 * c:.1f}" for c in cells)
                + f" | {'–' if mean is None else f'{100 * mean:.1f}'} |"
            )
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def render_run_tables(rows: Sequence[ResultRow], run_info: Mapping[str, Any], *, metric: str = "fpr95") -> str:
    """table.md of a zero-shot run: the Table-2 row, the per-OOD-set detector table, and any sweep tables."""
    detectors = dict(run_info["zeroshot"]["detectors"])
    oods = list(run_info.get("ood_datasets") or dict.fromkeys(r.ood_dataset for r in rows))
    view = RunView(run_info["model"], list(rows), detectors, oods)
    parts = [
        "## Zero-shot summary (Fi-ImageNet-1k paper, Table 2 layout)",
        "",
        table2_markdown([view], metric=metric),
        "## Per OOD set: FPR@95 / AUROC (%)",
        "",
        detector_table_markdown(rows, [d for d in detectors if d in {r.detector for r in rows}], oods),
    ]
    oracle = [d for d, info in detectors.items() if info.get("deployable") is False]
    if oracle:
        parts.append(
            f"† {', '.join(oracle)}: oracle vocabulary (the OOD sets' own labels), non-deployable lower bound.\n"
        )
    sweeps = sweep_markdown(view, metric=metric)
    if sweeps:
        parts += ["## Sweeps", "", sweeps]
    return "\n".join(parts)
