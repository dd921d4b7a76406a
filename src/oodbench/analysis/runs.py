"""Statistics over a whole evaluation run: confidence intervals per (detector, OOD set) and paired comparisons."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..core.errors import AnalysisError
from ..core.metrics import check_convention
from ..util.progress import progress_bar
from .delong import DeLongResult, delong_interval, delong_test
from .intervals import Interval, bootstrap_many, fpr_interval
from .rundata import RunData

__all__ = [
    "IntervalRecord",
    "IntervalRequest",
    "INTERVAL_METHODS",
    "interval_record",
    "interval_records",
    "intervals_for_run",
    "compare_in_run",
    "best_detectors",
]

INTERVAL_METHODS = ("wilson", "clopper-pearson", "delong", "percentile", "bca")


@dataclass(frozen=True)
class IntervalRecord:
    """Intervals of one detector on one (model, ID, OOD): keys like 'fpr95/wilson', 'auroc/bca'."""

    model: str
    id_dataset: str
    ood_dataset: str
    detector: str
    n_id: int
    n_ood: int
    intervals: dict[str, Interval]

    def as_dict(self) -> dict[str, object]:
        """Plain dict (for JSON)."""
        return {
            **{k: v for k, v in self.__dict__.items() if k != "intervals"},
            "intervals": {k: v.as_dict() for k, v in self.intervals.items()},
        }


def best_detectors(
    run: RunData, model: str, id_dataset: str, ood_dataset: str, metric: str = "fpr95", count: int = 1
) -> list[str]:
    """The `count` best detectors of (model, ID, OOD) by the run's rows: lowest FPR@95 or highest AUROC.

    Ties are broken by the other of the two metrics, then by the run's order (as the tables and Table A6 do).
    """
    if metric not in ("fpr95", "auroc"):
        raise AnalysisError(f"rank detectors by fpr95 or auroc; got {metric!r}")
    other = "auroc" if metric == "fpr95" else "fpr95"
    values: dict[str, dict[str, float]] = {}
    for r in run.rows:
        if (r.model, r.id_dataset, r.ood_dataset) == (model, id_dataset, ood_dataset) and r.metric in (metric, other):
            values.setdefault(r.detector, {})[r.metric] = r.value
    order = [d for d in values if metric in values[d]]
    sign = 1.0 if metric == "fpr95" else -1.0
    missing = float("-inf") if metric == "auroc" else float("inf")
    return sorted(
        order, key=lambda d: (sign * values[d][metric], -sign * values[d].get(other, -missing), order.index(d))
    )[:count]


@dataclass(frozen=True)
class IntervalRequest:
    """One pair of score arrays to put intervals on, with the names its record carries."""

    model: str
    id_dataset: str
    ood_dataset: str
    detector: str
    id_scores: object
    ood_scores: object


def interval_records(
    requests: Sequence[IntervalRequest],
    *,
    methods: Sequence[str] = INTERVAL_METHODS,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    tpr: float = 0.95,
    advance: Callable[[float], None] | None = None,
) -> list[IntervalRecord]:
    """Intervals of many detectors' FPR@95 and AUROC, each as `interval_record` gives it alone.

    The bootstrap runs once over all requests, so requests that share an ID or OOD set size share its draws.
    `advance(share)` reports progress in requests.
    """
    unknown = sorted(set(methods) - set(INTERVAL_METHODS))
    if unknown:
        raise AnalysisError(f"unknown interval methods {unknown}; available: {', '.join(INTERVAL_METHODS)}")
    boot_methods = [m for m in ("percentile", "bca") if m in methods]
    pairs = [(r.id_scores, r.ood_scores) for r in requests]
    boots = (
        bootstrap_many(pairs, resamples=resamples, confidence=confidence, seed=seed, tpr=tpr, advance=advance)
        if boot_methods
        else [None] * len(requests)
    )
    records = []
    for request, boot in zip(requests, boots, strict=True):
        found: dict[str, Interval] = {}
        for method in ("wilson", "clopper-pearson"):
            if method in methods:
                found[f"fpr95/{method}"] = fpr_interval(
                    request.id_scores, request.ood_scores, tpr=tpr, confidence=confidence, method=method
                )
        for method in boot_methods:
            found[f"fpr95/{method}"] = getattr(boot["fpr95"], method)
        if "delong" in methods:
            found["auroc/delong"] = delong_interval(request.id_scores, request.ood_scores, confidence)
        for method in boot_methods:
            found[f"auroc/{method}"] = getattr(boot["auroc"], method)
        records.append(
            IntervalRecord(
                request.model,
                request.id_dataset,
                request.ood_dataset,
                request.detector,
                int(np.asarray(request.id_scores).shape[0]),
                int(np.asarray(request.ood_scores).shape[0]),
                found,
            )
        )
        if advance is not None and not boot_methods:
            advance(1.0)
    return records


def interval_record(
    model: str,
    id_dataset: str,
    ood_dataset: str,
    detector: str,
    id_scores: object,
    ood_scores: object,
    *,
    methods: Sequence[str] = INTERVAL_METHODS,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    tpr: float = 0.95,
) -> IntervalRecord:
    """Intervals of one detector's FPR@95 and AUROC on one (ID, OOD) pair of score arrays."""
    request = IntervalRequest(model, id_dataset, ood_dataset, detector, id_scores, ood_scores)
    return interval_records([request], methods=methods, resamples=resamples, confidence=confidence, seed=seed, tpr=tpr)[
        0
    ]


def intervals_for_run(
    run: RunData,
    *,
    detectors: Sequence[str] | None = None,
    ood_datasets: Sequence[str] | None = None,
    methods: Sequence[str] = INTERVAL_METHODS,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    tpr: float = 0.95,
    progress: bool = True,
    convention: str = "oodbench",
) -> list[IntervalRecord]:
    """Intervals of every (detector, OOD set) of a run (or of the given detectors and sets).

    With ``convention="openood"`` FPR@95 is OOD-positive: the intervals are those of the swapped problem (OOD
    scores negated as the accepted class, ID scores negated as the rejected one), since OOD-positive FPR@95 is
    exactly ID-positive FPR@95 of that problem and AUROC is the same number in both (tests/core/test_metrics_openood.py).
    """
    swap = check_convention(convention) == "openood"
    requests = []
    for model, id_dataset, ood in run.ood_plans(ood_datasets):
        id_scores, ood_scores = run.paired_scores(model, id_dataset, ood, detectors=detectors)
        for name in id_scores:
            first, second = id_scores[name], ood_scores[name]
            if swap:
                first, second = -np.asarray(second, dtype=np.float64), -np.asarray(first, dtype=np.float64)
            requests.append(IntervalRequest(model, id_dataset, ood, name, first, second))
    with progress_bar(progress) as bar:
        task = bar.add_task("intervals", total=len(requests))
        records = interval_records(
            requests,
            methods=methods,
            resamples=resamples,
            confidence=confidence,
            seed=seed,
            tpr=tpr,
            advance=lambda share: bar.advance(task, share),
        )
    if swap:
        records = [replace(r, n_id=r.n_ood, n_ood=r.n_id) for r in records]
    return records


def compare_in_run(
    run: RunData,
    detector_a: str,
    detector_b: str,
    *,
    ood_datasets: Sequence[str] | None = None,
    confidence: float = 0.95,
) -> list[tuple[str, str, DeLongResult]]:
    """DeLong's paired test of two detectors on every (model, OOD set) of a run: (model, OOD set, result)."""
    if detector_a == detector_b:
        raise AnalysisError("compare two different detectors (--a and --b are the same)")
    results = []
    for model, id_dataset, ood in run.ood_plans(ood_datasets):
        id_scores, ood_scores = run.paired_scores(model, id_dataset, ood, detectors=[detector_a, detector_b])
        results.append(
            (
                model,
                ood,
                delong_test(
                    id_scores[detector_a],
                    ood_scores[detector_a],
                    id_scores[detector_b],
                    ood_scores[detector_b],
                    confidence=confidence,
                    names=(detector_a, detector_b),
                ),
            )
        )
    return results
