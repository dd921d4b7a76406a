"""Mahalanobis scoring: a float32 class search with float64 values orders rows exactly as the float64 computation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from oodbench.core.metrics import auroc
from oodbench.core.outputs import Outputs
from oodbench.detectors import create
from oodbench.detectors._gaussian import ClassGaussians, Gaussian

FAMILY = ("maha", "rmaha", "maha++", "rmaha++")


def _float64_scores(detector, test: Outputs) -> np.ndarray:
    """The detector's scores with the all-float64 class search (the reference order)."""
    detector.gaussians_.float64_search = True
    try:
        return detector.score(test)
    finally:
        detector.gaussians_.float64_search = False


def _assert_same_order(fast: np.ndarray, slow: np.ndarray, n_id: int) -> None:
    np.testing.assert_array_equal(rankdata(fast), rankdata(slow))
    assert abs(auroc(fast[:n_id], fast[n_id:]) - auroc(slow[:n_id], slow[n_id:])) <= 1e-12
    # Values: float64 rounding of the same formula (the search only picks which classes to evaluate).
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12 * np.abs(slow).max())


def _benchmark_like(seed: int = 0, classes: int = 40, dim: int = 24, fit_rows: int = 4000, test_rows: int = 3000):
    """The benchmark's synthetic data at a small size: post-ReLU Gaussian classes, OOD rows between two classes."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 0.6 + 0.4

    def draw(rows: int, between: bool) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, classes, rows)
        centre = centres[labels]
        if between:
            centre = (centre + centres[rng.integers(0, classes, rows)]) / 2
        return np.maximum(centre + rng.normal(size=(rows, dim)), 0.0).astype(np.float32), labels

    fit_features, fit_labels = draw(fit_rows, False)
    test = np.concatenate([draw(test_rows, False)[0], draw(test_rows, True)[0]])
    return Outputs(fit_features, labels=fit_labels), Outputs(test), test_rows


@pytest.mark.parametrize("name", FAMILY)
def test_scores_order_equals_float64_on_benchmark_like_data(name):
    fit, test, n_id = _benchmark_like()
    detector = create(name).fit(fit)
    _assert_same_order(detector.score(test), _float64_scores(detector, test), n_id)


def _near_ties(gaussians: ClassGaussians, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows (in feature space) that float32 cannot order, and their whitened coordinates.

    1. Points on the bisector of two class means, nudged by ±1e-9..1e-12 of the gap towards one: two classes
       tie to far below float32's resolution, so the float32 argmin is a coin flip.
    2. Points at radius r(1 + k·1e-9) from one class mean in random directions: their scores differ by relative
       steps of 2e-9. Float32 resolves ‖y‖² − 2y·M + ‖M‖² only to ~6e-8 of its terms (~100 here), far coarser;
       float64 to ~1e-16 of them, so the float64 order itself is well defined (ties at float64's own rounding
       level would be, and should be, arbitrary).
    """
    means = gaussians.means
    rows = []
    for _ in range(300):
        a, b = rng.choice(means.shape[0], 2, replace=False)
        gap = means[a] - means[b]
        direction = rng.normal(size=means.shape[1])
        direction -= (direction @ gap) / (gap @ gap) * gap  # orthogonal to the gap: keeps the tie
        nudge = rng.choice([-1e-9, -1e-11, 0.0, 1e-12, 1e-10])
        # A distinct distance from the bisector per row, so that no two rows tie exactly (only classes do).
        length = 0.05 + 0.1 * rng.random()
        rows.append((means[a] + means[b]) / 2 + length * direction / np.linalg.norm(direction) + nudge * gap)
    nearest = np.sqrt(
        np.min([np.sum((means - m) ** 2, axis=1)[np.arange(len(means)) != c] for c, m in enumerate(means)])
    )
    for k in range(300):
        direction = rng.normal(size=means.shape[1])
        rows.append(means[0] + 0.2 * nearest * (1.0 + k * 1e-9) * direction / np.linalg.norm(direction))
    whitened = np.array(rows)
    # Back to feature space: z = centre + y A⁺ (the whitener has full column rank here).
    return gaussians.centre + whitened @ np.linalg.pinv(gaussians.whitener), whitened


def test_adversarial_near_ties_keep_the_float64_order():
    fit, _, _ = _benchmark_like(seed=3)
    detector = create("maha").fit(fit)
    gaussians = detector.gaussians_
    features, whitened = _near_ties(gaussians, np.random.default_rng(5))
    test = Outputs(features, check_finite=False)
    fast, slow = detector.score(test), _float64_scores(detector, test)
    half = len(test) // 2
    order = np.random.default_rng(6).permutation(len(test))  # ID/OOD labels interleaved across the ties
    _assert_same_order(fast[order], slow[order], half)
    # The data have teeth: float32 distances alone misorder these rows, and pick another class than float64 for
    # some of them (which the search must then evaluate in float64).
    rank = gaussians.means.shape[1]
    lifted = np.hstack([whitened, np.ones((len(whitened), 1))]).astype(np.float32)
    approx = lifted @ gaussians.search_
    naive = -(np.einsum("nr,nr->n", whitened, whitened) + approx.min(axis=1))
    assert (rankdata(naive) != rankdata(slow)).any()
    exact_cross = gaussians.means_sq - 2.0 * whitened @ gaussians.means.T
    assert (approx.argmin(axis=1) != exact_cross.argmin(axis=1)).any()
    assert rank == gaussians.whitener.shape[1]


def test_search_bound_holds_for_every_class():
    """|ĝ_c − g_c| ≤ κ·R·(2‖y‖ + R) (the bound the candidate set relies on), on wide and far-out rows."""
    fit, test, _ = _benchmark_like(seed=1)
    gaussians = create("maha").fit(fit).gaussians_
    far = (
        np.asarray(test.features, dtype=np.float64)
        * np.array([[1.0], [30.0], [1e3]]).repeat(len(test) // 3 + 1)[: len(test), None]
    )
    whitened = gaussians.whiten(far)
    lifted = np.hstack([whitened, np.ones((len(whitened), 1))]).astype(np.float32)
    approx = (lifted @ gaussians.search_).astype(np.float64)
    exact = gaussians.means_sq - 2.0 * whitened @ gaussians.means.T
    radius = np.sqrt(gaussians.means_sq.max())
    bound = gaussians.error_scale_ * radius * (2.0 * np.linalg.norm(whitened, axis=1) + radius)
    assert (np.abs(approx - exact) <= bound[:, None]).all()
    # ...and not vacuous: the float32 search does err, by at least a millionth of the bound.
    assert (np.abs(approx - exact) > 1e-6 * bound[:, None]).any()


def test_relative_distance_shares_one_whitening_when_nothing_is_dropped():
    """B Bᵀ = P and B diag(w) Bᵀ = P_0: the joint basis gives both distances of the two separate whitenings."""
    fit, test, _ = _benchmark_like(seed=2)
    detector = create("rmaha").fit(fit)
    gaussians = detector.gaussians_
    assert gaussians.background_weights is not None and gaussians.background is None
    block = np.asarray(test.features, dtype=np.float64)
    separate = ClassGaussians(detector.means_, detector.covariance_, centre=gaussians.centre)
    total = detector.gaussians_.centre  # the background's mean is the centre
    background = Gaussian(total, _total_covariance(fit))
    expected = separate.min_sq_distance(block) - background.sq_distance(block)
    np.testing.assert_allclose(
        gaussians.relative_sq_distance(block), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max()
    )


def test_relative_distance_falls_back_when_the_background_is_singular():
    fit, test, _ = _benchmark_like(seed=2)
    features = np.asarray(fit.features, dtype=np.float64)
    covariance = np.cov(features.T, bias=True)
    values, vectors = np.linalg.eigh(covariance)
    values[:3] = 0.0  # a background with a null space: its pseudo-inverse drops directions
    singular = (vectors * values) @ vectors.T
    gaussians = ClassGaussians(features[:40], covariance, centre=features.mean(axis=0), background=singular)
    assert gaussians.background_weights is None and gaussians.background is not None
    block = np.asarray(test.features, dtype=np.float64)
    # An independent reference: explicit pseudo-inverses, per-class distances minimised, the background subtracted.
    dim = features.shape[1]
    precision = np.linalg.pinv(covariance, rcond=dim * np.finfo(np.float64).eps, hermitian=True)
    background = np.linalg.pinv(singular, rcond=dim * np.finfo(np.float64).eps, hermitian=True)
    to_class = block[:, None, :] - features[:40][None, :, :]
    per_class = np.einsum("ncd,de,nce->nc", to_class, precision, to_class)
    to_centre = block - features.mean(axis=0)
    expected = per_class.min(axis=1) - np.einsum("nd,de,ne->n", to_centre, background, to_centre)
    # Two float64 routes to one quantity: relative error ~ D·eps·cond, far inside 1e-9 of the largest value.
    np.testing.assert_allclose(
        gaussians.relative_sq_distance(block), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max()
    )


def _total_covariance(fit: Outputs) -> np.ndarray:
    features = np.asarray(fit.features, dtype=np.float64)
    return np.cov(features.T, bias=True)


def test_blas_matmul_is_the_matrix_product_for_every_operand_layout():
    from oodbench.detectors._gaussian import blas_matmul

    rng = np.random.default_rng(3)
    for dtype, rtol in ((np.float32, 1e-5), (np.float64, 1e-13)):
        a = rng.normal(size=(37, 11)).astype(dtype)
        b = rng.normal(size=(11, 5)).astype(dtype)
        expected = a.astype(np.float64) @ b.astype(np.float64)
        for right in (b, np.asfortranarray(b), np.ascontiguousarray(b.T).T):  # C-ordered, Fortran, a transposed view
            np.testing.assert_allclose(blas_matmul(a, right), expected, rtol=rtol, atol=rtol)
            out = np.full((37, 5), np.nan, dtype=dtype)
            result = blas_matmul(a, right, out=out)
            assert np.shares_memory(result, out)
            np.testing.assert_allclose(out, expected, rtol=rtol, atol=rtol)
