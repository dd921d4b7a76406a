"""Per-OOD-class acceptance against a per-image loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench.analysis.breakdown import class_acceptance
from oodbench.analysis.intervals import wilson_interval
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError


def test_closed_form_case() -> None:
    ids = np.arange(100, dtype=float)  # threshold at TPR 95 %: the 6th lowest ID score, 5.0
    ood = np.array([10.0, 1.0, 7.0, 5.0, 0.0, 2.0])
    labels = np.array([0, 0, 1, 1, 2, 2])
    rows = class_acceptance(ids, ood, labels, ["cat", "dog", "eel"])
    assert [(r.name, r.n, r.accepted) for r in rows] == [("dog", 2, 2), ("cat", 2, 1), ("eel", 2, 0)]
    assert rows[0].rate == 1.0 and rows[2].low == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_matches_a_per_image_loop(n: int, classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = rng.normal(1, 1, 300)
    ood = rng.normal(0, 1, n).round(1)  # ties with the threshold are accepted, as in fpr_at_tpr
    labels = rng.integers(0, classes, n)
    threshold = metrics.threshold_at_tpr(ids, 0.95)
    rows = {r.label: r for r in class_acceptance(ids, ood, labels)}
    for label in np.unique(labels):
        members = [s for s, lab in zip(ood, labels, strict=True) if lab == label]
        accepted = sum(s >= threshold for s in members)
        row = rows[int(label)]
        assert (row.n, row.accepted) == (len(members), accepted)
        assert (row.low, row.high) == pytest.approx(wilson_interval(accepted, len(members)))
    # Summed over the classes, the acceptance is FPR@95 of the whole set.
    assert sum(r.accepted for r in rows.values()) / n == pytest.approx(metrics.fpr_at_tpr(ids, ood))


def test_bad_labels_are_one_clear_error() -> None:
    with pytest.raises(AnalysisError, match="one integer per OOD score"):
        class_acceptance([1.0, 2.0], [0.5], [0, 1])
    with pytest.raises(AnalysisError, match="no name"):
        class_acceptance([1.0, 2.0], [0.5], [3], ["a"])
