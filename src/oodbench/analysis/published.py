"""The Fi-ImageNet-1k paper's published numbers (package data) and their comparison with a reproduction.

`load_published` reads the tidy table files of ``oodbench/data/published`` (see its README), `published_models` the
Table A8 model list with the name mapping of Tables 1, A1 and A2, and `compare_published` puts each published cell
beside the value a run reproduces: the same detector, or the run's best detector of the paper's pool where the paper
reports the best of its pool (`POST_HOC_POOL`, `VLM_POOL`), each statistic computed as the paper computes it (Appendix E's ρ over its 26 models, Table A6's closed form
with the correction the caption states). Every comparison gets one of three verdicts (`Comparison.verdict`):

* ``reproduced``: the published value lies within the printed rounding of the reproduced one (half a unit of the
  last printed digit, `NUMERICAL_TOLERANCE` added); a cell the paper derives from other printed numbers (a mean,
  a Δ, the closed-form SE, ρ) also allows what rounding its inputs to their printed digits can change (`span`);
* ``within sampling error``: not reproduced, but inside the reproduced value's 95% interval (Wilson on the OOD
  acceptance count for FPR@95 and on the correct count for Top-1, DeLong for AUROC with per-image scores; a
  best-of-pool cell takes the Bonferroni bound over the pool, a mean or Δ the Bonferroni bound over its parts,
  Table A6's draw statistics their Monte Carlo error);
* ``differs``: neither.

Published values are in % (as printed); so are the reproduced values of a `Comparison`.
"""

from __future__ import annotations

import csv
import itertools
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
from scipy import stats

from ..core.errors import AnalysisError
from ..core.papers import POST_HOC_POOL
from ..core.results import ResultRow
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
    "VERDICTS",
    "REPRODUCED",
    "WITHIN",
    "DIFFERS",
    "NOT_IN_RUN",
    "NUMERICAL_TOLERANCE",
    "APPENDIX_E_EXCLUDED",
    "POST_HOC_POOL",
    "VLM_POOL",
    "appendix_e_models",
    "spearman_span",
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
CONFIDENCE = 0.95
VERDICTS = ("reproduced", "within sampling error", "differs", "not in the run")
REPRODUCED, WITHIN, DIFFERS, NOT_IN_RUN = VERDICTS
# Added to the printed rounding: covers the float64 arithmetic and the decimal text of rates k/n and their means
# (errors below 1e-12 points), and is far below the smallest real step of a rate (100/48,365 ≈ 0.002 points).
NUMERICAL_TOLERANCE = 1e-6
# Appendix E's ρ = −0.61 is over "the 26 models": Table A7 without these four, whose pre-training is none of the
# regimes Appendix E compares (two SSL probes, FCMAE and MIM); the regime means it prints (79.0, 75.4, 73.7) are over
# the other 26.
APPENDIX_E_EXCLUDED = ("DINOv2-g/14", "DINOv3-7B", "ConvNeXtV2-L", "EVA02-L-448")
# The paper's 21 post-hoc detectors (Sec. 4.1, Table 1's caption): `core.papers.POST_HOC_POOL`, where the
# detector selection `-d paper` reads them too.
VLM_POOL = frozenset(("mcm", "maxlogit", "energy", "gen", "entropy", "margin", "glmcm"))
GENERATION = re.compile(r"^(?P<base>.+)\.g(?P<index>[1-9][0-9]*)\Z")  # a vocabulary's generation: <vocab>.g<k>
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
    digits: int = 1  # decimals as printed

    @property
    def printed(self) -> str:
        """The model name as the table prints it."""
        return self.printed_model or self.model

    @property
    def half_unit(self) -> float:
        """Half a unit of the last printed digit: how far the printed value may lie from the paper's own."""
        return 0.5 * 10.0 ** (-self.digits)


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
                    _decimals(row["value"]),
                )
            )
    return tuple(cells)


def _decimals(text: str) -> int:
    """Decimals of a number as printed ("18.00" → 2, "10000" → 0)."""
    text = text.strip()
    return len(text.split(".", 1)[1]) if "." in text else 0


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
    low: float | None = None  # 95% interval of the reproduced value
    high: float | None = None
    method: str = ""  # how the interval was taken ("wilson", "delong", "… best of 21 (Bonferroni)", …), "" if none
    note: str = ""
    # A derived cell (mean, Δ, closed-form SE, ρ): the values it takes when its inputs move within their printed
    # rounding; None for a cell the run measures directly.
    span: tuple[float, float] | None = None
    aside: tuple[tuple[str, float], ...] = ()  # labelled values shown beside this one, e.g. ρ over all models

    @property
    def delta(self) -> float | None:
        """Reproduced minus published."""
        return None if self.reproduced is None else self.reproduced - self.cell.value

    @property
    def tolerance(self) -> tuple[float, float] | None:
        """The published values that count as reproduced: the span widened by the printed rounding."""
        if self.reproduced is None:
            return None
        low, high = self.span if self.span is not None else (self.reproduced, self.reproduced)
        slack = self.cell.half_unit + NUMERICAL_TOLERANCE
        return low - slack, high + slack

    @property
    def verdict(self) -> str:
        """One of `VERDICTS`: reproduced, within sampling error, differs, or not in the run."""
        bounds = self.tolerance
        if bounds is None:
            return NOT_IN_RUN
        value = self.cell.value
        if bounds[0] <= value <= bounds[1]:
            return REPRODUCED
        if self.low is not None and self.high is not None and self.low <= value <= self.high:
            return WITHIN
        return DIFFERS


ScoreSource = Callable[[str, str, str], tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None]


class _Run:
    """The reproduction indexed for lookups: values per (model, dataset, detector, metric) in %."""

    def __init__(
        self, rows: Sequence[ResultRow], accuracy: Sequence[Accuracy], name: str, subsample: Sequence[Any] = ()
    ) -> None:
        self.name = name
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
        kinds = {model: info.kind for model, info in published_models(name).items()}
        self.pools = {
            run_model: VLM_POOL if kinds[model] == "zeroshot" else POST_HOC_POOL
            for model, run_model in self.models.items()
        }

    def dataset(self, cell: PublishedCell) -> str | None:
        key = slug(cell.dataset) + ("-clean" if cell.subset == "clean" else "")
        return self.datasets.get(key)

    def detectors(self, model: str, dataset: str, metric: str) -> dict[str, float]:
        return {d: v for (m, o, d, k), v in self.values.items() if (m, o, k) == (model, dataset, metric)}

    def pool(self, model: str, dataset: str, metric: str) -> dict[str, float]:
        """The values of the paper's best-of pool for this run model: `POST_HOC_POOL` or, for a VLM, `VLM_POOL`."""
        members = self.pools.get(model, POST_HOC_POOL)
        return {d: v for d, v in self.detectors(model, dataset, metric).items() if d in members}


def _best(pool: Mapping[str, float], metric: str) -> tuple[str, float] | None:
    """The best detector of a pool (`_Run.pool`)."""
    if not pool:
        return None
    pick = min if metric == "fpr95" else max
    detector = pick(pool, key=lambda d: pool[d])
    return detector, pool[detector]


def _wilson(percent: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    # The run stores a rate k/n; k is recovered exactly (|100·k/n − value| ≪ 0.5·100/n).
    k = int(round(percent * n / 100.0))
    low, high = wilson_interval(k, n, confidence)
    return 100.0 * float(low), 100.0 * float(high)


def _top1(run: _Run, model: str, prefer: Sequence[str]) -> Accuracy | None:
    rows = [a for a in run.accuracy if a.model == model]
    for labels in prefer:
        for row in rows:
            if row.labels == labels:
                return row
    return None


REANNOTATED = ("reimagenet", "real")  # the paper's Top-1 is on ReImageNet; ReaL stands in while that is unreleased


def _best_interval(
    cell: PublishedCell,
    run: _Run,
    run_model: str,
    dataset: str,
    pool: Mapping[str, float],
    scores: ScoreSource | None,
    confidence: float,
) -> tuple[float, float, str] | None:
    """A 95% interval for the best of the pool that accounts for choosing it (a Bonferroni bound over the pool).

    When every one of the D detectors' intervals at level 1 − α/D holds (probability ≥ 1 − α), the pool's true minimum
    lies between the minimum of the lower and the minimum of the upper bounds (FPR@95; the maxima for AUROC).
    """
    level = 1 - (1 - confidence) / len(pool)
    if cell.metric == "fpr95":
        n = run.n_ood[(run_model, dataset)]
        bounds = [_wilson(v, n, level) for v in pool.values()]
        method = "wilson"
        lows, highs = [b[0] for b in bounds], [b[1] for b in bounds]
        return min(lows), min(highs), f"{method}, best of {len(pool)} (Bonferroni)"
    paired = scores(run_model, run.id_of[run_model], dataset) if scores is not None else None
    if not paired or any(d not in paired[0] or d not in paired[1] for d in pool):
        return None
    intervals = [delong_interval(paired[0][d], paired[1][d], level) for d in pool]
    lows, highs = [100 * i.low for i in intervals], [100 * i.high for i in intervals]
    return max(lows), max(highs), f"delong, best of {len(pool)} (Bonferroni)"


def _single(cell: PublishedCell, run: _Run, scores: ScoreSource | None, confidence: float = CONFIDENCE) -> Comparison:
    """A cell of one concrete model and dataset; its interval at `confidence`."""
    run_model = run.models.get(cell.model)
    if run_model is None:
        return Comparison(cell)
    if cell.metric == "top1":
        acc = _top1(run, run_model, REANNOTATED)
        if acc is None:
            return Comparison(cell, run_model=run_model)
        low, high = _wilson(100 * acc.top1, acc.n, confidence)
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
    if cell.metric == "closed_form_se":
        return _closed_form(cell, run, run_model, dataset)
    if cell.metric in DRAW_METRICS:
        return _draws(cell, run, run_model, dataset, confidence)
    if cell.metric not in ("fpr95", "auroc"):
        return Comparison(cell, run_model=run_model)
    values = run.detectors(run_model, dataset, cell.metric)
    pool = run.pool(run_model, dataset, cell.metric) if cell.best else {}
    if cell.best:
        found = _best(pool, cell.metric)
    else:
        found = (cell.detector, values[cell.detector]) if cell.detector in values else None
    if found is None:
        return Comparison(cell, run_model=run_model)
    detector, value = found
    if cell.best and len(pool) > 1:
        bound = _best_interval(cell, run, run_model, dataset, pool, scores, confidence)
        if bound is None:
            return Comparison(cell, value, detector, run_model, note="no per-image scores: no interval")
        return Comparison(cell, value, detector, run_model, bound[0], bound[1], bound[2])
    n = run.n_ood[(run_model, dataset)]
    if cell.metric == "fpr95":
        low, high = _wilson(value, n, confidence)
        return Comparison(cell, value, detector, run_model, low, high, "wilson")
    paired = scores(run_model, run.id_of[run_model], dataset) if scores is not None else None
    if paired and detector in paired[0] and detector in paired[1]:
        interval = delong_interval(paired[0][detector], paired[1][detector], confidence)
        return Comparison(cell, value, detector, run_model, 100 * interval.low, 100 * interval.high, "delong")
    return Comparison(cell, value, detector, run_model, note="no per-image scores: no interval")


def _se(percent: float, n: int, n_total: int) -> float:
    """Table A6's closed form in points: Eq. 5, times the finite-population correction when n < N (the caption)."""
    p = percent / 100.0
    plain = math.sqrt(max(p * (1 - p), 0.0) / n)
    return 100.0 * (plain if n_total <= n else plain * math.sqrt((n_total - n) / (n_total - 1)))


def _closed_form(cell: PublishedCell, run: _Run, run_model: str, dataset: str) -> Comparison:
    """Table A6's closed-form SE from the best detector's full FPR@95 and N, as the caption computes it.

    For the sub-sampled sets (n = 655 < N) the caption multiplies Eq. 5 by √((N−n)/(N−1)). For Fi-ImageNet-1k (n = N)
    it prints the plug-in Eq. 5 without the correction, which would be 0 there; the corrected value is stated aside.
    """
    best = _best(run.pool(run_model, dataset, "fpr95"), "fpr95")
    n_total = run.n_ood.get((run_model, dataset))
    if best is None or n_total is None:
        return Comparison(cell, run_model=run_model)
    if n_total < SUBSET_N:
        return Comparison(cell, run_model=run_model, note=f"{n_total} OOD images: fewer than the n = {SUBSET_N} drawn")
    detector, full = best
    value = _se(full, SUBSET_N, n_total)
    # The paper's SE comes from its unrounded full FPR@95, known here only to the decimals the table prints.
    half = 0.5 * 10.0 ** (-_full_digits(cell, run.name))
    ends = [_se(min(max(full + d, 0.0), 100.0), SUBSET_N, n_total) for d in (-half, half)]
    if full - half < 50.0 < full + half:  # the SE peaks at p = 0.5
        ends.append(_se(50.0, SUBSET_N, n_total))
    aside: tuple[tuple[str, float], ...] = ()
    note = f"√(p(1−p)/n)·√((N−n)/(N−1)) with n = {SUBSET_N}, N = {n_total:,}"
    if n_total <= SUBSET_N:
        aside = (("with the finite-population correction √((N−n)/(N−1)), 0 at n = N", 0.0),)
        note = f"plug-in √(p(1−p)/n), n = {SUBSET_N}, without the finite-population correction, as printed"
    return Comparison(cell, value, detector, run_model, note=note, span=(min(ends), max(ends)), aside=aside)


def _full_digits(cell: PublishedCell, name: str) -> int:
    """Decimals of the published full FPR@95 of `cell`'s row in Table A6 (2, but 1 for Fi-ImageNet-1k)."""
    for other in _load(name):
        if (other.table, other.model, other.dataset, other.metric) == (cell.table, cell.model, cell.dataset, "fpr95"):
            return other.digits
    return cell.digits


def _draws(cell: PublishedCell, run: _Run, run_model: str, dataset: str, confidence: float) -> Comparison:
    """Table A6's draw statistics from the run's subsampling study at n = 655, with their Monte Carlo error."""
    summary = next((s for s in run.subsample if (s.model, s.ood_dataset, s.n) == (run_model, dataset, SUBSET_N)), None)
    if summary is None:
        return Comparison(cell, run_model=run_model, note=f"no subsampling study at n={SUBSET_N}")
    raw = getattr(summary, DRAW_METRICS[cell.metric])
    value = raw if cell.metric == "spearman" else 100.0 * raw
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    draws, std = int(summary.draws), 100.0 * float(summary.std)
    if cell.metric in ("draw_mean", "draw_bias") and draws > 1:
        # The mean of R draws has the Monte Carlo standard error std/√R (full is fixed, so the bias shares it).
        half = z * std / math.sqrt(draws)
        return Comparison(
            cell, value, summary.detector, run_model, value - half, value + half, f"monte carlo, R={draws}"
        )
    if cell.metric == "draw_std" and draws > 2:
        # Normal-theory standard error of a sample standard deviation: std/√(2(R−1)).
        half = z * std / math.sqrt(2 * (draws - 1))
        return Comparison(
            cell, value, summary.detector, run_model, value - half, value + half, f"monte carlo, R={draws}"
        )
    return Comparison(cell, value, summary.detector, run_model)


def _members(cell: PublishedCell, cells: Sequence[PublishedCell], name: str) -> tuple[list[PublishedCell], bool] | None:
    """The cells a published mean averages and whether the paper prints them (None when the cell is not a mean)."""
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
    members = [
        PublishedCell(cell.table, m, "", d, cell.subset, cell.detector, cell.best, cell.metric, math.nan, cell.digits)
        for m in (names or [cell.model])
        for d in (datasets or [cell.dataset])
    ]
    # A mean of printed parts (Table 2's VLMs, Table A2's models and OOD sets) was computed from values a
    # reproduction knows only to their printed digits; Tables A4 and A5 mostly print only the means over the VLMs.
    known = _printed_keys(name)
    printed = all(_key(m) in known for m in members) or cell.dataset == MEAN_OOD
    return members, printed


def _key(cell: PublishedCell) -> tuple[str, str, str, str, str]:
    """What a cell measures, whichever table prints it (a best-of cell whatever detector it names)."""
    return (cell.model, cell.dataset, cell.subset, cell.metric, "" if cell.best else cell.detector)


@cache
def _printed_keys(name: str) -> frozenset[tuple[str, str, str, str, str]]:
    return frozenset(_key(c) for c in _load(name))


def _combine(cell: PublishedCell, parts: Sequence[Comparison], printed: bool, note: str) -> Comparison:
    """The mean of reproduced parts, with the Bonferroni bound of their intervals (each taken at 1 − α/k)."""
    values = [p.reproduced for p in parts]
    mean = float(np.mean(values))
    half = cell.half_unit if printed else 0.0  # the parts' printed rounding, averaged
    low = high = None
    method = ""
    if all(p.low is not None and p.high is not None for p in parts):
        low = float(np.mean([p.low for p in parts]))
        high = float(np.mean([p.high for p in parts]))
        method = f"mean of {len(parts)} intervals at {1 - (1 - CONFIDENCE) / len(parts):.4g} (Bonferroni)"
    return Comparison(
        cell,
        mean,
        "",
        owners.pop() if len(owners := {p.run_model for p in parts}) == 1 else "",
        low,
        high,
        method,
        note,
        span=(mean - half, mean + half),
    )


def _generations(cell: PublishedCell, run: _Run) -> Comparison | None:
    """Table A4's cells from a run whose vocabulary has generations ``<vocab>.g1``, ``<vocab>.g2``, … (None if not).

    The mean over the VLMs and generations, and its ``fpr95_std`` companion: the standard deviation (ddof = 1) over the
    generations of the mean over the VLMs, as the caption defines it.
    """
    score, _, vocab = cell.detector.partition("@")
    if cell.table != "A4" or cell.model != MEAN_VLM or not vocab:
        return None
    vlms = [m for m, info in published_models(run.name).items() if info.kind == "zeroshot"]
    per_generation: dict[int, list[float]] = {}
    for vlm in vlms:
        run_model = run.models.get(vlm)
        dataset = run.dataset(cell)
        if run_model is None or dataset is None:
            return None
        found = {}
        for detector, value in run.detectors(run_model, dataset, "fpr95").items():
            head, _, name = detector.partition("@")
            match = GENERATION.match(name)
            if head == score and match and match["base"] == vocab:
                found[int(match["index"])] = value
        for index, value in found.items():
            per_generation.setdefault(index, []).append(value)
    complete = {g: v for g, v in per_generation.items() if len(v) == len(vlms)}
    if not complete:
        return None
    means = np.array([np.mean(v) for v in complete.values()])
    note = f"over {len(vlms)} VLMs and {len(complete)} generations"
    if cell.metric == "fpr95_std":
        if len(means) < 2:
            return Comparison(cell, note=f"{len(means)} generation: a standard deviation needs two")
        return Comparison(cell, float(np.std(means, ddof=1)), note=note)
    return Comparison(cell, float(means.mean()), note=note)


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
    run, e.g. a report's Table A6) reproduces Table A6's draw columns at n = 655. Table A4's cells read the generations
    of a vocabulary (``<vocab>.g<k>``) when the run has them.
    """
    run = _Run(rows, accuracy, name, subsample)
    cells = [c for c in load_published(name) if tables is None or c.table in tables]
    result: list[Comparison] = []
    for cell in cells:
        generations = _generations(cell, run)
        if generations is not None:
            result.append(generations)
            continue
        if cell.metric.endswith("_delta"):
            result.append(_delta(cell, run))
            continue
        if cell.model == ALL_MODELS:
            result.append(_rank_correlation(cell, run))
            continue
        found = _members(cell, cells, name)
        if found is None:
            result.append(_single(cell, run, scores))
            continue
        members, printed = found
        level = 1 - (1 - CONFIDENCE) / len(members)
        parts = [_single(m, run, None, level) for m in members]
        if parts and all(p.reproduced is not None for p in parts):
            result.append(_combine(cell, parts, printed, f"mean of {len(parts)} reproduced cells"))
        else:
            have = sum(p.reproduced is not None for p in parts)
            result.append(Comparison(cell, note=f"{have} of {len(parts)} parts reproduced" if have else ""))
    return result


def _delta(cell: PublishedCell, run: _Run) -> Comparison:
    """Table A3's clean − full, with the Bonferroni bound of the two parts' intervals (each at 1 − α/2)."""
    base = cell.metric[: -len("_delta")]
    level = 1 - (1 - CONFIDENCE) / 2
    clean, full = (
        _single(
            PublishedCell(cell.table, cell.model, "", cell.dataset, s, "", True, base, math.nan, cell.digits),
            run,
            None,
            level,
        )
        for s in ("clean", "full")
    )
    if clean.reproduced is None or full.reproduced is None:
        return Comparison(cell)
    value = clean.reproduced - full.reproduced
    half = 2 * cell.half_unit  # both parts are printed, each to the Δ's digits
    low = high = None
    if None not in (clean.low, clean.high, full.low, full.high):
        low, high = clean.low - full.high, clean.high - full.low  # type: ignore[operator]
    method = "difference of two intervals at 0.975 (Bonferroni)" if low is not None else ""
    return Comparison(cell, value, "", clean.run_model, low, high, method, span=(value - half, value + half))


def appendix_e_models(name: str = "fi-imagenet-1k") -> list[str]:
    """The 26 models over which Appendix E reports ρ = −0.61: Table A7 without `APPENDIX_E_EXCLUDED`."""
    models = published_models(name)
    return [m for m, info in models.items() if info.kind != "zeroshot" and m not in APPENDIX_E_EXCLUDED]


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
        best = _best(run.pool(run_model, fi, "fpr95"), "fpr95")
        if acc is not None and best is not None:
            points.append((model, 100 * acc.top1, best[1]))
    return points


# Tie orderings enumerated exactly (per side, and pairs of both sides); beyond, an analytic bound. The limits keep the
# rankings under ~50 MB and the pairs' products to a few seconds.
SPAN_ORDERINGS = 200_000
SPAN_PAIRS = 10_000_000


def spearman_span(x: Sequence[float], y: Sequence[float], digits: int = 1) -> tuple[float, float]:
    """The range of Spearman's ρ over every ordering of values that are equal at `digits` decimals.

    Values known only to their printed digits may be ordered any way within a group of equal printed values (and only
    there: intervals of distinct printed values do not overlap), so ρ computed from the unrounded values lies in this
    range. Exact by enumeration up to `SPAN_ORDERINGS` orderings per side and `SPAN_PAIRS` pairs, else a bound (see
    `_spearman_bound`).
    """
    rx, ry = np.round(np.asarray(x, float), digits), np.round(np.asarray(y, float), digits)
    n = rx.shape[0]
    if n < 3:
        raise AnalysisError(f"Spearman's ρ needs 3 or more models; got {n}")
    groups_x, groups_y = _tie_groups(rx), _tie_groups(ry)
    count_x = math.prod(math.factorial(len(g)) for g in groups_x)
    count_y = math.prod(math.factorial(len(g)) for g in groups_y)
    if count_x > SPAN_ORDERINGS or count_y > SPAN_ORDERINGS or count_x * count_y > SPAN_PAIRS:
        return _spearman_bound(rx, ry, groups_x, groups_y)
    ranks_x = _orderings(groups_x, n) - (n + 1) / 2
    ranks_y = _orderings(groups_y, n) - (n + 1) / 2
    scale = n * (n * n - 1) / 12.0  # Σ(rank − mean)² of a tie-free ranking
    low, high = math.inf, -math.inf
    step = max(1, 4_000_000 // max(1, ranks_y.shape[0]))
    for start in range(0, ranks_x.shape[0], step):
        block = ranks_x[start : start + step] @ ranks_y.T / scale
        low, high = min(low, float(block.min())), max(high, float(block.max()))
    return low, high


def _tie_groups(values: np.ndarray) -> list[np.ndarray]:
    """Indices of each group of equal values, in ascending order of the value."""
    return [np.flatnonzero(values == v) for v in np.unique(values)]


def _orderings(groups: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Every tie-free ranking (1 … n) consistent with the groups' order, one per row."""
    choices = []
    start = 1
    for group in groups:
        ranks = start + np.array(list(itertools.permutations(range(len(group)))), dtype=float)
        choices.append((group, ranks))
        start += len(group)
    rows = math.prod(r.shape[0] for _, r in choices)
    out = np.empty((rows, n))
    repeat = rows
    tile = 1
    for group, ranks in choices:
        repeat //= ranks.shape[0]
        out[:, group] = np.tile(np.repeat(ranks, repeat, axis=0), (tile, 1))
        tile *= ranks.shape[0]
    return out


def _spearman_bound(
    x: np.ndarray, y: np.ndarray, groups_x: Sequence[np.ndarray], groups_y: Sequence[np.ndarray]
) -> tuple[float, float]:
    """A bound on ρ over tie orderings: each rank moves at most (g − 1)/2 from its group's average rank.

    With a = average rank − (n+1)/2 and e the move (|e| ≤ (g−1)/2), ρ·n(n²−1)/12 = Σ(a_x + e_x)(a_y + e_y) lies within
    Σ a_x a_y ± Σ(|e_x||a_y| + |a_x||e_y| + |e_x||e_y|).
    """
    n = x.shape[0]

    def average(groups: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        centre, move = np.empty(n), np.empty(n)
        start = 1
        for group in groups:
            centre[group] = start + (len(group) - 1) / 2 - (n + 1) / 2
            move[group] = (len(group) - 1) / 2
            start += len(group)
        return centre, move

    ax, ex = average(groups_x)
    ay, ey = average(groups_y)
    scale = n * (n * n - 1) / 12.0
    middle = float(ax @ ay)
    slack = float(ex @ np.abs(ay) + np.abs(ax) @ ey + ex @ ey)
    return max(-1.0, (middle - slack) / scale), min(1.0, (middle + slack) / scale)


def _spearman(points: Sequence[tuple[str, float, float]]) -> float:
    from .subsample import rank_correlation

    return float(rank_correlation(np.array([[p[1] for p in points]]), np.array([p[2] for p in points]))[0])


def _rank_correlation(cell: PublishedCell, run: _Run) -> Comparison:
    """Appendix E's ρ over its 26 models, with ρ over every supervised model of the run stated aside."""
    points = _points(run, run.name)
    subset = set(appendix_e_models(run.name))
    paper = [p for p in points if p[0] in subset]
    aside = ((f"over all {len(points)} supervised models of the run", _spearman(points)),) if len(points) >= 3 else ()
    if len(paper) < len(subset):
        missing = len(subset) - len(paper)
        partial = (
            ((f"over the {len(paper)} of Appendix E's models the run has", _spearman(paper)),)
            if len(paper) >= 3
            else ()
        )
        return Comparison(
            cell,
            note=f"the run lacks {missing} of Appendix E's {len(subset)} models (Top-1 and FPR@95 on {FI})",
            aside=partial + aside,
        )
    rho = _spearman(paper)
    span = spearman_span([p[1] for p in paper], [p[2] for p in paper], 1)
    note = f"Spearman over Appendix E's {len(paper)} models (Table A7 without {', '.join(APPENDIX_E_EXCLUDED)})"
    return Comparison(cell, rho, note=note, span=(min(span[0], rho), max(span[1], rho)), aside=aside)
