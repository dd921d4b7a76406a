"""DeLong's test against the brute-force U-statistic structural components, and its variance against simulation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oodbench.analysis.delong import delong_covariance, delong_interval, delong_test, structural_components
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError


def _psi(x: float, y: float) -> float:
    return 1.0 if x > y else 0.5 if x == y else 0.0


def _brute_covariance(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """DeLong et al. (1988) written out: components by explicit loops, then S10/m + S01/n."""
    k = len(pairs)
    n, m = pairs[0][0].size, pairs[0][1].size
    v10 = np.zeros((k, n))
    v01 = np.zeros((k, m))
    for r, (ids, ood) in enumerate(pairs):
        for i in range(n):
            v10[r, i] = sum(_psi(ids[i], ood[j]) for j in range(m)) / m
        for j in range(m):
            v01[r, j] = sum(_psi(ids[i], ood[j]) for i in range(n)) / n
    aucs = v10.mean(axis=1)
    s10 = np.zeros((k, k))
    s01 = np.zeros((k, k))
    for a in range(k):
        for b in range(k):
            s10[a, b] = sum((v10[a, i] - aucs[a]) * (v10[b, i] - aucs[b]) for i in range(n)) / (n - 1)
            s01[a, b] = sum((v01[a, j] - aucs[a]) * (v01[b, j] - aucs[b]) for j in range(m)) / (m - 1)
    return aucs, s10 / n + s01 / m


def test_structural_components_match_brute_force_with_ties() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, 14).astype(float)
    ood = rng.integers(-2, 4, 11).astype(float)
    v_id, v_ood = structural_components(ids, ood)
    for i in range(ids.size):
        assert v_id[i] == pytest.approx(np.mean([_psi(ids[i], y) for y in ood]), abs=1e-15)
    for j in range(ood.size):
        assert v_ood[j] == pytest.approx(np.mean([_psi(x, ood[j]) for x in ids]), abs=1e-15)
    assert v_id.mean() == pytest.approx(metrics.auroc(ids, ood), abs=1e-15)
    assert v_ood.mean() == pytest.approx(metrics.auroc(ids, ood), abs=1e-15)


def test_covariance_matches_brute_force_for_three_correlated_detectors() -> None:
    rng = np.random.default_rng(1)
    base_id, base_ood = rng.normal(1, 1, 16), rng.normal(0, 1, 13)
    pairs = []
    for noise in (0.0, 0.5, 1.5):
        pairs.append(
            (np.round(base_id + noise * rng.normal(size=16), 1), np.round(base_ood + noise * rng.normal(size=13), 1))
        )
    aucs, cov = delong_covariance([p[0] for p in pairs], [p[1] for p in pairs])
    brute_aucs, brute_cov = _brute_covariance(pairs)
    np.testing.assert_allclose(aucs, brute_aucs, atol=1e-14)
    np.testing.assert_allclose(cov, brute_cov, atol=1e-14)


def test_paired_test_statistic_from_brute_force() -> None:
    rng = np.random.default_rng(2)
    ids_a, ood_a = rng.normal(1.0, 1, 18), rng.normal(0, 1, 15)
    ids_b, ood_b = ids_a + rng.normal(0, 0.7, 18), ood_a + rng.normal(0, 0.7, 15)
    result = delong_test(ids_a, ood_a, ids_b, ood_b, names=("a", "b"))
    aucs, cov = _brute_covariance([(ids_a, ood_a), (ids_b, ood_b)])
    se = np.sqrt(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    assert result.difference == pytest.approx(aucs[0] - aucs[1], abs=1e-14)
    assert result.se == pytest.approx(se, rel=1e-12)
    z = (aucs[0] - aucs[1]) / se
    assert result.z == pytest.approx(z, rel=1e-12)
    from scipy.stats import norm

    assert result.p_value == pytest.approx(2 * norm.sf(abs(z)), rel=1e-10)
    assert result.low == pytest.approx(result.difference - norm.ppf(0.975) * se, rel=1e-12)
    swapped = delong_test(ids_b, ood_b, ids_a, ood_a)
    assert swapped.p_value == pytest.approx(result.p_value) and swapped.z == pytest.approx(-result.z)


def test_identical_detectors_are_not_different() -> None:
    rng = np.random.default_rng(3)
    ids, ood = rng.normal(1, 1, 50), rng.normal(0, 1, 40)
    result = delong_test(ids, ood, ids.copy(), ood.copy())
    assert result.difference == 0.0 and result.se == 0.0 and result.p_value == 1.0
    assert result.correlation == pytest.approx(1.0)


def test_perfect_separation_gives_strict_json() -> None:
    # Both detectors separate perfectly: every component is constant, so the correlation is undefined (NaN), and
    # so are z and p (before: p = 1.0, as if the test had found no difference).
    result = delong_test(
        np.array([5.0, 6.0, 7.0]), np.array([0.0, 1.0]), np.array([5.0, 6.0, 9.0]), np.array([0.0, 2.0])
    )
    assert (result.auroc_a, result.auroc_b, result.se) == (1.0, 1.0, 0.0)
    assert np.isnan(result.correlation) and np.isnan(result.z) and np.isnan(result.p_value)
    payload = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert payload["correlation"] is None and payload["z"] is None and payload["p_value"] is None
    assert (payload["n_id"], payload["n_ood"]) == (3, 2)


def test_delong_variance_matches_simulated_variance_of_the_difference() -> None:
    rng = np.random.default_rng(4)
    sims, n, m = 400, 60, 50
    diffs, variances = [], []
    for _ in range(sims):
        latent_id, latent_ood = rng.normal(1.0, 1, n), rng.normal(0, 1, m)
        a = (latent_id + rng.normal(0, 0.6, n), latent_ood + rng.normal(0, 0.6, m))
        b = (latent_id + rng.normal(0, 1.2, n), latent_ood + rng.normal(0, 1.2, m))
        result = delong_test(a[0], a[1], b[0], b[1])
        diffs.append(result.difference)
        variances.append(result.se**2)
    # The sample variance of 400 differences has ~7% relative error; DeLong is a slightly conservative estimate.
    ratio = np.mean(variances) / np.var(diffs, ddof=1)
    assert 0.75 < ratio < 1.35


def test_single_auroc_interval_contains_estimate() -> None:
    rng = np.random.default_rng(5)
    ids, ood = rng.normal(1, 1, 80), rng.normal(0, 1, 70)
    interval = delong_interval(ids, ood)
    assert interval.low < interval.estimate == metrics.auroc(ids, ood) < interval.high <= 1.0


def test_unpaired_inputs_are_rejected() -> None:
    with pytest.raises(AnalysisError, match="same images"):
        delong_test(np.zeros(5), np.zeros(4), np.zeros(6), np.zeros(4))
    with pytest.raises(AnalysisError, match="at least 2"):
        delong_test(np.zeros(1), np.zeros(4), np.zeros(1), np.zeros(4))
