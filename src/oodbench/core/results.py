"""Tidy result rows (model, id_dataset, ood_dataset, detector, metric, value, n_id, n_ood) and their Parquet files."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..util.atomic import atomic_path
from .errors import AnalysisError

__all__ = [
    "ResultRow",
    "COLUMNS",
    "schema",
    "write_rows",
    "read_rows",
    "rows_from_metrics",
    "metric_rows",
    "convention_rows",
    "full_spectrum_id",
    "full_spectrum_rows",
]


@dataclass(frozen=True)
class ResultRow:
    """One metric value of one detector on one (model, ID set, OOD set)."""

    model: str
    id_dataset: str
    ood_dataset: str
    detector: str
    metric: str
    value: float
    n_id: int
    n_ood: int


# (column, Arrow type) of a result table; pyarrow is imported only when a table is written or read.
COLUMNS = (
    ("model", "string"),
    ("id_dataset", "string"),
    ("ood_dataset", "string"),
    ("detector", "string"),
    ("metric", "string"),
    ("value", "float64"),
    ("n_id", "int64"),
    ("n_ood", "int64"),
)
_NAMES = [name for name, _ in COLUMNS]


def schema() -> Any:
    """The Arrow schema of a result table."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS])


def rows_from_metrics(
    model: str, id_dataset: str, ood_dataset: str, detector: str, metrics: dict[str, float], n_id: int, n_ood: int
) -> list[ResultRow]:
    """One row per metric of a `metrics.evaluate` result."""
    return [
        ResultRow(model, id_dataset, ood_dataset, detector, name, float(value), int(n_id), int(n_ood))
        for name, value in metrics.items()
    ]


def metric_rows(
    model: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    detectors: Sequence[str],
    scores: Mapping[str, Mapping[str, np.ndarray]],
    tpr: float,
    conventions: Sequence[str] = ("oodbench",),
) -> list[ResultRow]:
    """Every metric of every detector on every OOD set, from per-image scores {dataset: {detector: scores}}, in
    each of `conventions` (rows of a convention other than oodbench's are named ``<convention>.<metric>``)."""
    from . import metrics

    rows: list[ResultRow] = []
    for detector in detectors:
        id_scores = scores[id_dataset][detector]
        for ood in ood_datasets:
            ood_scores = scores[ood][detector]
            for convention in conventions:
                values = {
                    metrics.convention_metric(name, convention): value
                    for name, value in metrics.evaluate(id_scores, ood_scores, tpr, convention).items()
                }
                rows.extend(
                    rows_from_metrics(model, id_dataset, ood, detector, values, len(id_scores), len(ood_scores))
                )
    return rows


def convention_rows(rows: Iterable[ResultRow], convention: str) -> list[ResultRow]:
    """The rows of one convention under the plain metric names (``openood.fpr95`` read as ``fpr95``), so that every
    table reads either convention the same way; rows of other conventions are left out."""
    from .metrics import CONVENTIONS, check_convention

    check_convention(convention)
    prefixes = tuple(f"{c}." for c in CONVENTIONS[1:])
    if convention == CONVENTIONS[0]:
        return [r for r in rows if not r.metric.startswith(prefixes)]
    prefix = f"{convention}."
    return [replace(r, metric=r.metric[len(prefix) :]) for r in rows if r.metric.startswith(prefix)]


def full_spectrum_id(id_dataset: str, csid_datasets: Sequence[str]) -> str:
    """The ID label of full-spectrum rows: the ID test set and its covariate-shifted sets, joined by '+'."""
    return "+".join([id_dataset, *csid_datasets])


def full_spectrum_rows(
    model: str,
    id_dataset: str,
    csid_datasets: Sequence[str],
    ood_datasets: Sequence[str],
    detectors: Sequence[str],
    scores: Mapping[str, Mapping[str, np.ndarray]],
    tpr: float,
    convention: str = "oodbench",
) -> list[ResultRow]:
    """Full-spectrum rows (OpenOOD v1.5's FSOOD): the covariate-shifted sets count as ID, their scores joined to
    the ID test set's; `id_dataset` of the rows is `full_spectrum_id`. Metric names are the plain ones of
    `convention`."""
    from . import metrics

    label = full_spectrum_id(id_dataset, csid_datasets)
    rows: list[ResultRow] = []
    for detector in detectors:
        id_scores = np.concatenate([np.asarray(scores[d][detector]) for d in [id_dataset, *csid_datasets]])
        for ood in ood_datasets:
            ood_scores = scores[ood][detector]
            values = metrics.evaluate(id_scores, ood_scores, tpr, convention)
            rows.extend(rows_from_metrics(model, label, ood, detector, values, len(id_scores), len(ood_scores)))
    return rows


def write_rows(rows: Iterable[ResultRow], path: str | os.PathLike[str]) -> Path:
    """Write rows to a Parquet file atomically (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {f.name: [] for f in fields(ResultRow)}
    for row in rows:
        for key, value in asdict(row).items():
            columns[key].append(value)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pydict(columns, schema=schema())
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_rows(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[ResultRow]:
    """Rows from one or more Parquet files (or directories of them)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            files.extend(sorted(entry.rglob("*.parquet")))
        elif entry.is_file():
            files.append(entry)
        else:
            raise AnalysisError(f"no result file or directory at {entry}")
    if not files:
        raise AnalysisError(f"no .parquet result files found in {', '.join(map(str, paths))}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[ResultRow] = []
    for file in files:
        try:
            table = pq.read_table(file)
        except (pa.ArrowException, OSError) as exc:
            raise AnalysisError(f"{file} is not a readable Parquet result table: {exc}") from None
        missing = [name for name in _NAMES if name not in table.column_names]
        if missing:
            raise AnalysisError(f"{file} is not a result table: missing columns {missing}")
        data = table.select(_NAMES).to_pydict()
        rows.extend(ResultRow(*values) for values in zip(*(data[name] for name in _NAMES), strict=True))
    return rows
