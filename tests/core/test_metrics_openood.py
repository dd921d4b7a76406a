"""The openood convention: trapezoidal AUPR, OOD-positive FPR, against closed forms, an exact rational reference,
OpenOOD's scikit-learn recipe and (when installed) pytorch-ood's OODMetrics."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import auc, precision_recall_curve

from oodbench.core import metrics
from oodbench.core.errors import MetricError

tied = st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=60)
spread = st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=60)
score_lists = st.one_of(tied, spread)

# Float error bound of aupr_trapezoid: each of the m <= 121 terms carries a relative error of a few ulps and the
# terms sum to at most 1, so the total is below 8 * 121 * 2**-53 < 1.1e-13.
BOUND = 2e-13


def exact_aupr(positive: list[float], negative: list[float]) -> Fraction:
    """The definition in rational arithmetic: one PR point per distinct threshold, from (0, 1), trapezoids."""
    points = [(Fraction(0), Fraction(1))]
    for t in sorted(set(positive) | set(negative), reverse=True):
        tp = sum(1 for s in positive if s >= t)
        fp = sum(1 for s in negative if s >= t)
        points.append((Fraction(tp, len(positive)), Fraction(tp, tp + fp)))
    return sum(
        ((r1 - r0) * (p1 + p0) / 2 for (r0, p0), (r1, p1) in zip(points[:-1], points[1:], strict=True)), Fraction(0)
    )


def test_closed_forms():
    # Every score tied: one operating point (recall 1, precision P/(P+N)); area (1 + P/(P+N)) / 2.
    assert metrics.aupr_trapezoid(np.ones(3), np.ones(5)) == pytest.approx((1 + 3 / 8) / 2, abs=1e-15)
    # Separated: precision 1 up to recall 1.
    assert metrics.aupr_trapezoid(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    # One positive below N negatives: the only rising segment ends at (1, 1/(N+1)); area 1/(2(N+1)).
    for n in (1, 4, 9):
        assert metrics.aupr_trapezoid(np.zeros(1), np.arange(1.0, n + 1)) == pytest.approx(1 / (2 * (n + 1)), abs=1e-15)
        # Average precision of the same case is 1/(N+1): the two AUPRs are different numbers.
        assert metrics.average_precision(np.zeros(1), np.arange(1.0, n + 1)) == pytest.approx(1 / (n + 1), abs=1e-15)


@settings(max_examples=300, deadline=None)
@given(score_lists, score_lists)
def test_trapezoid_matches_exact_rational_reference(pos, neg):
    value = metrics.aupr_trapezoid(np.array(pos), np.array(neg))
    assert abs(value - float(exact_aupr(pos, neg))) <= BOUND


@settings(max_examples=300, deadline=None)
@given(score_lists, score_lists)
def test_openood_convention_matches_openood_sklearn_recipe(id_list, ood_list):
    ids, ood = np.array(id_list), np.array(ood_list)
    # OpenOOD v1.5 compute_all_metrics: ID positive with conf for AUPR_IN, OOD positive with -conf for AUPR_OUT.
    conf = np.r_[ids, ood]
    ood_indicator = np.r_[np.zeros(len(ids)), np.ones(len(ood))]
    p_in, r_in, _ = precision_recall_curve(1 - ood_indicator, conf)
    p_out, r_out, _ = precision_recall_curve(ood_indicator, -conf)
    got = metrics.evaluate(ids, ood, convention="openood")
    assert abs(got["aupr_in"] - auc(r_in, p_in)) <= BOUND
    assert abs(got["aupr_out"] - auc(r_out, p_out)) <= BOUND
    assert got["fpr95"] == metrics.fpr_at_tpr_ood_positive(ids, ood)
    assert got["auroc"] == metrics.auroc(ids, ood)


@settings(max_examples=200, deadline=None)
@given(score_lists, score_lists, st.sampled_from([0.95, 0.9, 0.5]))
def test_swapping_roles_is_the_other_convention(id_list, ood_list, tpr):
    # The identities `analyze --convention openood` uses: OOD-positive FPR is ID-positive FPR of the swapped,
    # negated problem, and AUROC (integer counts) is exactly invariant under that swap.
    ids, ood = np.array(id_list), np.array(ood_list)
    assert metrics.fpr_at_tpr_ood_positive(ids, ood, tpr) == metrics.fpr_at_tpr(-ood, -ids, tpr)
    assert metrics.auroc(ids, ood) == metrics.auroc(-ood, -ids)


def test_against_pytorch_ood_oodmetrics():
    torch = pytest.importorskip("torch")
    pytorch_ood_metrics = pytest.importorskip("pytorch_ood.metrics")
    rng = np.random.default_rng(3)
    for ties in (False, True):
        ids = rng.normal(1.0, 1.0, 700)
        ood = rng.normal(0.0, 1.0, 300)
        if ties:
            ids, ood = np.round(ids, 1), np.round(ood, 1)
        collection = pytorch_ood_metrics.OODMetrics()
        # pytorch-ood: outlier scores (higher = more OOD), labels < 0 mark OOD.
        collection.update(torch.from_numpy(-np.r_[ids, ood]), torch.from_numpy(np.r_[np.zeros(700), -np.ones(300)]))
        theirs = collection.compute()
        ours = metrics.evaluate(ids, ood, convention="openood")
        assert ours["fpr95"] == theirs["FPR95TPR"]  # both are exact count ratios
        assert ours["auroc"] == pytest.approx(theirs["AUROC"], abs=1e-12)
        assert ours["aupr_in"] == pytest.approx(theirs["AUPR-IN"], abs=1e-12)
        assert ours["aupr_out"] == pytest.approx(theirs["AUPR-OUT"], abs=1e-12)


def test_convention_names():
    assert metrics.convention_metric("fpr95", "oodbench") == "fpr95"
    assert metrics.convention_metric("fpr95", "openood") == "openood.fpr95"
    with pytest.raises(MetricError, match="unknown metric convention 'sklearn'"):
        metrics.evaluate(np.ones(3), np.ones(3), convention="sklearn")
    assert set(metrics.evaluate(np.ones(3), np.zeros(3), convention="openood")) == set(metrics.METRIC_NAMES)
