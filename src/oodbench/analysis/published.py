"""The Fi-ImageNet-1k paper's published numbers (package data) and their comparison with a reproduction.

`load_published` reads the tidy table files of ``oodbench/data/published`` (see its README), `published_models` the
Table A8 model list with the name mapping of Tables 1, A1 and A2, and `compare_published` puts each published cell
beside the value a run reproduces: the same detector, or the run's best detector where the paper reports the best of
its pool, with a 95% interval of the reproduced value (Wilson on the OOD acceptance count for FPR@95 and on the
correct count for Top-1; DeLong for AUROC when the run has per-image scores) and whether the published value lies
outside it. Published values are in % (as printed); so are the reproduced values of a `Comparison`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AnalysisError
from ..results import ResultRow
from .delong import delong_interval
from .intervals import wilson_interval

__all__ = [
    "PUBLISHED_SETS",
    "TABLES",
    "MEAN_VLM",
    "MEAN_SUPERVISED",
    "MEAN_OOD",
    "ALL_MODELS",
    "FI",
    "PublishedCell",
    "PublishedModel",
    "Accuracy",
    "Comparison",
    "load_published",
    "published_models",
    "detector_labels",
    "slug",
    "match_models",
    "read_accuracy",
    "accuracy_not_computed",
    "compare_published",
    "top1_fpr_points",
]

PUBLISHED_SETS = ("fi-imagenet-1k",)
TABLES = ("1", "2", "3", "A1", "A2", "A3", "A4", "A5", "A6", "A7")
MEAN_VLM = "mean(VLM)"  # mean over the eight zero-shot VLMs
MEAN_SUPERVISED = "mean(supervised)"  # mean over the eight supervised models of Table 1
MEAN_OOD = "mean(OOD)"  # mean over the table's OOD sets other than Fi-ImageNet-1k
ALL_MODELS = "all"  # a statistic across models (Appendix E's rank correlation)
FI = "Fi-ImageNet-1k"
SUBSET_N = 655  # Table A6's draw size: the size of Fi-ImageNet-1k
# Table A6's columns and the SubsampleSummary fields that reproduce them.
DRAW_METRICS = {
    "draw_mean": "mean",
    "draw_bias": "bias",
    "draw_std": "std",
    "closed_form_se": "se",
    "spearman": "spearman",
}


@dataclass(frozen=True)
class PublishedCell:
    """One published number: table, model (Table A8 name), dataset, subset, detector, best-of flag, metric, value."""

    table: str
    model: str
    printed_model: str
    dataset: str
    subset: str
    detector: str
    best: bool
    metric: str
    value: float

    @property
    def printed(self) -> str:
        """The model name as the table prints it."""
        return self.printed_model or self.model


@dataclass(frozen=True)
class PublishedModel:
    """A model of Table A8 with its checkpoint, pre-training and parameter count."""

    model: str
    table1_name: str
    kind: str  # supervised, probe, zeroshot
    library: str  # timm, open_clip, hf
    checkpoint: str
    resolution: str
    pretraining: str
    params: str
    timm_backbone: str
    note: str

    def identifiers(self) -> set[str]:
        """Names a run may give this model: display name, checkpoint spellings, a probe's timm backbone."""
        names = {self.model, self.checkpoint, self.timm_backbone}
        if " / " in self.checkpoint:
            arch, tag = self.checkpoint.split(" / ", 1)
            names |= {f"{arch}/{tag}", f"{arch}:{tag}", f"{arch}.{tag}", f"{arch}-{tag}"}
        return {slug(n) for n in names if n}


def _directory(name: str) -> Path:
    if name not in PUBLISHED_SETS:
        raise AnalysisError(f"unknown published set {name!r}; available: {', '.join(PUBLISHED_SETS)}")
    return Path(str(resources.files("oodbench") / "data" / "published"))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


@cache
def _load(name: str) -> tuple[PublishedCell, ...]:
    cells = []
    for table in TABLES:
        path = _directory(name) / f"table{table}.csv"
        for line, row in enumerate(_rows(path), start=2):
            try:
                value = float(row["value"])
            except (KeyError, ValueError) as exc:
                raise AnalysisError(f"{path}:{line}: value {row.get('value')!r} is not a number") from exc
            if row["table"] != table:
                raise AnalysisError(f"{path}:{line}: table {row['table']!r} in the file of table {table}")
            cells.append(
                PublishedCell(
                    table,
                    row["model"],
                    row["printed_model"],
                    row["dataset"],
                    row["subset"],
                    row["detector"],
                    row["best"] == "1",
                    row["metric"],
                    value,
                )
            )
    return tuple(cells)


def load_published(name: str = "fi-imagenet-1k", table: str | None = None) -> list[PublishedCell]:
    """The published cells of one table (``"1"``, ``"A3"`` …) or of all tables."""
    if table is not None and table not in TABLES:
        raise AnalysisError(f"unknown table {table!r}; the paper's tables are {', '.join(TABLES)}")
    return [c for c in _load(name) if table is None or c.table == table]


@cache
def published_models(name: str = "fi-imagenet-1k") -> dict[str, PublishedModel]:
    """{display name: PublishedModel} of Table A8, in its order."""
    fields = PublishedModel.__dataclass_fields__
    return {
        row["model"]: PublishedModel(**{k: row[k] for k in fields}) for row in _rows(_directory(name) / "models.csv")
    }


@cache
def detector_labels(name: str = "fi-imagenet-1k") -> dict[str, str]:
    """{oodbench detector/score name: the paper's printed name}."""
    return {row["detector"]: row["printed"] for row in _rows(_directory(name) / "detectors.csv")}


def slug(text: str) -> str:
    """Lower case, runs of non-alphanumerics as one '-': the key on which names are matched."""
    return re.sub(r"[^0-9a-z+]+", "-", text.lower()).strip("-")


def match_models(run_models: Iterable[str], name: str = "fi-imagenet-1k") -> dict[str, str]:
    """{published model: run model} for the run models that name a Table A8 model (see the data README)."""
    models = published_models(name)
    lookup: dict[str, str] = {}
    for model in models.values():
        for key in model.identifiers():
            lookup[key] = model.model
    a7_names = {slug(m) for m in models}
    for model in models.values():
        # Table 1's short names count only where they are not another model's Table A7 name.
        if model.table1_name and slug(model.table1_name) not in a7_names:
            lookup[slug(model.table1_name)] = model.model
    matched: dict[str, str] = {}
    for run_model in run_models:
        published = lookup.get(slug(run_model))
        if published is not None:
            matched.setdefault(published, run_model)
    return matched


@dataclass(frozen=True)
class Accuracy:
    """Top-1 of one model on one dataset under one label set (``original``, ``real``, …) from accuracy.json."""

    model: str
    dataset: str
    labels: str
    top1: float  # fraction
    n: int
    n_excluded: int
    label_set: str = ""  # the classes the labels name ("ImageNet-1k", …); empty in files that predate it


def read_accuracy(run_dir: str | os.PathLike[str]) -> list[Accuracy]:
    """The rows of RUN_DIR/accuracy.json (empty when the file is absent)."""
    path = Path(run_dir) / "accuracy.json"
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        rows = data["rows"]
        result = [
            Accuracy(
                str(model),
                str(r["dataset"]),
                str(r["labels"]),
                float(r["top1"]),
                int(r["n"]),
                int(r.get("n_excluded", 0)),
                str(r.get("label_set", "")),
            )
            for r in rows
            if r["top1"] is not None or not r.get("reason")  # a row not computed says why (accuracy_not_computed)
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AnalysisError(
            f"{path}: expected {{'model': str, 'rows': [{{'dataset', 'labels', 'top1', 'n', 'n_excluded'}}]}} ({exc})"
        ) from exc
    for row in result:
        if not 0.0 <= row.top1 <= 1.0 or row.n < 1:
            raise AnalysisError(f"{path}: top1 must be a fraction in [0, 1] and n ≥ 1; got {row.top1} with n={row.n}")
    return result


def accuracy_not_computed(run_dir: str | os.PathLike[str]) -> dict[str, str]:
    """{model: 'dataset (labels): reason'} of the Top-1 rows RUN_DIR/accuracy.json records as not computed."""
    path = Path(run_dir) / "accuracy.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            str(data["model"]): f"{r['dataset']} ({r['labels']} labels): {r['reason']}"
            for r in data["rows"]
            if r.get("top1") is None and r.get("reason")
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AnalysisError(f"{path}: unreadable accuracy rows ({exc})") from exc


@dataclass(frozen=True)
class Comparison:
    """A published cell beside its reproduction (values in %; None where the run lacks the cell)."""

    cell: PublishedCell
    reproduced: float | None = None
    detector: str = ""  # the run's detector behind the reproduced value
    run_model: str = ""
    low: float | None = None  # interval of the reproduced value
    high: float | None = None
    method: str = ""  # "wilson", "delong", or "" without an interval
    note: str = ""

    @property
    def delta(self) -> float | None:
        """Reproduced minus published."""
        return None if self.reproduced is None else self.reproduced - self.cell.value

    @property
    def outside(self) -> bool:
        """Whether the published value lies outside the reproduced value's interval."""
        if self.low is None or self.high is None:
            return False
        return not self.low <= self.cell.value <= self.high


ScoreSource = Callable[[str, str, str], tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None]


class _Run:
    """The reproduction indexed for lookups: values per (model, dataset, detector, metric) in %."""

    def __init__(
        self, rows: Sequence[ResultRow], accuracy: Sequence[Accuracy], name: str, subsample: Sequence[Any] = ()
    ) -> None:
        self.subsample = list(subsample)
        self.values: dict[tuple[str, str, str, str], float] = {}
        self.n_ood: dict[tuple[str, str], int] = {}
        self.id_of: dict[str, str] = {}
        datasets: dict[str, str] = {}
        for r in rows:
            self.id_of.setdefault(r.model, r.id_dataset)
            if r.id_dataset != self.id_of[r.model]:
                continue  # one ID set per model: the first in the rows
            self.values[(r.model, r.ood_dataset, r.detector, r.metric)] = 100.0 * r.value
            self.n_ood[(r.model, r.ood_dataset)] = r.n_ood
            datasets.setdefault(slug(r.ood_dataset), r.ood_dataset)
        self.datasets = datasets
        self.accuracy = list(accuracy)
        self.models = match_models(list(dict.fromkeys([r.model for r in rows] + [a.model for a in accuracy])), name)

    def dataset(self, cell: PublishedCell) -> str | None:
        key = slug(cell.dataset) + ("-clean" if cell.subset == "clean" else "")
        return self.datasets.get(key)

    def detectors(self, model: str, dataset: str, metric: str) -> dict[str, float]:
        return {d: v for (m, o, d, k), v in self.values.items() if (m, o, k) == (model, dataset, metric)}


def _best(values: Mapping[str, float], metric: str) -> tuple[str, float] | None:
    """The best detector without a vocabulary (the paper's pools: post-hoc detectors, logit-space scores)."""
    pool = {d: v for d, v in values.items() if "@" not in d}
    if not pool:
        return None
    pick = min if metric == "fpr95" else max
    detector = pick(pool, key=lambda d: pool[d])
    return detector, pool[detector]


def _wilson(percent: float, n: int) -> tuple[float, float]:
    # The run stores a rate k/n; k is recovered exactly (|100·k/n − value| ≪ 0.5·100/n).
    k = int(round(percent * n / 100.0))
    low, high = wilson_interval(k, n)
    return 100.0 * float(low), 100.0 * float(high)


def _top1(run: _Run, model: str, prefer: Sequence[str]) -> Accuracy | None:
    rows = [a for a in run.accuracy if a.model == model]
    for labels in prefer:
        for row in rows:
            if row.labels == labels:
                return row
    return None


REANNOTATED = ("reimagenet", "real")  # the paper's Top-1 is on ReImageNet; ReaL stands in while that is unreleased


def _single(cell: PublishedCell, run: _Run, scores: ScoreSource | None) -> Comparison:
    """A cell of one concrete model and dataset."""
    run_model = run.models.get(cell.model)
    if run_model is None:
        return Comparison(cell)
    if cell.metric == "top1":
        acc = _top1(run, run_model, REANNOTATED)
        if acc is None:
            return Comparison(cell, run_model=run_model)
        low, high = _wilson(100 * acc.top1, acc.n)
        note = "" if acc.labels == "reimagenet" else f"reproduced on {acc.labels} labels (paper: ReImageNet)"
        return Comparison(cell, 100 * acc.top1, "", run_model, low, high, "wilson", note)
    dataset = run.dataset(cell)
    if dataset is None:
        return Comparison(cell, run_model=run_model)
    if cell.metric == "n":
        n = run.n_ood.get((run_model, dataset))
        return Comparison(cell, None if n is None else float(n), "", run_model)
    if cell.metric == "fraction":
        n = run.n_ood.get((run_model, dataset))
        if n is None:
            return Comparison(cell, run_model=run_model)
        if cell.table == "A6":
            return Comparison(cell, 100.0 * SUBSET_N / n, "", run_model)
        full = run.datasets.get(slug(cell.dataset))
        n_full = run.n_ood.get((run_model, full)) if full else None
        return Comparison(cell, None if not n_full else 100.0 * n / n_full, "", run_model)
    if cell.metric in DRAW_METRICS:
        summary = next(
            (s for s in run.subsample if (s.model, s.ood_dataset, s.n) == (run_model, dataset, SUBSET_N)), None
        )
        if summary is None:
            return Comparison(cell, run_model=run_model, note=f"no subsampling study at n={SUBSET_N}")
        raw = getattr(summary, DRAW_METRICS[cell.metric])
        return Comparison(cell, raw if cell.metric == "spearman" else 100.0 * raw, summary.detector, run_model)
    if cell.metric not in ("fpr95", "auroc"):
        return Comparison(cell, run_model=run_model)
    values = run.detectors(run_model, dataset, cell.metric)
    if cell.best:
        found = _best(values, cell.metric)
    else:
        found = (cell.detector, values[cell.detector]) if cell.detector in values else None
    if found is None:
        return Comparison(cell, run_model=run_model)
    detector, value = found
    n = run.n_ood[(run_model, dataset)]
    if cell.metric == "fpr95":
        low, high = _wilson(value, n)
        return Comparison(cell, value, detector, run_model, low, high, "wilson")
    paired = scores(run_model, run.id_of[run_model], dataset) if scores is not None else None
    if paired and detector in paired[0] and detector in paired[1]:
        interval = delong_interval(paired[0][detector], paired[1][detector])
        return Comparison(cell, value, detector, run_model, 100 * interval.low, 100 * interval.high, "delong")
    return Comparison(cell, value, detector, run_model, note="no per-image scores: no interval")


def _members(cell: PublishedCell, cells: Sequence[PublishedCell], name: str) -> list[PublishedCell] | None:
    """The cells a published mean averages (None when the cell is not a mean)."""
    models = published_models(name)
    if cell.model == MEAN_VLM:
        names = [m for m, info in models.items() if info.kind == "zeroshot"]
    elif cell.model == MEAN_SUPERVISED:
        names = [m for m, info in models.items() if info.table1_name and info.kind != "zeroshot"]
    else:
        names = None
    if cell.dataset == MEAN_OOD:
        datasets = list(
            dict.fromkeys(
                c.dataset
                for c in cells
                if (c.table, c.detector, c.metric, c.subset) == (cell.table, cell.detector, cell.metric, "")
                and c.dataset not in (FI, MEAN_OOD)
            )
        )
    else:
        datasets = None
    if names is None and datasets is None:
        return None
    return [
        PublishedCell(cell.table, m, "", d, cell.subset, cell.detector, cell.best, cell.metric, math.nan)
        for m in (names or [cell.model])
        for d in (datasets or [cell.dataset])
    ]


def compare_published(
    rows: Sequence[ResultRow],
    accuracy: Sequence[Accuracy] = (),
    *,
    scores: ScoreSource | None = None,
    name: str = "fi-imagenet-1k",
    tables: Sequence[str] | None = None,
    subsample: Sequence[Any] = (),
) -> list[Comparison]:
    """Every published cell (of `tables`, default all) beside the run's value where the run has it.

    `scores(model, id_dataset, ood_dataset)` returns the run's ({detector: ID scores}, {detector: OOD scores}) for
    DeLong intervals of AUROC cells, or None. A mean (over VLMs, models or OOD sets) is reproduced only when the run has
    every one of its parts; a Table A3 Δ only when it has both subsets. `subsample` (SubsampleSummary objects of the
    run, e.g. a report's Table A6) reproduces Table A6's draw columns at n = 655.
    """
    run = _Run(rows, accuracy, name, subsample)
    cells = [c for c in load_published(name) if tables is None or c.table in tables]
    result: list[Comparison] = []
    for cell in cells:
        if cell.metric.endswith("_delta"):
            base = cell.metric[: -len("_delta")]
            parts = [
                _single(PublishedCell(cell.table, cell.model, "", cell.dataset, s, "", True, base, math.nan), run, None)
                for s in ("clean", "full")
            ]
            if all(p.reproduced is not None for p in parts):
                result.append(Comparison(cell, parts[0].reproduced - parts[1].reproduced, run_model=parts[0].run_model))
            else:
                result.append(Comparison(cell))
            continue
        if cell.model == ALL_MODELS:
            result.append(_rank_correlation(cell, run))
            continue
        members = _members(cell, cells, name)
        if members is None:
            result.append(_single(cell, run, scores))
            continue
        parts = [_single(m, run, None) for m in members]
        if parts and all(p.reproduced is not None for p in parts):
            mean = float(np.mean([p.reproduced for p in parts]))
            result.append(Comparison(cell, mean, note=f"mean of {len(parts)} reproduced cells"))
        else:
            have = sum(p.reproduced is not None for p in parts)
            result.append(Comparison(cell, note=f"{have} of {len(parts)} parts reproduced" if have else ""))
    return result


def top1_fpr_points(
    rows: Sequence[ResultRow], accuracy: Sequence[Accuracy], name: str = "fi-imagenet-1k"
) -> list[tuple[str, float, float]]:
    """(model, re-annotated Top-1 %, best FPR@95 % on Fi-ImageNet-1k) of every supervised model the run has."""
    return _points(_Run(rows, accuracy, name), name)


def _points(run: _Run, name: str) -> list[tuple[str, float, float]]:
    points = []
    fi = run.datasets.get(slug(FI))
    for model, info in published_models(name).items():
        run_model = run.models.get(model)
        if run_model is None or info.kind == "zeroshot" or fi is None:
            continue
        acc = _top1(run, run_model, REANNOTATED)
        best = _best(run.detectors(run_model, fi, "fpr95"), "fpr95")
        if acc is not None and best is not None:
            points.append((model, 100 * acc.top1, best[1]))
    return points


def _rank_correlation(cell: PublishedCell, run: _Run) -> Comparison:
    from .subsample import rank_correlation

    points = _points(run, "fi-imagenet-1k")
    if len(points) < 3:
        return Comparison(cell, note=f"{len(points)} models with Top-1 and FPR@95; ρ needs 3 or more")
    rho = float(rank_correlation(np.array([[p[1] for p in points]]), np.array([p[2] for p in points]))[0])
    return Comparison(cell, rho, note=f"Spearman over {len(points)} models")
