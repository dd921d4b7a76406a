"""ViM and NNGuide: hand cases, slow references (the papers' code flow), invariances, requirements."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.covariance import EmpiricalCovariance

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create
from oodbench.detectors.hybrid import vim_default_dim


def slow_vim(problem, dim):
    """The ViM reference flow: u = -pinv(W) b, EmpiricalCovariance about u, eig, null space, alpha, per-sample score."""
    weight, bias = problem.weight, problem.bias
    fit = np.asarray(problem.fit.features, dtype=np.float64)
    u = -np.linalg.pinv(weight) @ bias
    covariance = EmpiricalCovariance(assume_centered=True).fit(fit - u).covariance_
    values, vectors = np.linalg.eig(covariance)
    null_space = np.real(vectors.T[np.argsort(-np.real(values))[dim:]]).T
    fit_logits = np.asarray(problem.fit.logits, dtype=np.float64)
    alpha = fit_logits.max(axis=1).mean() / np.linalg.norm((fit - u) @ null_space, axis=1).mean()
    scores = []
    for z, f in zip(
        np.asarray(problem.test.features, dtype=np.float64),
        np.asarray(problem.test.logits, dtype=np.float64),
        strict=False,
    ):
        scores.append(logsumexp(f) - alpha * np.linalg.norm((z - u) @ null_space))
    return np.array(scores)


def slow_nnguide(problem, k):
    """NNGuide with the whole fit set as the bank (alpha = 1): brute-force top-k inner products."""
    fit = np.asarray(problem.fit.features, dtype=np.float64)
    bank = (
        fit
        / np.linalg.norm(fit, axis=1, keepdims=True)
        * logsumexp(np.asarray(problem.fit.logits, dtype=np.float64), axis=1)[:, None]
    )
    scores = []
    for z, f in zip(
        np.asarray(problem.test.features, dtype=np.float64),
        np.asarray(problem.test.logits, dtype=np.float64),
        strict=False,
    ):
        products = sorted((float(z @ b) / np.linalg.norm(z) for b in bank), reverse=True)
        scores.append(logsumexp(f) * np.mean(products[:k]))
    return np.array(scores)


@pytest.mark.parametrize("dim", [2, 4, 9])  # 2: alpha from the principal directions (2·dim < D − dim)
def test_vim_agrees_with_reference_flow(problem, agree, dim):
    fast = create("vim", dim=dim).fit(problem.fit, problem.head).score(problem.test)
    # ViM's alpha comes from float32 residual norms (~1e-6 relative, detectors/hybrid.py); the rest is float64.
    agree(fast, slow_vim(problem, dim), problem.n_id, rtol=1e-6)


def test_vim_default_dimension_rule(problem):
    assert [vim_default_dim(d) for d in (4096, 2048, 1024, 768, 512, 12)] == [1000, 1000, 512, 512, 256, 6]
    assert create("vim").fit(problem.fit, problem.head).dim_ == problem.fit.num_features // 2


def test_vim_hand_computed():
    # Head with zero bias: u = 0. Fit features spread along x only; with dim = 1 the residual is |y|.
    head = Head(np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32), np.zeros(2, dtype=np.float32))
    fit_z = np.array([[x, y] for x in (2.0, -2.0, 4.0, -4.0) for y in (0.5, -0.5)], dtype=np.float32)
    fit = Outputs(fit_z, head.logits(fit_z).astype(np.float32))
    detector = create("vim", dim=1).fit(fit, head)
    assert detector.alpha_ == pytest.approx(3.0 / 0.5)  # mean max-logit |x| = 3, every residual |y| = 0.5
    z = np.array([[1.0, 2.0]], dtype=np.float32)
    residual = detector._residual_norm(z.astype(np.float64))[0]
    expected = math.log(math.exp(1.0) + math.exp(-1.0)) - detector.alpha_ * residual
    assert detector.score(Outputs(z, head.logits(z).astype(np.float32)))[0] == pytest.approx(expected)
    assert residual == pytest.approx(2.0)


def test_vim_is_invariant_to_rotating_features_and_head(problem):
    rng = np.random.default_rng(5)
    rotation, _ = np.linalg.qr(rng.normal(size=(problem.fit.num_features,) * 2))
    head = Head((problem.weight @ rotation.T).astype(np.float64), problem.bias)

    def rotate(outputs: Outputs) -> Outputs:
        return Outputs(np.asarray(outputs.features, dtype=np.float64) @ rotation.T, outputs.logits, outputs.labels)

    plain = create("vim", dim=5).fit(problem.fit, problem.head).score(problem.test)
    rotated = create("vim", dim=5).fit(rotate(problem.fit), head).score(rotate(problem.test))
    # Rotated float64 features, alpha from float32 residual norms on each side: ~1e-6 relative as above.
    np.testing.assert_allclose(rotated, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [1, 20])
def test_nnguide_agrees_with_brute_force(problem, agree, k):
    fast = create("nnguide", k=k, alpha=1.0).fit(problem.fit).score(problem.test)
    agree(fast, slow_nnguide(problem, k), problem.n_id, rtol=1e-5)  # faiss inner products in float32


def test_nnguide_bank_is_a_seeded_fraction(problem):
    first = create("nnguide", k=5, alpha=0.1, seed=3).fit(problem.fit)
    again = create("nnguide", k=5, alpha=0.1, seed=3).fit(problem.fit)
    other = create("nnguide", k=5, alpha=0.1, seed=4).fit(problem.fit)
    assert first.bank_rows_.shape == (int(len(problem.fit) * 0.1),)
    assert len(set(first.bank_rows_)) == first.bank_rows_.shape[0]
    np.testing.assert_array_equal(first.bank_rows_, again.bank_rows_)
    assert not np.array_equal(first.bank_rows_, other.bank_rows_)
    np.testing.assert_array_equal(first.score(problem.test), again.score(problem.test))


def test_nnguide_hand_computed():
    fit_z = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    fit_logits = np.array([[1.0, 0.0], [0.0, 3.0]], dtype=np.float32)
    detector = create("nnguide", k=1, alpha=1.0).fit(Outputs(fit_z, fit_logits))
    energies = [math.log(math.e + 1.0), math.log(1.0 + math.exp(3.0))]
    test = Outputs(np.array([[3.0, 3.0]], dtype=np.float32), np.array([[0.5, 0.5]], dtype=np.float32))
    expected = math.log(2 * math.exp(0.5)) * max(energies) / math.sqrt(2.0)
    # faiss's float32 cosines of 2-D unit rows (≤ 4·eps32 ≈ 5e-7 each) times a float64 energy: rel 1e-6.
    assert detector.score(test)[0] == pytest.approx(expected, rel=1e-6)


def test_nnguide_bank_smaller_than_k_is_rejected(problem):
    with pytest.raises(DetectorError, match="bank holds"):
        create("nnguide").fit(problem.fit)  # 1% of 400 rows = 4 < k = 100


@pytest.mark.parametrize("name", ["vim", "nnguide"])
def test_logits_are_required(problem, name):
    with pytest.raises(DetectorError, match="logits"):
        create(name).fit(Outputs(problem.fit.features), problem.head)


def test_vim_needs_head_and_a_valid_dim(problem):
    with pytest.raises(DetectorError, match="head"):
        create("vim").fit(problem.fit)
    with pytest.raises(DetectorError, match="dim"):
        create("vim", dim=problem.fit.num_features).fit(problem.fit, problem.head)
    with pytest.raises(DetectorError, match="dim"):
        create("vim", dim=0)


def _vim_fit_set(variances: np.ndarray, rows: int = 400, classes: int = 5, seed: int = 5):
    """Rows about the origin of a bias-free head (u = 0) with the given variance per direction, and the head."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(len(variances), len(variances))))[0]
    features = ((rng.normal(size=(rows, len(variances))) * np.sqrt(variances)) @ basis.T + basis[:, 0] * 3.0).astype(
        np.float32
    )
    head = Head(rng.normal(size=(classes, len(variances))).astype(np.float32), np.zeros(classes, np.float32))
    return Outputs(features, head.logits(features), np.arange(rows) % classes), head


@pytest.mark.parametrize("dim", [4, 8])  # 4: the residual as ‖x‖² − ‖x V‖² in float64; 8: projected in float32
def test_vim_refuses_fit_features_spanning_no_more_than_dim_directions(dim):
    # Rank 3 about the origin: the residual off any 4 or 8 principal directions is zero but for rounding, so alpha
    # (mean max-logit / mean residual) would be set by rounding, and differ with the order of the fit rows.
    fit, head = _vim_fit_set(np.array([4.0, 2.0, 1.0] + [0.0] * 13))
    with pytest.raises(
        DetectorError, match=r"vim: .*within its rounding error: they span at most 3 of the 16 .*dim < 3"
    ):
        create("vim", dim=dim).fit(fit, head)


def test_vim_fits_a_small_but_real_residual():
    # The 8 residual directions carry 1e-6 of the top variance: far above the rounding of a float64 moment (~1e-13
    # of its trace) and of the float32 projections (γ_16 of the squared norm), so alpha is defined and the fit runs.
    fit, head = _vim_fit_set(np.array([4.0, 3.0, 2.0, 1.5, 1.0, 0.8, 0.6, 0.5] + [4e-6] * 8))
    detector = create("vim", dim=8).fit(fit, head)
    assert np.isfinite(detector.alpha_) and detector.alpha_ > 0


@pytest.mark.parametrize("params", [{"alpha": 0.0}, {"alpha": 1.5}, {"k": 0}, {"seed": -1}])
def test_nnguide_bad_parameters(params):
    with pytest.raises(DetectorError):
        create("nnguide", **params)
