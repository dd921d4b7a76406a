"""Binomial intervals against scipy's beta quantiles and their defining equations; the stratified bootstrap
against brute-force resamples and scipy.stats.bootstrap; the closed-form jackknife against leave-one-out."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from oodbench.analysis import intervals
from oodbench.analysis.intervals import (
    acceleration,
    bootstrap,
    bootstrap_replicates,
    bootstrap_replicates_many,
    clopper_pearson_interval,
    fpr_interval,
    jackknife_values,
    required_count,
    wilson_interval,
)
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError

GRID = [(0, 1), (1, 1), (0, 20), (3, 20), (20, 20), (17, 655), (640, 655), (5000, 10000)]


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_clopper_pearson_equals_beta_quantiles_and_binomial_tails(confidence: float) -> None:
    alpha = 1 - confidence
    for k, n in GRID:
        low, high = clopper_pearson_interval(k, n, confidence)
        expected_low = 0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1)
        expected_high = 1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
        assert low == pytest.approx(expected_low, abs=1e-12)
        assert high == pytest.approx(expected_high, abs=1e-12)
        # The defining property: each bound makes the observed count exactly alpha/2 extreme.
        if k > 0:
            assert stats.binom.sf(k - 1, n, low) == pytest.approx(alpha / 2, rel=1e-8)
        if k < n:
            assert stats.binom.cdf(k, n, high) == pytest.approx(alpha / 2, rel=1e-8)


def test_clopper_pearson_vectorised() -> None:
    k = np.array([g[0] for g in GRID])
    n = np.array([g[1] for g in GRID])
    low, high = clopper_pearson_interval(k, n)
    for i, (ki, ni) in enumerate(GRID):
        assert (low[i], high[i]) == clopper_pearson_interval(ki, ni)


def test_wilson_bounds_solve_the_score_equation() -> None:
    z = stats.norm.ppf(0.975)
    for k, n in GRID:
        low, high = wilson_interval(k, n)
        p_hat = k / n
        for bound in (low, high):
            # Wilson's bounds are the p with (p_hat - p)^2 = z^2 p (1 - p) / n.
            assert (p_hat - bound) ** 2 == pytest.approx(z * z * bound * (1 - bound) / n, abs=1e-12)
        assert low <= p_hat <= high


def test_interval_inputs_are_checked() -> None:
    for k, n in [(-1, 5), (6, 5), (1, 0)]:
        with pytest.raises(AnalysisError):
            wilson_interval(k, n)
    with pytest.raises(AnalysisError, match="whole numbers"):
        clopper_pearson_interval(1.5, 4)
    with pytest.raises(AnalysisError, match="confidence"):
        wilson_interval(1, 4, confidence=1.0)
    with pytest.raises(AnalysisError, match="unknown binomial"):
        fpr_interval([1.0, 2.0], [0.0], method="agresti")


def test_fpr_interval_holds_the_threshold_fixed() -> None:
    rng = np.random.default_rng(0)
    ids, ood = rng.normal(1, 1, 300), rng.normal(0, 1, 200)
    for method in ("wilson", "clopper-pearson"):
        interval = fpr_interval(ids, ood, method=method)
        k = int(np.count_nonzero(ood >= metrics.threshold_at_tpr(ids)))
        assert interval.estimate == metrics.fpr_at_tpr(ids, ood) == k / 200
        assert interval.low < interval.estimate < interval.high


def test_required_count_agrees_with_the_metric_threshold() -> None:
    rng = np.random.default_rng(1)
    for n in [1, 2, 19, 20, 21, 100, 655, 1001]:
        ids = rng.normal(size=n)
        for tpr in (0.5, 0.9, 0.95, 0.99, 1.0):
            k = required_count(tpr, n)
            assert np.sort(ids)[::-1][k - 1] == metrics.threshold_at_tpr(ids, tpr)


def _replicates_for_counts(ids: np.ndarray, ood: np.ndarray, w: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
    """Replicates of one pair for given counts (ID in descending order, OOD ascending), as the block loop runs."""
    ranks = intervals._ranks(ids, ood)
    id_totals, ood_totals = intervals._cumulative(w), intervals._cumulative(v)
    positions = intervals._positions(id_totals, required_count(0.95, ids.size))
    return intervals._replicates_from_counts(ranks, w, v, id_totals, ood_totals, positions, ("fpr95", "auroc"))


@pytest.mark.parametrize(("n_id", "n_ood"), [(37, 29), (29, 37)])  # AUROC summed over the OOD side, then the ID side
def test_replicates_equal_metrics_on_materialised_resamples(n_id: int, n_ood: int) -> None:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 12, n_id).astype(float)  # heavy ties
    ood = rng.integers(-3, 9, n_ood).astype(float)
    ids_desc, ood_asc = np.sort(ids)[::-1], np.sort(ood)
    draws = 60
    w = np.stack([np.bincount(rng.integers(0, n_id, n_id), minlength=n_id) for _ in range(draws)]).astype(np.int32)
    v = np.stack([np.bincount(rng.integers(0, n_ood, n_ood), minlength=n_ood) for _ in range(draws)]).astype(np.int32)
    got = _replicates_for_counts(ids, ood, w, v)
    for b in range(draws):
        resampled_ids = np.repeat(ids_desc, w[b])
        resampled_ood = np.repeat(ood_asc, v[b])
        assert got["fpr95"][b] == metrics.fpr_at_tpr(resampled_ids, resampled_ood)
        assert got["auroc"][b] == pytest.approx(metrics.auroc(resampled_ids, resampled_ood), abs=1e-15)


def test_replicates_without_ties_and_with_int64_products_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(12)
    ids, ood = rng.normal(1, 1, 53), rng.normal(0, 1, 31)  # no ID score equals an OOD score: one gather, doubled
    assert intervals._ranks(ids, ood).loose is None
    w = np.stack([np.bincount(rng.integers(0, 53, 53), minlength=53) for _ in range(40)]).astype(np.int32)
    v = np.stack([np.bincount(rng.integers(0, 31, 31), minlength=31) for _ in range(40)]).astype(np.int32)
    narrow = _replicates_for_counts(ids, ood, w, v)
    monkeypatch.setattr(intervals, "INT32_PRODUCT_LIMIT", 0)  # every product in int64
    wide = _replicates_for_counts(ids, ood, w, v)
    for b in range(40):
        expected = metrics.auroc(np.repeat(np.sort(ids)[::-1], w[b]), np.repeat(np.sort(ood), v[b]))
        assert narrow["auroc"][b] == wide["auroc"][b] == pytest.approx(expected, abs=1e-15)


def test_many_pairs_give_each_pair_its_own_replicates_whatever_the_block_size() -> None:
    rng = np.random.default_rng(13)
    ids = {n: rng.normal(1, 1, n) for n in (40, 57)}
    pairs = [
        (ids[n] + shift, rng.integers(-2, 3, m).astype(float))  # ties within and across the sets
        for n in (40, 57)
        for m in (25, 25, 31, 90)
        for shift in (0.0, 0.5)
    ]
    alone = [bootstrap_replicates(a, b, resamples=70, seed=5) for a, b in pairs]
    for budget in (1, 3000, 10**8):  # one resample per block, a few, all of them
        together = bootstrap_replicates_many(pairs, resamples=70, seed=5, budget_bytes=budget)
        for mine, reference in zip(together, alone, strict=True):
            for name in ("fpr95", "auroc"):
                np.testing.assert_array_equal(mine[name], reference[name])
    other_seed = bootstrap_replicates(*pairs[0], resamples=70, seed=6)
    assert not np.array_equal(other_seed["auroc"], alone[0]["auroc"])


@pytest.mark.parametrize("metric", ["fpr95", "auroc"])
def test_jackknife_equals_leave_one_out(metric: str) -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 15, 41).astype(float)
    ood = rng.integers(-5, 10, 23).astype(float)
    by_id, by_ood = jackknife_values(ids, ood, metric)
    compute = metrics.fpr_at_tpr if metric == "fpr95" else metrics.auroc
    brute_id = sorted(compute(np.delete(ids, i), ood) for i in range(ids.size))
    brute_ood = [compute(ids, np.delete(ood, j)) for j in range(ood.size)]
    np.testing.assert_allclose(sorted(by_id), brute_id, atol=1e-15)
    np.testing.assert_allclose(by_ood, brute_ood, atol=1e-15)


def test_acceleration_reduces_to_the_one_sample_formula() -> None:
    values = np.random.default_rng(4).gamma(2.0, size=50)
    d = values.mean() - values
    expected = np.sum(d**3) / (6 * np.sum(d**2) ** 1.5)
    assert acceleration([values]) == pytest.approx(expected)
    assert acceleration([np.ones(5), np.ones(7)]) == 0.0


def _auroc_statistic(ids: np.ndarray, ood: np.ndarray, axis: int = -1) -> np.ndarray:
    ids, ood = np.moveaxis(ids, axis, -1), np.moveaxis(ood, axis, -1)
    wins = (ids[..., :, None] > ood[..., None, :]).mean(axis=(-2, -1))
    ties = (ids[..., :, None] == ood[..., None, :]).mean(axis=(-2, -1))
    return wins + 0.5 * ties


def test_auroc_intervals_agree_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(5)
    ids, ood = rng.normal(0.8, 1, 120), rng.normal(0, 1.3, 90)
    ours = bootstrap(ids, ood, metric_names=("auroc",), resamples=4000, seed=1)["auroc"]
    for method, interval in (("percentile", ours.percentile), ("BCa", ours.bca)):
        reference = stats.bootstrap(
            (ids, ood),
            _auroc_statistic,
            n_resamples=4000,
            method=method,
            vectorized=True,
            batch=200,
            random_state=np.random.default_rng(2),
        )
        # Two independent Monte Carlo runs of 4000 resamples: endpoints agree to well under 0.01 AUROC.
        assert interval.low == pytest.approx(reference.confidence_interval.low, abs=0.01)
        assert interval.high == pytest.approx(reference.confidence_interval.high, abs=0.01)
    assert ours.std == pytest.approx(reference.standard_error, rel=0.1)
    assert ours.estimate == metrics.auroc(ids, ood)


def test_fpr_bootstrap_spread_matches_an_index_resampling_bootstrap() -> None:
    rng = np.random.default_rng(6)
    ids, ood = rng.normal(1.5, 1, 200), rng.normal(0, 1, 150)
    ours = bootstrap_replicates(ids, ood, resamples=3000, seed=3, metric_names=("fpr95",))["fpr95"]
    brute = np.array([metrics.fpr_at_tpr(rng.choice(ids, 200), rng.choice(ood, 150)) for _ in range(1500)])
    assert ours.mean() == pytest.approx(brute.mean(), abs=4 * brute.std() / np.sqrt(1500))
    # A standard deviation from n draws has relative standard error ~1/√(2n): 1.8% for the 1500 brute-force draws,
    # 1.3% for the 3000 resamples, 2.2% combined; 0.1 is 4.5 of those.
    assert ours.std() == pytest.approx(brute.std(), rel=0.1)


def test_bootstrap_is_seeded_and_degenerate_cases_are_exact() -> None:
    rng = np.random.default_rng(7)
    ids, ood = rng.normal(10, 1, 50), rng.normal(0, 1, 40)  # perfectly separated
    result = bootstrap(ids, ood, resamples=200, seed=4)
    for name, value in (("fpr95", 0.0), ("auroc", 1.0)):
        r = result[name]
        assert r.estimate == value
        assert (r.percentile.low, r.percentile.high, r.bca.low, r.bca.high) == (value,) * 4
    again = bootstrap(ids + rng.normal(0, 5, 50), ood, resamples=200, seed=4)
    same = bootstrap(ids + 0, ood, resamples=200, seed=4)
    np.testing.assert_array_equal(same["auroc"].replicates, result["auroc"].replicates)
    assert again["auroc"].percentile.low < 1.0


def test_bootstrap_rejects_bad_requests() -> None:
    with pytest.raises(AnalysisError, match="cannot bootstrap"):
        bootstrap_replicates([1.0, 2.0], [0.0, 1.0], metric_names=("aupr_in",))
    with pytest.raises(AnalysisError, match="resamples"):
        bootstrap_replicates([1.0, 2.0], [0.0, 1.0], resamples=1)
    with pytest.raises(AnalysisError, match="jackknife"):
        jackknife_values([1.0], [0.0, 1.0], "auroc")
