"""Mahalanobis family, k-NN, cosine, MCM, fDBD, NECO: hand cases, slow references, invariances, requirements."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create
from oodbench.detectors.feature import (
    _ivf_lists,
    default_nlist,
    flat_search,
    flat_top_similarities,
    ivf_kth_similarity,
)


def _rows(outputs: Outputs) -> np.ndarray:
    return np.asarray(outputs.features, dtype=np.float64)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- slow references
def slow_mahalanobis(problem, relative=False, normalize=False):
    """OpenOOD-style: sklearn EmpiricalCovariance on class-centred features, a loop over samples and classes."""
    features, labels = _rows(problem.fit), problem.fit.labels
    test = _rows(problem.test)
    if normalize:
        features, test = _unit(features), _unit(test)
    classes = np.unique(labels)
    means = {c: features[labels == c].mean(axis=0) for c in classes}
    centred = np.concatenate([features[labels == c] - means[c] for c in classes])
    precision = EmpiricalCovariance(assume_centered=True).fit(centred).precision_
    background = EmpiricalCovariance(assume_centered=False).fit(features)
    scores = []
    for z in test:
        distances = [float((z - means[c]) @ precision @ (z - means[c])) for c in classes]
        if relative:
            d0 = float((z - background.location_) @ background.precision_ @ (z - background.location_))
            distances = [d - d0 for d in distances]
        scores.append(-min(distances))
    return np.array(scores)


def slow_knn(problem, k):
    bank = _unit(_rows(problem.fit))
    scores = []
    for z in _unit(_rows(problem.test)):
        distances = sorted(float(np.linalg.norm(z - x)) for x in bank)
        scores.append(-distances[k - 1])
    return np.array(scores)


def slow_centroid_cosines(problem):
    features, labels = _rows(problem.fit), problem.fit.labels
    centroids = [features[labels == c].mean(axis=0) for c in np.unique(labels)]
    return [[float(z @ m / (np.linalg.norm(z) * np.linalg.norm(m))) for m in centroids] for z in _rows(problem.test)]


def slow_fdbd(problem):
    mean = _rows(problem.fit).mean(axis=0)
    weight = problem.weight
    scores = []
    for z, f in zip(_rows(problem.test), np.asarray(problem.test.logits, dtype=np.float64), strict=True):
        top = int(np.argmax(f))
        terms = [abs(f[top] - f[c]) / np.linalg.norm(weight[top] - weight[c]) for c in range(len(f)) if c != top]
        scores.append(np.mean(terms) / np.linalg.norm(z - mean))
    return np.array(scores)


def slow_neco(problem, dim, use_maxlogit=False):
    """The reference's flow: StandardScaler, full PCA, norm of the first `dim` coordinates over the full norm."""
    scaler = StandardScaler().fit(_rows(problem.fit))
    pca = PCA(problem.fit.num_features).fit(scaler.transform(_rows(problem.fit)))
    standardised = scaler.transform(_rows(problem.test))
    reduced = pca.transform(standardised)[:, :dim]
    scores = np.array([np.linalg.norm(r) / np.linalg.norm(s) for r, s in zip(reduced, standardised, strict=True)])
    if use_maxlogit:
        scores = scores * np.asarray(problem.test.logits, dtype=np.float64).max(axis=1)
    return scores


# ----------------------------------------------------------------------------- agreement
@pytest.mark.parametrize(
    "name,relative,normalize",
    [("maha", False, False), ("rmaha", True, False), ("maha++", False, True), ("rmaha++", True, True)],
)
def test_mahalanobis_family_agrees_with_slow_reference(problem, agree, name, relative, normalize):
    fast = create(name).fit(problem.fit).score(problem.test)
    # Both float64 from the same float32 features (D = 12, a well-conditioned covariance): the whitening and the
    # reference's solve differ by ~κ·D·eps64 ≲ 1e-12 relative; 1e-9 leaves room for κ up to 1e3.
    agree(fast, slow_mahalanobis(problem, relative, normalize), problem.n_id, rtol=1e-9)


@pytest.mark.parametrize("k", [1, 7, 50])
def test_knn_agrees_with_brute_force(problem, agree, k):
    fast = create("knn", k=k).fit(problem.fit).score(problem.test)
    agree(fast, slow_knn(problem, k), problem.n_id, rtol=1e-4)  # faiss works in float32


def test_knn_ivf_probing_every_list_is_exact(problem):
    flat = create("knn", k=5).fit(problem.fit).score(problem.test)
    ivf = create("knn", k=5, index="ivf", nlist=8, nprobe=8).fit(problem.fit).score(problem.test)
    # Probing every list finds the same neighbours; their float32 inner products of unit vectors (D terms) may be
    # summed in another order: each within γ_D = D·u/(1 − D·u), u = 2^-24, so two differ by ≤ 2γ_D, and a distance
    # √(2 − 2s) by ≤ 2γ_D / d.
    dim = problem.fit.num_features
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    np.testing.assert_allclose(ivf, flat, rtol=0, atol=2 * gamma / np.abs(flat).min())


def test_knn_ivf_probing_every_list_is_exact_on_clustered_rows_with_ties():
    """Tight clusters, every fit row three times (ties at every rank), k inside and at the edge of a tie group.

    Probing all lists scans every row once, so the k-th similarity is the brute-force one up to float32 rounding of
    a D-term inner product of unit vectors (gamma_D = D u / (1 - D u), u = 2^-24; the float64 reference adds far
    less): 2 gamma_D bounds the difference.
    """
    rng = np.random.default_rng(7)
    dim, clusters = 16, 6
    centres = rng.standard_normal((clusters, dim)) * 3.0
    base = centres[rng.integers(0, clusters, 60)] + 0.05 * rng.standard_normal((60, dim))
    fit = np.repeat(base, 3, axis=0).astype(np.float32)  # ties: each row three times
    test = (centres[rng.integers(0, clusters, 25)] + 0.05 * rng.standard_normal((25, dim))).astype(np.float32)
    bank, queries = _unit(fit.astype(np.float64)), _unit(test.astype(np.float64))
    bound = 2 * dim * 2.0**-24 / (1 - dim * 2.0**-24)
    for k in (1, 3, 4, 30):
        detector = create("knn", k=k, index="ivf", nlist=clusters, nprobe=clusters).fit(Outputs(fit))
        kth = -np.sort(-(queries @ bank.T), axis=1)[:, k - 1]
        # knn's score is -sqrt(2 - 2 s): back to the similarity s (in float64, exact up to rounding of 1e-16).
        found = 1.0 - detector.score(Outputs(test)) ** 2 / 2.0
        np.testing.assert_allclose(found, kth, rtol=0, atol=bound)


def test_the_default_number_of_lists_follows_k_within_its_bounds():
    """About N/k lists, clipped to [sqrt(N), 4 sqrt(N)] and to >= 39 rows per list where sqrt(N) allows."""
    assert default_nlist(1_281_167, 1000) == 1281  # N/k inside [1,132, 4,528]
    assert default_nlist(64_058, 1000) == 253  # N/k = 64 < sqrt(N) = 253.1
    assert default_nlist(64_058, 50) == 1012  # N/k = 1,281 > 4 sqrt(N) = 1,012.4 (< N/39 = 1,642)
    assert default_nlist(5_000, 5) == 128  # 4 sqrt(N) = 283 > N/39 = 128.2 > sqrt(N) = 70.7
    assert default_nlist(200, 5) == 14  # N/39 = 5.1 < sqrt(N) = 14.1: sqrt(N) wins
    for rows in (1, 2, 10, 999, 10_000, 123_457):
        for k in (1, 7, 1000):
            nlist = default_nlist(rows, k)
            assert 1 <= nlist <= rows
            assert round(math.sqrt(rows)) <= nlist <= max(round(math.sqrt(rows)), round(4 * math.sqrt(rows)))


def test_knn_ivf_fits_the_default_number_of_lists(problem):
    detector = create("knn", k=5, index="ivf").fit(problem.fit)
    assert detector.nlist_ == detector.index_.nlist == default_nlist(len(problem.fit), 5)


def test_knn_ivf_with_too_few_probed_neighbours_fails_clearly(make):
    problem = make(seed=3, fit_rows=200)
    detector = create("knn", k=150, index="ivf", nlist=5, nprobe=1).fit(problem.fit)
    with pytest.raises(DetectorError, match="nprobe"):
        detector.score(problem.test)


def test_cosine_and_mcm_agree_with_slow_reference(problem, agree):
    cosines = slow_centroid_cosines(problem)
    # The cosines come from a float32 product (|cos| <= 1, so ~1e-7 absolute).
    agree(
        create("cosine").fit(problem.fit).score(problem.test),
        np.array([max(row) for row in cosines]),
        problem.n_id,
        rtol=1e-6,
    )
    for tau in (1.0, 0.1):
        slow = np.array([max(math.exp(c / tau) for c in row) / sum(math.exp(c / tau) for c in row) for row in cosines])
        # Cosines off by ~1e-7 (above) become logits c/τ off by 1e-6 at τ = 0.1; a softmax moves relatively by at
        # most twice its logits' largest error: 2e-6.
        agree(create("mcm", temperature=tau).fit(problem.fit).score(problem.test), slow, problem.n_id, rtol=1e-5)


def test_fdbd_agrees_with_slow_reference(problem, agree):
    fast = create("fdbd").fit(problem.fit, problem.head).score(problem.test)
    # float64 on both sides from the same float32 features and logits: a few eps64 per term of sums over C = 5.
    agree(fast, slow_fdbd(problem), problem.n_id, rtol=1e-10)


@pytest.mark.parametrize("dim,use_maxlogit", [(3, False), (8, True)])
def test_neco_agrees_with_slow_reference(problem, agree, dim, use_maxlogit):
    fast = create("neco", dim=dim, use_maxlogit=use_maxlogit).fit(problem.fit).score(problem.test)
    # float64 PCA on both sides (D = 12): the principal subspace is fixed to ~eps64·‖Σ‖/gap ≲ 1e-13 for this problem's
    # eigen-gaps; 1e-9 leaves room.
    agree(fast, slow_neco(problem, dim, use_maxlogit), problem.n_id, rtol=1e-9)


def test_neco_explained_variance_dimension(problem):
    detector = create("neco", dim=0.9).fit(problem.fit)
    ratios = PCA().fit(StandardScaler().fit_transform(_rows(problem.fit))).explained_variance_ratio_
    assert detector.dim_ == int(np.searchsorted(np.cumsum(ratios), 0.9) + 1)


# ----------------------------------------------------------------------------- hand-computed cases
def _one_d(values, labels=None) -> Outputs:
    return Outputs(
        np.array(values, dtype=np.float32).reshape(-1, 1), labels=None if labels is None else np.array(labels)
    )


def test_mahalanobis_hand_computed():
    fit = _one_d([-1.0, 1.0, 9.0, 11.0], [0, 0, 1, 1])  # means 0 and 10, within-class variance 1
    test = _one_d([3.0])
    assert create("maha").fit(fit).score(test)[0] == pytest.approx(-9.0)
    # Background: mean 5, variance (36 + 16 + 16 + 36) / 4 = 26.
    assert create("rmaha").fit(fit).score(test)[0] == pytest.approx(-(9.0 - 4.0 / 26.0))


def test_mahalanobis_ignores_absent_class_indices():
    fit = _one_d([-1.0, 1.0, 9.0, 11.0], [0, 0, 3, 3])  # classes 1 and 2 never occur
    detector = create("maha").fit(fit)
    np.testing.assert_array_equal(detector.classes_, [0, 3])
    assert detector.score(_one_d([3.0]))[0] == pytest.approx(-9.0)


def test_knn_hand_computed():
    fit = Outputs(np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0]], dtype=np.float32))
    test = Outputs(np.array([[5.0, 5.0]], dtype=np.float32))
    # Unit vectors at 0, 90 and 180 degrees; the query at 45 degrees.
    # faiss: float32 unit vectors, cosine within ~3·eps32 ≈ 4e-7; the distance √(2 − 2 cos) ≥ 0.76 here moves by
    # at most that / 0.76: rel 1e-6.
    assert create("knn", k=1).fit(fit).score(test)[0] == pytest.approx(
        -math.sqrt(2 - 2 * math.cos(math.pi / 4)), rel=1e-6
    )
    assert create("knn", k=3).fit(fit).score(test)[0] == pytest.approx(
        -math.sqrt(2 - 2 * math.cos(3 * math.pi / 4)), rel=1e-6
    )


def test_cosine_and_mcm_hand_computed():
    fit = Outputs(np.array([[2.0, 0.0], [4.0, 0.0], [0.0, 1.0]], dtype=np.float32), labels=np.array([0, 0, 1]))
    test = Outputs(np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32))
    # float32 cosines of 2-D rows: ≤ 4·eps32 ≈ 5e-7 on values ≥ 0.7; MCM's softmax of two adds a few eps.
    np.testing.assert_allclose(create("cosine").fit(fit).score(test), [1.0, math.sqrt(0.5)], rtol=1e-6)
    np.testing.assert_allclose(create("mcm").fit(fit).score(test), [math.e / (math.e + 1.0), 0.5], rtol=1e-6)


def test_fdbd_hand_computed():
    head = Head(np.eye(2, dtype=np.float32), np.zeros(2, dtype=np.float32))
    fit = Outputs(np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32))  # mean 0
    z = np.array([[3.0, 1.0]], dtype=np.float32)
    score = create("fdbd").fit(fit, head).score(Outputs(z, z.copy()))[0]
    assert score == pytest.approx((2.0 / math.sqrt(2.0)) / math.sqrt(10.0))


def test_neco_full_dimension_scores_one(problem):
    scores = create("neco", dim=problem.fit.num_features).fit(problem.fit).score(problem.test)
    np.testing.assert_allclose(scores, 1.0, rtol=1e-10)


# ----------------------------------------------------------------------------- invariances
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_mahalanobis_is_affine_invariant(seed):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(120, 4)) + rng.integers(0, 3, size=(120, 1))
    labels = rng.integers(0, 3, 120)
    test = rng.normal(size=(30, 4)) * 2
    transform = rng.normal(size=(4, 4)) + 3 * np.eye(4)
    offset = rng.normal(size=4)
    for name in ("maha", "rmaha"):
        plain = create(name).fit(Outputs(features, labels=labels)).score(Outputs(test))
        moved = (
            create(name)
            .fit(Outputs(features @ transform.T + offset, labels=labels))
            .score(Outputs(test @ transform.T + offset))
        )
        # The moved features are stored as float32 (u = 6e-8 relative per entry) and T·Σ·Tᵀ is less well conditioned
        # than Σ by up to κ(T)² (≲ 10 for N(0, 1) + 3I in 4-D): ≲ 2·κ(T)²·u ≈ 1e-6 relative on a distance.
        np.testing.assert_allclose(moved, plain, rtol=1e-6, atol=1e-6 * np.abs(plain).max())


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_normalised_detectors_ignore_per_row_rescaling(seed):
    rng = np.random.default_rng(seed)
    features = np.abs(rng.normal(size=(150, 5))) + rng.integers(0, 3, size=(150, 1))
    labels = rng.integers(0, 3, 150)
    test = np.abs(rng.normal(size=(25, 5))) * 2
    fit_scale = rng.uniform(0.1, 10.0, size=(150, 1))
    test_scale = rng.uniform(0.1, 10.0, size=(25, 1))
    # Rescaled rows are stored as float32 (u = 6e-8 relative) and re-normalised: maha++ moves by ~κ(Σ)·u ≲ 1e-6;
    # knn's float32 cosines (~4e-7) on distances that can be ~1e-2 small give ~1e-4 relative.
    for name, params, tolerance in [("maha++", {}, 1e-6), ("rmaha++", {}, 1e-6), ("knn", {"k": 3}, 1e-4)]:
        plain = create(name, **params).fit(Outputs(features, labels=labels)).score(Outputs(test))
        scaled = (
            create(name, **params).fit(Outputs(features * fit_scale, labels=labels)).score(Outputs(test * test_scale))
        )
        np.testing.assert_allclose(scaled, plain, rtol=tolerance, atol=tolerance * max(1.0, np.abs(plain).max()))
    for name in ("cosine", "mcm"):  # class means use raw features: only the test rows may be rescaled
        fitted = create(name).fit(Outputs(features, labels=labels))
        # float32 cosines of 5-D rows: each within (D + 2)·u ≈ 4.2e-7 (u = 2^-24), so two within 8.4e-7 < 1e-6.
        np.testing.assert_allclose(fitted.score(Outputs(test * test_scale)), fitted.score(Outputs(test)), rtol=1e-6)


def test_knn_with_k1_scores_fit_points_maximally(problem):
    detector = create("knn", k=1).fit(problem.fit)
    on_fit = detector.score(problem.fit)
    elsewhere = detector.score(problem.test)
    assert np.all(on_fit > -1e-3)  # distance to itself is 0 (up to float32 round-off)
    # Test rows are not fit rows: each lies farther from its nearest fit row than any fit row from itself.
    assert elsewhere.max() < on_fit.min()
    assert np.all(elsewhere <= 1e-12)


def test_fdbd_ignores_a_common_logit_shift(problem):
    detector = create("fdbd").fit(problem.fit, problem.head)
    shifted = Outputs(problem.test.features, problem.test.logits + np.float32(7.0))
    # logits + 7 rounded to float32 move by ≤ (|f| + 7)·eps32/2 ≈ 1e-6 each; FDBD divides logit gaps of ≳ 0.05 by
    # the weight distances: ≤ 2e-6 / 0.05 = 4e-5 relative.
    np.testing.assert_allclose(detector.score(shifted), detector.score(problem.test), rtol=1e-4)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_neco_ignores_per_feature_affine_maps(seed):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
    test = rng.normal(size=(20, 6)) * 1.5
    scale, shift = rng.uniform(0.5, 4.0, size=6), rng.normal(size=6) * 3
    plain = create("neco", dim=2).fit(Outputs(features)).score(Outputs(test))
    moved = create("neco", dim=2).fit(Outputs(features * scale + shift)).score(Outputs(test * scale + shift))
    # Moved features stored as float32 (u = 6e-8) through a per-dimension scale of ≤ 8×: ≲ 16·u ≈ 1e-6 on a norm ratio.
    np.testing.assert_allclose(moved, plain, rtol=1e-6)


# ----------------------------------------------------------------------------- requirements and parameters
@pytest.mark.parametrize("name", ["maha", "rmaha", "maha++", "rmaha++", "cosine", "mcm"])
def test_labels_are_required(problem, name):
    with pytest.raises(DetectorError, match="labels"):
        create(name).fit(Outputs(problem.fit.features, problem.fit.logits))


def test_negative_labels_are_rejected():
    with pytest.raises(DetectorError, match="non-negative"):
        create("maha").fit(Outputs(np.ones((3, 2), dtype=np.float32) * [[1], [2], [3]], labels=np.array([0, -1, 1])))


def test_knn_k_larger_than_fit_set_is_rejected(problem):
    with pytest.raises(DetectorError, match="exceeds the fit set"):
        create("knn").fit(problem.fit)  # default k = 1000 > 400 rows


@pytest.mark.parametrize("params", [{"k": 0}, {"index": "hnsw"}, {"nprobe": 0}, {"nlist": -3}])
def test_knn_bad_parameters(params):
    with pytest.raises(DetectorError, match="knn"):
        create("knn", **params)


@pytest.mark.parametrize("params", [{"dim": 0}, {"dim": 1.5}, {"dim": True}, {"use_maxlogit": "yes"}])
def test_neco_bad_parameters(params):
    with pytest.raises(DetectorError, match="neco"):
        create("neco", **params)


def test_neco_dim_above_feature_size_is_rejected(problem):
    with pytest.raises(DetectorError, match="exceeds the feature dimension"):
        create("neco", dim=problem.fit.num_features + 1).fit(problem.fit)


def test_neco_with_maxlogit_needs_logits(problem):
    detector = create("neco", dim=3, use_maxlogit=True).fit(problem.fit)
    with pytest.raises(DetectorError, match="logits"):
        detector.score(Outputs(problem.test.features))


def test_fdbd_rejects_identical_head_rows():
    head = Head(np.ones((2, 3), dtype=np.float32), np.zeros(2, dtype=np.float32))
    with pytest.raises(DetectorError, match="identical"):
        create("fdbd").fit(Outputs(np.eye(3, dtype=np.float32)), head)


def test_maha_names_singleton_classes_as_a_cause_of_a_zero_covariance():
    # Three distinct rows, one class each: every row is its class mean, so the within-class covariance is zero
    # although the features differ; the message must name that cause, not only identical features.
    fit = Outputs(np.eye(3, dtype=np.float32), labels=np.arange(3))
    with pytest.raises(DetectorError, match="every class holds a single row"):
        create("maha").fit(fit)


def test_mcm_temperature_must_be_positive():
    with pytest.raises(DetectorError, match="temperature"):
        create("mcm", temperature=0.0)


def _ivf_fitted(problem, nlist, nprobe, k):
    detector = create("knn", k=k, index="ivf", nlist=nlist, nprobe=nprobe).fit(problem.fit)
    return detector, _unit(_rows(problem.test)).astype(np.float32)


def slow_ivf_kth(index, queries, k):
    """Per query, in float64: the vectors of the nprobe lists whose centroids have the largest inner products."""
    centroids, lists = _ivf_lists(index)
    out = []
    for z in queries.astype(np.float64):
        coarse = [float(z @ c) for c in centroids.astype(np.float64)]
        chosen = sorted(range(len(coarse)), key=lambda i: -coarse[i])[: index.nprobe]
        similarities = sorted((float(z @ v) for i in chosen for v in lists[i].astype(np.float64)), reverse=True)
        out.append(similarities[k - 1])
    return np.array(out)


@pytest.mark.parametrize(("nlist", "nprobe", "k"), [(8, 3, 5), (8, 1, 1), (5, 5, 40), (12, 4, 17)])
def test_ivf_search_by_lists_agrees_with_a_slow_reference_and_with_faiss(problem, nlist, nprobe, k):
    """The list-by-list BLAS search returns faiss's k-th similarity: same probed lists, same candidates.

    Unit vectors in float32: an inner product of D terms is off by at most gamma_D = D u / (1 - D u), u = 2^-24,
    from the exact one, and the k-th largest of perturbed values moves by at most the largest perturbation; the
    float64 reference adds its own (far smaller) error, so 2 gamma_D bounds both comparisons.
    """
    detector, queries = _ivf_fitted(problem, nlist, nprobe, k)
    centroids, lists = _ivf_lists(detector.index_)
    kth, probed = ivf_kth_similarity(queries, centroids, lists, nprobe, k)
    unit = 2.0**-24
    dim = queries.shape[1]
    bound = 2 * dim * unit / (1 - dim * unit)
    assert (probed >= k).all()
    np.testing.assert_allclose(kth, slow_ivf_kth(detector.index_, queries, k), rtol=0, atol=bound)
    faiss_kth = detector.index_.search(queries, k)[0][:, -1]
    np.testing.assert_allclose(kth, faiss_kth, rtol=0, atol=bound)


def test_knn_ivf_lists_and_probes_come_from_the_centred_rows(make):
    """Rows are listed, and queries probe, by the centred normalised rows; similarities are of the uncentred ones.

    The sample is every fit row here (64 x nlist > N), so the centre is the mean unit fit row (float32 of a
    float64 mean: 1e-7). The score is checked against a float64 reference that probes the same way, within
    2 gamma_D (float32 inner products of D terms of unit vectors; see the test above).
    """
    problem = make(seed=5, fit_rows=300)  # <= 64 x nlist: k-means samples every row
    nlist, nprobe, k = 6, 2, 5
    detector = create("knn", k=k, index="ivf", nlist=nlist, nprobe=nprobe).fit(problem.fit)
    bank = _unit(_rows(problem.fit))
    np.testing.assert_allclose(detector.centre_, bank.mean(axis=0), rtol=0, atol=1e-6)
    centre = detector.centre_.astype(np.float64)
    centroids, lists = _ivf_lists(detector.index_)
    centroids = centroids.astype(np.float64)
    for number, vectors in enumerate(lists):
        for row in vectors.astype(np.float64):
            assert int(np.argmax(_unit((row - centre)[None])[0] @ centroids.T)) == number
    queries = _unit(_rows(problem.test))
    expected = []
    for z in queries:
        chosen = np.argsort(-(_unit((z - centre)[None])[0] @ centroids.T))[:nprobe]
        similarities = np.sort(np.concatenate([lists[i].astype(np.float64) @ z for i in chosen]))[::-1]
        expected.append(similarities[k - 1])
    dim = queries.shape[1]
    found = 1.0 - detector.score(problem.test) ** 2 / 2.0  # knn's score -sqrt(2 - 2 s) back to s
    np.testing.assert_allclose(found, expected, rtol=0, atol=2 * dim * 2.0**-24 / (1 - dim * 2.0**-24))


def test_ivf_search_counts_the_vectors_each_query_probed(problem):
    """Fewer than k probed vectors leave -inf and a count below k (the detector turns it into its error)."""
    detector, queries = _ivf_fitted(problem, 8, 1, 1)
    centroids, lists = _ivf_lists(detector.index_)
    _, probed = ivf_kth_similarity(queries, centroids, lists, 1, 1)
    sizes = np.array([len(v) for v in lists])
    nearest = np.argmax(queries @ centroids.T, axis=1)
    np.testing.assert_array_equal(probed, sizes[nearest])
    too_many = int(sizes.max()) + 1
    kth, probed = ivf_kth_similarity(queries, centroids, lists, 1, too_many)
    assert (probed < too_many).all() and np.isneginf(kth).all()


def test_ivf_search_of_each_query_does_not_depend_on_the_others(problem):
    """Searched alone, one by one, each query gets its k-th similarity of the batch search (within 2 gamma_D)."""
    detector, queries = _ivf_fitted(problem, 6, 2, 9)
    centroids, lists = _ivf_lists(detector.index_)
    whole, _ = ivf_kth_similarity(queries, centroids, lists, 2, 9)
    alone = np.concatenate(
        [ivf_kth_similarity(queries[i : i + 1], centroids, lists, 2, 9)[0] for i in range(len(queries))]
    )
    dim, unit = queries.shape[1], 2.0**-24
    np.testing.assert_allclose(alone, whole, rtol=0, atol=2 * dim * unit / (1 - dim * unit))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    nlist=st.integers(1, 8),
    nprobe=st.integers(1, 8),
    k=st.integers(1, 60),
    width=st.one_of(st.none(), st.integers(1, 50)),
)
def test_ivf_search_returns_exactly_the_brute_force_kth_over_the_probed_lists(seed, nlist, nprobe, k, width):
    """The thresholded, buffered merge gives the k-th largest of a brute-force sort of the probed products, exactly.

    Integer entries in [-2, 2] (D <= 6): every inner product is an integer of magnitude <= 24, exact in float32
    whatever the order of the sum, so the comparison is exact (assert_array_equal) and ties are many. Lists of
    0 to 40 rows with k up to 60: k exceeds a list, and queries whose probed lists hold fewer than k rows get -inf.
    Small merge widths force the buffer to overflow and values wider than the buffer to merge directly. The
    centroids are the identity, so the coarse products are `probe_with` itself: a permutation per query, whose
    nprobe largest entries name the probed lists without ties.
    """
    rng = np.random.default_rng(seed)
    dim, rows = int(rng.integers(1, 7)), int(rng.integers(1, 30))
    lists = [rng.integers(-2, 3, (int(rng.integers(0, 41)), dim)).astype(np.float32) for _ in range(nlist)]
    queries = rng.integers(-2, 3, (rows, dim)).astype(np.float32)
    order = np.argsort(rng.random((rows, nlist)), axis=1).astype(np.float32)  # a permutation of 0..nlist-1 per row
    kth, probed = ivf_kth_similarity(
        queries, np.eye(nlist, dtype=np.float32), lists, nprobe, k, probe_with=order, merge_width=width
    )
    expected, counts = [], []
    for query, ranks in zip(queries, order, strict=True):
        chosen = np.argsort(-ranks)[: min(nprobe, nlist)]
        products = np.sort(np.concatenate([lists[i] @ query for i in chosen]))[::-1]
        counts.append(len(products))
        expected.append(products[k - 1] if len(products) >= k else -np.inf)
    np.testing.assert_array_equal(kth, np.array(expected, dtype=np.float32).astype(np.float64))
    np.testing.assert_array_equal(probed, counts)


def test_knn_ivf_split_across_cores_scores_as_one_search_within_the_products_rounding(problem, monkeypatch):
    """Threads over parts of the queries (each part's search on one BLAS thread) give the one search's scores, up
    to the float32 rounding of the per-list products (the BLAS may sum a product in another order for another
    number of rows)."""
    from oodbench.detectors import feature

    detector = create("knn", k=5, index="ivf", nlist=8, nprobe=3).fit(problem.fit)
    monkeypatch.setattr(feature, "ROWS_PER_SEARCH_THREAD", 10**9)  # one search over every row
    whole = detector.score(problem.test)
    monkeypatch.setattr(feature, "ROWS_PER_SEARCH_THREAD", 7)
    monkeypatch.setattr(feature, "blas_threads", lambda: 3)  # three uneven parts, whatever this machine has
    calls = []
    original = feature.ivf_kth_similarity

    def counted(queries, *args, **kwargs):
        calls.append(len(queries))
        return original(queries, *args, **kwargs)

    monkeypatch.setattr(feature, "ivf_kth_similarity", counted)
    parts = detector.score(problem.test)
    assert len(calls) == 3 and sum(calls) == len(problem.test)
    # Each product of two unit vectors of D float32 values is within gamma_D = D u / (1 - D u) (u = 2^-24) of the
    # exact one, so two summation orders differ by at most 2 gamma_D, and so does the k-th largest (an order
    # statistic moves no more than its inputs). The score is -sqrt(2 - 2 kth): two scores s1, s2 differ by
    # 2 |d kth| / (|s1| + |s2|).
    dim = problem.test.num_features
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    bound = 2 * (2 * gamma) / (np.abs(whole) + np.abs(parts))
    assert (np.abs(parts - whole) <= bound).all()


def test_knn_ivf_search_runs_one_search_per_blas_thread(problem, monkeypatch):
    """The number of searches is read before the BLAS is limited to one thread (inside that limit it reads 1)."""
    from oodbench.detectors import feature

    detector = create("knn", k=5, index="ivf", nlist=8, nprobe=3).fit(problem.fit)
    monkeypatch.setattr(feature, "ROWS_PER_SEARCH_THREAD", 7)
    seen = []
    original = feature.across_cores
    monkeypatch.setattr(
        feature,
        "across_cores",
        lambda search, rows, threads, *rest: seen.append(threads) or original(search, rows, threads, *rest),
    )
    with feature.one_blas_thread():
        detector.score(problem.test)
    assert seen and set(seen) == {1}
    seen.clear()
    detector.score(problem.test)
    assert seen and set(seen) == {feature.blas_threads()}


def test_the_search_uses_as_many_threads_as_the_blas_may():
    """OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or a Ray task's CPUs bound the BLAS's threads; the search follows them."""
    from threadpoolctl import threadpool_limits

    from oodbench.detectors import feature

    with threadpool_limits(1, user_api="blas"):
        assert feature.blas_threads() == 1
    assert 1 <= feature.blas_threads() <= feature.available_cores()


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(1, 60),
    block=st.integers(1, 70),
    k_share=st.floats(0.0, 1.0),
)
def test_the_exact_search_returns_exactly_the_brute_force_top_k(seed, size, block, k_share):
    """Blocks of the bank (one block, or several merged by the running top k) give a brute-force sort's k largest.

    Integer entries in [-2, 2] (D <= 6) make every product an exact small integer whatever the summation order,
    so the comparison is exact and ties are many; k runs from 1 to the whole bank, blocks from one row to more
    than the bank.
    """
    from oodbench.detectors import feature

    rng = np.random.default_rng(seed)
    dim, rows = int(rng.integers(1, 7)), int(rng.integers(1, 30))
    bank = rng.integers(-2, 3, (size, dim)).astype(np.float32)
    queries = rng.integers(-2, 3, (rows, dim)).astype(np.float32)
    k = 1 + int(k_share * (size - 1))
    original = feature.FLAT_BLOCK_ROWS
    feature.FLAT_BLOCK_ROWS = block
    try:
        top = flat_top_similarities(queries, bank, k)
    finally:
        feature.FLAT_BLOCK_ROWS = original
    expected = np.sort(queries @ bank.T, axis=1)[:, size - k :]
    np.testing.assert_array_equal(np.sort(top, axis=1), expected)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 60), block=st.integers(1, 70), k_share=st.floats(0, 1))
def test_the_indexed_search_returns_the_bank_rows_of_its_values(seed, size, block, k_share):
    """flat_top_candidates: the same k largest values as a brute-force sort, each with the distinct bank row it came
    from (integer rows: every product exact, ties many)."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(seed)
    dim, rows = int(rng.integers(1, 7)), int(rng.integers(1, 30))
    bank = rng.integers(-2, 3, (size, dim)).astype(np.float32)
    queries = rng.integers(-2, 3, (rows, dim)).astype(np.float32)
    k = 1 + int(k_share * (size - 1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(feature, "FLAT_BLOCK_ROWS", block)
        values, ids = feature.flat_top_candidates(queries, bank, k)
    products = queries @ bank.T
    np.testing.assert_array_equal(np.take_along_axis(products, ids, axis=1), values)
    np.testing.assert_array_equal(np.sort(values, axis=1), np.sort(products, axis=1)[:, size - k :])
    assert all(len(set(line)) == k for line in ids.tolist())


def _knn_problem(rng, dim, size, zero_rows, zero_query):
    """Raw fit and test features full of what breaks a float32 search: exact duplicates (ties), copies of the test
    rows in the bank (distance 0), copies moved by 1e-7 (distances at the products' rounding), zero rows."""
    base = rng.standard_normal((max(2, size // 3), dim)).astype(np.float32)
    bank = base[rng.integers(0, len(base), size)].copy()
    moved = rng.random(size) < 0.3
    bank[moved] += (1e-7 * rng.standard_normal((int(moved.sum()), dim))).astype(np.float32)
    if zero_rows:
        bank[rng.integers(0, size, zero_rows)] = 0.0
    test = np.concatenate([bank[rng.integers(0, size, 6)], base[:2] + np.float32(1e-6), rng.standard_normal((3, dim))])
    test = test.astype(np.float32)
    if zero_query:
        test[0] = 0.0
    return bank, test


def _brute_force_kth_distance(queries, bank, k):
    """The k-th smallest ‖q − b‖ over every bank row, each in float64 from the float32 rows."""
    difference = queries.astype(np.float64)[:, None, :] - bank.astype(np.float64)[None, :, :]
    squared = np.einsum("qnd,qnd->qn", difference, difference)
    return np.sqrt(np.sort(squared, axis=1)[:, k - 1])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(2, 70),
    k_share=st.floats(0, 1),
    block=st.integers(1, 80),
    zero_rows=st.integers(0, 2),
    zero_query=st.booleans(),
)
def test_knn_flat_scores_the_exact_kth_distance_whatever_the_rows_scored_with_it(
    seed, size, k_share, block, zero_rows, zero_query
):
    """knn (flat) against a float64 brute force on the very rows it searches (the stored unit rows, the queries
    normalised as it does): the k-th nearest distance to float64 rounding (each ‖q − b‖² a sum of D exact squares
    of float64 differences, within γ_D(2⁻⁵³) of exact in any order), 0 for a test row that repeats a fit row, and
    the same scored in one batch or row by row. Blocks from one row up, ties that overflow the candidates, zero
    rows and a zero query included."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(seed)
    dim = int(rng.integers(2, 25))
    k = 1 + int(k_share * (size - 1))
    bank, test = _knn_problem(rng, dim, size, zero_rows, zero_query)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(feature, "FLAT_BLOCK_ROWS", block)
        detector = create("knn", k=k).fit(Outputs(bank))
        scores = detector.score(Outputs(test))
        alone = np.concatenate([detector.score(Outputs(test[i : i + 1])) for i in range(len(test))])
    expected = _brute_force_kth_distance(feature.unit_float32(test), feature.flat_vectors(detector.index_), k)
    bound = 4 * dim * 2.0**-53
    np.testing.assert_allclose(-scores, expected, rtol=bound, atol=0)
    np.testing.assert_allclose(alone, scores, rtol=bound, atol=0)
    if k == 1:  # the first six test rows repeat fit rows (unless a zero row took their place)
        repeats = np.array([np.any(np.all(row == bank, axis=1)) and row.any() for row in test[:6]])
        assert (scores[:6][repeats] == 0.0).all()


def test_knn_searches_again_when_the_rows_within_rounding_of_the_kth_outnumber_its_candidates(monkeypatch):
    """60 copies of one row tie at the k-th product (k = 5): more than the k + 16 candidates kept, so which of
    them the float32 search kept says nothing; the queries whose rounding band may reach beyond their candidates
    are searched again with more, and the distance is still the brute force's."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(11)
    near = rng.standard_normal(16).astype(np.float32)
    bank = np.concatenate([np.repeat(near[None], 60, axis=0), rng.standard_normal((240, 16)).astype(np.float32)])
    test = np.stack([near + np.float32(1e-3), near, rng.standard_normal(16).astype(np.float32)])
    searches = []
    original = feature.exact_kth_distance

    def counted(*args, **kwargs):
        found, overflow = original(*args, **kwargs)
        searches.append((len(found), int(overflow.sum())))
        return found, overflow

    monkeypatch.setattr(feature, "exact_kth_distance", counted)
    detector = create("knn", k=5).fit(Outputs(bank))
    scores = detector.score(Outputs(test))
    assert searches[0] == (3, 2) and searches[1][0] == 2  # the two queries by the copies, searched again
    expected = _brute_force_kth_distance(feature.unit_float32(test), feature.flat_vectors(detector.index_), 5)
    np.testing.assert_allclose(-scores, expected, rtol=4 * 16 * 2.0**-53, atol=0)
    assert scores[1] == 0.0


def test_knn_exact_false_is_the_float32_products_distance_as_the_peers():
    """exact=False: sqrt(2 - 2 s_k) of the float32 k-th product (faiss's and the peers' distance), within the
    products' rounding of the exact one: |d² − (2 − 2 s_k)| <= 2γ_D + the norms' deviation from 1."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(4)
    bank, test = rng.standard_normal((300, 32)).astype(np.float32), rng.standard_normal((20, 32)).astype(np.float32)
    fast = create("knn", k=7, exact=False).fit(Outputs(bank))
    queries = feature.unit_float32(test)
    kth = feature.flat_search(queries, fast.index_, 7).min(axis=1).astype(np.float64)
    np.testing.assert_array_equal(fast.score(Outputs(test)), -np.sqrt(np.maximum(2.0 - 2.0 * kth, 0.0)))
    exact = create("knn", k=7).fit(Outputs(bank)).score(Outputs(test))
    gamma = 32 * 2.0**-24 / (1 - 32 * 2.0**-24)
    assert np.abs(fast.score(Outputs(test)) ** 2 - exact**2).max() <= 4 * gamma
    with pytest.raises(DetectorError, match="exact must be"):
        create("knn", exact="yes")


@pytest.mark.parametrize("scale", [1e-14, 1e-40, 1e20])
def test_knn_normalises_tiny_and_huge_fit_rows_to_unit_length(scale):
    """A fit row of norm 4e-14, of subnormal entries or of entries whose float32 squares overflow is stored as a unit
    vector (norms taken in float64), so the exact search accepts its own index and scores the row's copy 0."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(0)
    fit = rng.standard_normal((200, 16)).astype(np.float32)
    fit[0] *= np.float32(scale)
    detector = create("knn", k=1).fit(Outputs(fit))
    stored = feature.flat_vectors(detector.index_).astype(np.float64)
    assert abs(np.sum(stored[0] ** 2) - 1.0) <= 4 * 20 * 2.0**-24
    assert detector.score(Outputs(fit[:1]))[0] == 0.0


def test_knn_refuses_an_index_whose_rows_are_not_unit_vectors():
    """The exact distance's band is as wide as the rows' norms spread: an index of other rows (a forged saved file)
    is refused in one line rather than searched with ever more candidates."""
    from oodbench.detectors import feature

    rng = np.random.default_rng(2)
    detector = create("knn", k=3).fit(Outputs(rng.standard_normal((50, 8)).astype(np.float32)))
    feature.flat_vectors(detector.index_)[7] *= 2.0  # the index's own storage
    with pytest.raises(DetectorError, match="not unit vectors"):
        detector.score(Outputs(rng.standard_normal((4, 8)).astype(np.float32)))


def test_the_exact_search_refuses_more_neighbours_than_rows():
    with pytest.raises(DetectorError, match="k=4 exceeds the 3 rows"):
        flat_top_similarities(np.ones((2, 2), np.float32), np.ones((3, 2), np.float32), 4)


def test_the_exact_search_agrees_with_faiss_within_the_products_rounding(monkeypatch):
    """The k largest of faiss's own exact search and of the blocked BLAS products, on unit rows: each product of D
    terms is within gamma_D = D u / (1 - D u) (u = 2^-24) of the exact one in either computation, so they differ by
    at most 2 gamma_D, and so does each order statistic. Several blocks and parts across threads included."""
    faiss = pytest.importorskip("faiss")
    from oodbench.detectors import feature

    rng = np.random.default_rng(3)
    dim, k = 48, 25
    bank = rng.standard_normal((700, dim)).astype(np.float32)
    queries = rng.standard_normal((90, dim)).astype(np.float32)
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(bank)
    expected, _ = index.search(queries, k)  # descending
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    monkeypatch.setattr(feature, "FLAT_BLOCK_ROWS", 128)  # six blocks
    monkeypatch.setattr(feature, "FLAT_PART_WORK", 20 * 700 * dim)  # parts of 20 queries or more
    monkeypatch.setattr(feature, "blas_threads", lambda: 3)  # three parts, whatever this machine has
    top = -np.sort(-flat_search(queries, index, k), axis=1)
    assert np.abs(top.astype(np.float64) - expected).max() <= 2 * gamma


def test_the_exact_search_splits_the_queries_across_the_cores_as_one_search(monkeypatch):
    """Parts of the queries on threads give one search's values (integer rows: exact whatever the BLAS's order)."""
    faiss = pytest.importorskip("faiss")
    from oodbench.detectors import feature

    rng = np.random.default_rng(5)
    bank = rng.integers(-3, 4, (300, 8)).astype(np.float32)
    queries = rng.integers(-3, 4, (100, 8)).astype(np.float32)
    index = faiss.IndexFlatIP(8)
    index.add(bank)
    monkeypatch.setattr(feature, "FLAT_PART_WORK", 10**12)  # one search over every query
    whole = np.sort(flat_search(queries, index, 7), axis=1)
    calls = []
    original = feature.flat_top_similarities
    monkeypatch.setattr(feature, "flat_top_similarities", lambda q, b, k: calls.append(len(q)) or original(q, b, k))
    monkeypatch.setattr(feature, "FLAT_PART_WORK", 30 * 300 * 8)  # parts of at least 30 queries
    monkeypatch.setattr(feature, "blas_threads", lambda: 3)
    parts = np.sort(flat_search(queries, index, 7), axis=1)
    assert sorted(calls) == [33, 33, 34]
    np.testing.assert_array_equal(parts, whole)
