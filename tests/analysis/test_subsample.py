"""Subsampling study: known answers, the hypergeometric law of the draws, and vectorised ranks against scipy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from oodbench.analysis.rundata import load_run
from oodbench.analysis.subsample import (
    PAPER_N,
    acceptance_bits,
    average_ranks,
    closed_form_se,
    draw_counts,
    rank_correlation,
    resolve_n,
    subsample_curve,
    subsample_fpr,
    subsample_run,
)
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError


def _scores(rng: np.random.Generator, detectors: int = 6, n_id: int = 500, n_ood: int = 400):
    ids = {f"d{j}": rng.normal(1.0 + 0.2 * j, 1.0, n_id) for j in range(detectors)}
    oods = {f"d{j}": rng.normal(0.0, 1.0, n_ood) for j in range(detectors)}
    return ids, oods


def test_every_ood_score_above_threshold_gives_fpr_one_and_zero_std() -> None:
    rng = np.random.default_rng(0)
    ids = {"a": rng.normal(0, 1, 200), "b": rng.normal(0, 1, 200)}
    oods = {"a": rng.normal(0, 1, 150) + 100.0, "b": rng.normal(0, 1, 150) + 50.0}
    study = subsample_fpr(ids, oods, 40, draws=200, seed=1)
    summary = study.summary()
    assert np.all(study.draw_fpr == 1.0)
    assert (summary.full, summary.mean, summary.bias, summary.std, summary.se) == (1.0, 1.0, 0.0, 0.0, 0.0)
    # Every detector ties on every draw: the rank correlation is undefined, not invented.
    assert np.isnan(summary.spearman) and summary.spearman_defined == 0
    assert json.loads(json.dumps(summary.as_dict(), allow_nan=False))["spearman"] is None  # strict JSON


def test_closed_form_se_matches_empirical_std_of_many_draws() -> None:
    rng = np.random.default_rng(3)
    ids, oods = _scores(rng, detectors=3, n_ood=900)
    n, draws = 150, 4000
    study = subsample_fpr(ids, oods, n, draws=draws, seed=7)
    summary = study.summary()
    # The sample std of R draws has relative standard error ~ 1/sqrt(2(R-1)) (1.1% here); allow 5 of them.
    assert summary.std == pytest.approx(summary.se, rel=5 / np.sqrt(2 * (draws - 1)))
    # Subsampling without replacement is unbiased for the full-set proportion.
    assert abs(summary.bias) < 5 * summary.se / np.sqrt(draws)
    p, N = summary.full, summary.n_total
    assert summary.se == pytest.approx(np.sqrt(p * (1 - p) / n) * np.sqrt((N - n) / (N - 1)))


def test_draw_counts_follow_the_hypergeometric_law() -> None:
    rng = np.random.default_rng(11)
    N, K, n, draws = 60, 21, 12, 20000
    accepted = np.zeros((N, 1), bool)
    accepted[rng.choice(N, K, replace=False), 0] = True
    counts = draw_counts(accepted, n, draws, np.random.default_rng(5))[:, 0]
    support = np.arange(0, n + 1)
    expected = stats.hypergeom(N, K, n).pmf(support) * draws
    observed = np.bincount(counts, minlength=n + 1)
    keep = expected >= 5  # chi-square validity; pool the thin tails into one cell
    obs = np.r_[observed[keep], observed[~keep].sum()]
    exp = np.r_[expected[keep], expected[~keep].sum()]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_draw_counts_equal_brute_force_counts_on_the_drawn_subset() -> None:
    rng = np.random.default_rng(2)
    ids, oods = _scores(rng, detectors=4, n_ood=90)
    bits = acceptance_bits(ids, oods)
    N = bits.n_total
    # Identity columns make each draw's selection mask visible next to the detectors' counts.
    augmented = np.concatenate([bits.accepted, np.eye(N, dtype=bool)], axis=1)
    counts = draw_counts(augmented, 25, 300, np.random.default_rng(9), budget_bytes=20_000)  # several blocks
    masks = counts[:, 4:].astype(bool)
    assert np.all(counts[:, 4:] <= 1) and np.all(masks.sum(axis=1) == 25)
    for draw in range(0, 300, 37):
        for j, name in enumerate(bits.detectors):
            subset = oods[name][masks[draw]]
            threshold = metrics.threshold_at_tpr(ids[name])  # fixed from the full ID set
            assert counts[draw, j] == np.count_nonzero(subset >= threshold)
    # Each image is drawn with probability n / N.
    assert masks.mean() == pytest.approx(25 / N)


def test_average_ranks_match_scipy_rankdata_with_ties() -> None:
    values = np.random.default_rng(4).integers(0, 5, size=(50, 9)).astype(float)
    expected = np.array([stats.rankdata(row) for row in values])
    np.testing.assert_array_equal(average_ranks(values), expected)


def test_rank_correlation_matches_scipy_spearmanr() -> None:
    rng = np.random.default_rng(8)
    reference = rng.integers(0, 6, 12).astype(float)
    values = rng.integers(0, 6, size=(40, 12)).astype(float)
    values[0] = 3.0  # a constant row: undefined
    rho = rank_correlation(values, reference)
    assert np.isnan(rho[0])
    for row, got in zip(values[1:], rho[1:], strict=False):
        assert got == pytest.approx(stats.spearmanr(row, reference).statistic, abs=1e-12)


def test_full_set_draws_reproduce_the_full_set() -> None:
    rng = np.random.default_rng(1)
    ids, oods = _scores(rng, detectors=5, n_ood=80)
    study = subsample_fpr(ids, oods, 80, draws=20, seed=0)
    summary = study.summary()
    np.testing.assert_array_equal(study.draw_fpr, np.tile(study.full_fpr, (20, 1)))
    assert summary.std == 0.0 and summary.se == 0.0 and summary.bias == 0.0
    assert summary.spearman == pytest.approx(1.0)
    expected = [metrics.fpr_at_tpr(ids[d], oods[d]) for d in study.detectors]
    np.testing.assert_allclose(study.full_fpr, expected, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 40), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_draws_stay_within_possible_counts(n_ood: int, detectors: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = {f"d{j}": rng.integers(0, 4, 30).astype(float) for j in range(detectors)}  # heavy ties
    oods = {f"d{j}": rng.integers(0, 4, n_ood).astype(float) for j in range(detectors)}
    n = int(rng.integers(1, n_ood + 1))
    study = subsample_fpr(ids, oods, n, draws=10, seed=seed)
    accepted = study.full_fpr * n_ood
    # A draw of n cannot accept more than min(n, K) nor fewer than max(0, n - (N - K)) images.
    counts = study.draw_fpr * n
    assert np.all(counts <= np.minimum(n, accepted) + 1e-9)
    assert np.all(counts >= np.maximum(0, n - (n_ood - accepted)) - 1e-9)
    assert (
        study.best == study.detectors[int(np.argmin(study.full_fpr))]
        or study.full_fpr[study.best_index] == study.full_fpr.min()
    )


def test_best_detector_ties_break_by_auroc() -> None:
    ids = {"first": np.arange(100.0), "second": np.arange(100.0)}
    # Same FPR@95 (no OOD above the threshold 5), but "second" ranks OOD lower overall: higher AUROC.
    oods = {"first": np.full(50, 4.0), "second": np.full(50, -1.0)}
    study = subsample_fpr(ids, oods, 10, draws=5)
    assert study.full_fpr.tolist() == [0.0, 0.0]
    assert study.best == "second"


def test_seeded_and_independent_of_which_datasets_run(synthetic_run) -> None:
    run = load_run(synthetic_run)
    all_sets, _ = subsample_run(run, 100, draws=50, seed=3, progress=False)
    only_far, _ = subsample_run(run, 100, draws=50, seed=3, ood_datasets=["far"], progress=False)
    far = next(s for s in all_sets if s.ood_dataset == "far")
    np.testing.assert_array_equal(far.draw_fpr, only_far[0].draw_fpr)
    again, _ = subsample_run(run, 100, draws=50, seed=3, ood_datasets=["far"], progress=False)
    np.testing.assert_array_equal(again[0].draw_fpr, only_far[0].draw_fpr)
    direct = subsample_fpr(*run.paired_scores("toy-model", "id-test", "far"), 100, draws=50, seed=3, ood_dataset="far")
    np.testing.assert_array_equal(direct.draw_counts, far.draw_counts)  # the run's threshold cache changes nothing
    other_seed, _ = subsample_run(run, 100, draws=50, seed=4, ood_datasets=["far"], progress=False)
    assert not np.array_equal(other_seed[0].draw_fpr, only_far[0].draw_fpr)


def test_run_skips_sets_smaller_than_n_and_errors_when_none_fit(synthetic_run) -> None:
    run = load_run(synthetic_run)
    studies, notes = subsample_run(run, 250, draws=20, progress=False)
    assert {s.ood_dataset for s in studies} == {"near", "far"}
    assert len(notes) == 1 and "noise" in notes[0] and "250" in notes[0]
    with pytest.raises(AnalysisError, match="exceeds every OOD set"):
        subsample_run(run, 1000, draws=20, progress=False)
    with pytest.raises(AnalysisError, match="not in"):
        subsample_run(run, 10, draws=20, ood_datasets=["imagenet-o"], progress=False)
    with pytest.raises(AnalysisError, match="no saved scores for nope"):
        subsample_run(run, 10, draws=20, detectors=["nope"], progress=False)


def test_resolve_n() -> None:
    assert resolve_n("auto", {"a": 5000, "b": 20000}) == PAPER_N
    assert resolve_n("auto", {"a": 300, "b": 220}) == 110
    assert resolve_n(None, {"a": 3}) == 1
    assert resolve_n("42", {"a": 3}) == 42
    for bad in ("many", 0, -3):
        with pytest.raises(AnalysisError):
            resolve_n(bad, {"a": 10})


def test_bad_inputs_are_named() -> None:
    ids = {"a": np.zeros(10)}
    with pytest.raises(AnalysisError, match="only one of ID and OOD"):
        subsample_fpr(ids, {"b": np.zeros(5)}, 2)
    with pytest.raises(AnalysisError, match="n=9"):
        subsample_fpr(ids, {"a": np.zeros(5)}, 9)
    with pytest.raises(AnalysisError, match="draws must be at least 2"):
        subsample_fpr(ids, {"a": np.zeros(5)}, 2, draws=1)
    with pytest.raises(AnalysisError, match="one length"):
        subsample_fpr({"a": np.zeros(10), "b": np.zeros(10)}, {"a": np.zeros(5), "b": np.zeros(6)}, 2)
    with pytest.raises(AnalysisError):
        closed_form_se(0.5, 11, 10)


def test_curve_shares_the_fixed_best_detector_and_shrinks_std() -> None:
    rng = np.random.default_rng(12)
    ids, oods = _scores(rng, detectors=4, n_ood=600)
    studies = subsample_curve(ids, oods, [20, 80, 320, 600], draws=400, seed=2)
    assert len({s.best for s in studies}) == 1
    shared = subsample_curve(ids, oods, [20, 80], draws=400, seed=2, bits=acceptance_bits(ids, oods))
    for passed, own in zip(shared, studies, strict=False):
        np.testing.assert_array_equal(passed.draw_counts, own.draw_counts)
    stds = [s.summary().std for s in studies]
    assert stds[0] > stds[1] > stds[2] > stds[3] == 0.0
