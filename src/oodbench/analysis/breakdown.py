"""Per-OOD-class acceptance (NINCO-style): which classes of a labelled OOD set pass the ID threshold.

When a number surprises, the first question is which OOD classes the detector accepts as ID. At the threshold that
accepts `tpr` of the ID scores, each class's acceptance count is a binomial proportion over its images; its Wilson
interval says how far a class's rate can be trusted at its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core import metrics
from ..core.errors import AnalysisError
from .intervals import wilson_interval

__all__ = ["ClassAcceptance", "class_acceptance"]


@dataclass(frozen=True)
class ClassAcceptance:
    """One OOD class: its images, how many the threshold accepts as ID, the rate and its Wilson interval."""

    label: int
    name: str
    n: int
    accepted: int
    rate: float
    low: float
    high: float


def class_acceptance(
    id_scores: object,
    ood_scores: object,
    ood_labels: object,
    class_names: Sequence[str] | None = None,
    *,
    tpr: float = 0.95,
    confidence: float = 0.95,
) -> list[ClassAcceptance]:
    """Acceptance per OOD class at the ID threshold of `tpr`, most accepted first (ties: larger class, then label)."""
    ood = metrics.as_scores("ood_scores", ood_scores)
    labels = np.asarray(ood_labels)
    if labels.shape != ood.shape or not np.issubdtype(labels.dtype, np.integer):
        raise AnalysisError(
            f"OOD labels must be one integer per OOD score; got {labels.dtype} {labels.shape} for {ood.shape[0]} scores"
        )
    if labels.size and labels.min() < 0:
        raise AnalysisError(f"OOD labels must be non-negative class indices; got {int(labels.min())}")
    if class_names is not None and labels.size and labels.max() >= len(class_names):
        raise AnalysisError(f"OOD label {int(labels.max())} has no name among {len(class_names)} class names")
    threshold = metrics.threshold_at_tpr(id_scores, tpr)
    present = np.unique(labels)
    totals = np.bincount(labels, minlength=int(present.max()) + 1 if present.size else 0)[present]
    accepted = np.bincount(labels, weights=ood >= threshold, minlength=totals.size and int(present.max()) + 1)
    accepted = accepted[present].astype(np.int64)
    low, high = wilson_interval(accepted, totals, confidence)
    rows = [
        ClassAcceptance(
            int(label),
            class_names[label] if class_names is not None else f"class {label}",
            int(n),
            int(k),
            k / n,
            float(lo),
            float(hi),
        )
        for label, n, k, lo, hi in zip(present, totals, accepted, np.atleast_1d(low), np.atleast_1d(high), strict=True)
    ]
    return sorted(rows, key=lambda r: (-r.rate, -r.n, r.label))
