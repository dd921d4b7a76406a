"""Spread versus sampling noise on hand-made summaries; ROC points against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from oodbench.analysis.roc import roc_curve
from oodbench.analysis.spread import spread_vs_noise
from oodbench.analysis.subsample import SubsampleSummary
from oodbench.core.errors import AnalysisError


def _summary(ood: str, full: float, std: float, model: str = "m", n: int = 100) -> SubsampleSummary:
    return SubsampleSummary(model, "id", ood, "knn", n, 1000, 50, full, full, 0.0, std, std * 1.01, 0.9, 50)


def test_spread_is_std_across_datasets_over_mean_sampling_std() -> None:
    summaries = [
        _summary("a", 0.10, 0.02),
        _summary("b", 0.30, 0.04),
        _summary("c", 0.50, 0.03),
        _summary("x", 0.2, 0.01, model="other"),
    ]
    (result,) = spread_vs_noise(summaries)  # "other" has a single OOD set: no spread to speak of
    assert result.model == "m" and result.datasets == ("a", "b", "c")
    assert result.spread == pytest.approx(0.2)  # std of 0.1, 0.3, 0.5 with ddof=1
    assert result.range == pytest.approx(0.4)
    assert result.sampling_std == pytest.approx(0.03)
    assert result.ratio == pytest.approx(0.2 / 0.03)
    assert result.sampling_se == pytest.approx(0.0303)


def test_spread_refuses_mixed_subset_sizes() -> None:
    with pytest.raises(AnalysisError, match="different n"):
        spread_vs_noise([_summary("a", 0.1, 0.01, n=100), _summary("b", 0.2, 0.01, n=200)])


def test_roc_curve_matches_sklearn_with_ties() -> None:
    rng = np.random.default_rng(0)
    ids, ood = rng.integers(0, 8, 60).astype(float), rng.integers(-3, 6, 45).astype(float)
    fpr, tpr, thresholds = roc_curve(ids, ood)
    labels = np.r_[np.ones(60), np.zeros(45)]
    sk_fpr, sk_tpr, sk_thr = sk_roc_curve(labels, np.r_[ids, ood], drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    np.testing.assert_allclose(thresholds[1:], sk_thr[1:])
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc_score(labels, np.r_[ids, ood]))
