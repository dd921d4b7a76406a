"""Metrics against scikit-learn and a brute-force threshold sweep, including heavy ties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from oodbench.core import metrics
from oodbench.core.errors import MetricError


def brute_force_fpr(id_scores: np.ndarray, ood_scores: np.ndarray, tpr: float) -> float:
    """The definition, literally: the largest candidate t with mean(id >= t) >= tpr, then mean(ood >= t)."""
    best = None
    for t in sorted(set(id_scores.tolist())):
        if np.mean(id_scores >= t) >= tpr:
            best = t
    return float(np.mean(ood_scores >= best))


def brute_force_auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    wins = (id_scores[:, None] > ood_scores[None, :]).sum() + 0.5 * (id_scores[:, None] == ood_scores[None, :]).sum()
    return wins / (len(id_scores) * len(ood_scores))


# Scores drawn from a few distinct values produce heavy ties; floats produce none.
tied = st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=60)
spread = st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=60)
score_lists = st.one_of(tied, spread)


@settings(max_examples=300, deadline=None)
@given(score_lists, score_lists)
def test_auroc_matches_sklearn_and_brute_force(id_list, ood_list):
    ids, ood = np.array(id_list), np.array(ood_list)
    value = metrics.auroc(ids, ood)
    assert value == pytest.approx(brute_force_auroc(ids, ood), abs=1e-12)
    labels = np.r_[np.ones(len(ids)), np.zeros(len(ood))]
    assert value == pytest.approx(roc_auc_score(labels, np.r_[ids, ood]), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(score_lists, score_lists, st.sampled_from([0.95, 0.9, 0.5, 0.8, 1.0]))
def test_fpr_matches_brute_force_exactly(id_list, ood_list, tpr):
    ids, ood = np.array(id_list), np.array(ood_list)
    assert metrics.fpr_at_tpr(ids, ood, tpr) == brute_force_fpr(ids, ood, tpr)


@settings(max_examples=300, deadline=None)
@given(score_lists, score_lists)
def test_aupr_matches_sklearn(id_list, ood_list):
    ids, ood = np.array(id_list), np.array(ood_list)
    labels = np.r_[np.ones(len(ids)), np.zeros(len(ood))]
    assert metrics.aupr_in(ids, ood) == pytest.approx(average_precision_score(labels, np.r_[ids, ood]), abs=1e-12)
    assert metrics.aupr_out(ids, ood) == pytest.approx(average_precision_score(1 - labels, -np.r_[ids, ood]), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(score_lists, score_lists)
def test_ood_positive_convention_matches_openood_recipe(id_list, ood_list):
    ids, ood = np.array(id_list), np.array(ood_list)
    # OpenOOD: OOD indicator as positive label, -conf as the score, first ROC point with TPR >= 0.95.
    # (OpenOOD keeps roc_curve's default drop_intermediate=True, which can drop the exact operating point
    # when it is collinear with its neighbours; the definition needs every point.)
    labels = np.r_[np.zeros(len(ids)), np.ones(len(ood))]
    fpr, tpr, _ = roc_curve(labels, -np.r_[ids, ood], drop_intermediate=False)
    expected = fpr[np.argmax(tpr >= 0.95)]
    assert metrics.fpr_at_tpr_ood_positive(ids, ood) == pytest.approx(expected, abs=1e-12)


def test_openood_drop_intermediate_pitfall():
    # 19 of 20 OOD flagged at -conf >= -1 gives FPR 1/2; sklearn's default ROC thinning drops that point.
    ids, ood = np.array([1.0, 2.0]), np.r_[np.zeros(18), 1.0, 2.0]
    assert metrics.fpr_at_tpr_ood_positive(ids, ood) == 0.5
    labels = np.r_[np.zeros(2), np.ones(20)]
    fpr, tpr, _ = roc_curve(labels, -np.r_[ids, ood])
    assert fpr[np.argmax(tpr >= 0.95)] == 1.0


def test_known_values():
    ids = np.arange(1, 101, dtype=float)  # 1..100
    ood = np.arange(-50, 50, dtype=float)  # -50..49
    # 95 % of ID must be >= t -> t = 6 (6..100 is 95 values); OOD >= 6: 6..49 = 44 values.
    assert metrics.threshold_at_tpr(ids) == 6.0
    assert metrics.fpr_at_tpr(ids, ood) == 0.44
    assert metrics.auroc(ids, ids) == 0.5
    assert metrics.auroc(ids, ids - 1000) == 1.0
    assert metrics.fpr_at_tpr(np.ones(10), np.ones(5)) == 1.0  # ties accepted
    result = metrics.evaluate(ids, ood)
    assert set(result) == set(metrics.METRIC_NAMES)


def test_float_noise_in_tpr_times_n():
    # 0.95 * 20 = 19.000000000000004 in floating point would make a naive ceil demand 20 of 20.
    ids = np.arange(20, dtype=float)
    assert metrics.threshold_at_tpr(ids, 0.95) == 1.0


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.array([]), "empty"),
        (np.array([1.0, np.nan]), "NaN"),
        (np.array([1.0, np.inf]), "NaN or inf"),
        (np.ones((3, 2)), "1-D"),
        (np.array(["a", "b"]), "numeric"),
    ],
)
def test_bad_inputs_raise(bad, message):
    with pytest.raises(MetricError, match=message):
        metrics.auroc(bad, np.ones(3))
    with pytest.raises(MetricError, match=message):
        metrics.fpr_at_tpr(np.ones(3), bad)


def test_integers_beyond_float64_are_refused():
    # 2**60 + 1 and 2**60 are distinct integers but the same float64: comparing them as floats would tie them.
    with pytest.raises(MetricError, match="2\\*\\*53"):
        metrics.auroc(np.array([2**60 + 1]), np.array([2**60]))
    with pytest.raises(MetricError, match="2\\*\\*53"):
        metrics.fpr_at_tpr(np.array([1, 2]), np.array([-(2**60)], dtype=np.int64))
    # Up to 2**53 every integer is exact in float64, so those are compared as given.
    assert metrics.auroc(np.array([2**53]), np.array([2**53 - 1])) == 1.0
    assert metrics.auroc(np.array([3], dtype=np.uint64), np.array([2], dtype=np.uint64)) == 1.0


def test_bad_tpr():
    with pytest.raises(MetricError, match="tpr"):
        metrics.fpr_at_tpr(np.ones(3), np.ones(3), tpr=0.0)


def test_large_inputs_are_exact():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, 200_000).astype(float)
    ood = rng.integers(-100, 900, 150_000).astype(float)
    labels = np.r_[np.ones(len(ids)), np.zeros(len(ood))]
    assert metrics.auroc(ids, ood) == pytest.approx(roc_auc_score(labels, np.r_[ids, ood]), abs=1e-12)
