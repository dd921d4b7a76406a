"""Shared fit statistics: fit_all equals fitting alone, in one pass over the fit set, wired into evaluate and tune."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import _gaussian, available, create, tune
from oodbench.detectors.shared import STATISTICS, FitStatistics, declared_statistics, fit_all
from oodbench.evaluation.evaluate import evaluate_outputs

SHARING = (
    "maha",
    "rmaha",
    "maha++",
    "rmaha++",
    "neco",
    "vim",
    "cosine",
    "mcm",
    "fdbd",
    "dice",
    "kl_matching",
    "residual",
)


@pytest.fixture
def accumulators(monkeypatch):
    """Every ScatterAccumulator built from now on (one per accumulated pass of features)."""
    built = []
    original = _gaussian.ScatterAccumulator.__init__

    def counting(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(_gaussian.ScatterAccumulator, "__init__", counting)
    return built


def test_every_declared_statistic_is_known():
    for name in available():
        assert declared_statistics(create(name)) <= set(STATISTICS)
    assert {name for name in available() if declared_statistics(create(name))} == set(SHARING)


def test_fit_all_equals_fitting_each_alone(problem, small_params):
    names = available()
    alone = [create(name, **small_params.get(name, {})).fit(problem.fit, problem.head) for name in names]
    together = fit_all([create(name, **small_params.get(name, {})) for name in names], problem.fit, problem.head)
    for name, single, shared in zip(names, alone, together, strict=True):
        expected, got = single.score(problem.test), shared.score(problem.test)
        # The same float64 statistics, summed about a different shift at most: equal to float64 rounding.
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max(), err_msg=name)


def test_fit_all_reads_the_features_once(problem, small_params, accumulators):
    detectors = [create(name, **small_params.get(name, {})) for name in SHARING]
    stats = FitStatistics.for_detectors(problem.fit, detectors, problem.head)
    for detector in detectors:
        detector.fit(problem.fit, problem.head, stats=stats)
    assert stats.passes == 1
    # One accumulator for the raw features (Gram, class sums, mean) and one for the normalised ones.
    assert len(accumulators) == 2
    assert {a.by_class for a in accumulators} == {True} and all(a.with_gram for a in accumulators)


def test_fitting_alone_computes_only_its_own_statistics(problem, accumulators):
    create("cosine").fit(problem.fit)
    (only,) = accumulators
    assert only.by_class and not only.with_gram  # class sums, no D x D Gram matrix


def test_undeclared_need_gets_a_second_pass(problem):
    stats = FitStatistics(problem.fit, ["mean"])
    stats.get("mean")
    stats.get("normalized_by_class")
    assert stats.passes == 2


def test_provider_errors(problem, make):
    with pytest.raises(DetectorError, match="unknown fit statistics"):
        FitStatistics(problem.fit, ["gram"])
    with pytest.raises(DetectorError, match="gram_dtype"):
        FitStatistics(problem.fit, ["features"], gram_dtype="float16")
    other = FitStatistics(make(seed=1).fit, ["features_by_class"])
    with pytest.raises(DetectorError, match="another fit set"):
        create("maha").fit(problem.fit, stats=other)
    # The base class keeps `stats` without knowing its type; the detector's statistics_for refuses anything else.
    with pytest.raises(DetectorError, match="stats must be a FitStatistics, got dict"):
        create("maha").fit(problem.fit, stats={"features_by_class": None})
    unlabelled = Outputs(problem.fit.features, problem.fit.logits)
    with pytest.raises(DetectorError, match="need labels"):
        FitStatistics(unlabelled, ["class_sums"]).get("class_sums")


def test_class_sums_alone_skip_the_sum_and_equal_the_shared_ones(problem):
    """Class sums alone skip the pass that sums every row (no detector of theirs reads it), and hold the bits that a
    pass which also sums the rows gives; the accumulator without sums refuses its mean rather than invent one."""
    alone = FitStatistics(problem.fit, ["class_sums"]).get("class_sums")
    shared = FitStatistics(problem.fit, ["class_sums", "mean"])
    assert not alone.with_sum and shared.get("class_sums").with_sum
    np.testing.assert_array_equal(alone.class_sums, shared.get("class_sums").class_sums)
    np.testing.assert_array_equal(alone.class_counts, shared.get("class_sums").class_counts)
    with pytest.raises(DetectorError, match="per-class sums only"):
        _ = alone.mean
    with pytest.raises(DetectorError, match="needs the sum"):
        _gaussian.ScatterAccumulator(4, with_sum=False)  # a Gram about the shift needs the sum


def test_unmet_detectors_declare_nothing(problem):
    unlabelled = Outputs(problem.fit.features, problem.fit.logits)
    stats = FitStatistics.for_detectors(unlabelled, [create("maha"), create("neco"), create("vim")], head=None)
    assert stats.declared == {"features"}  # maha lacks labels, vim the head


def test_evaluate_fits_through_one_pass(problem, accumulators):
    id_test, ood = problem.test.subset(slice(0, problem.n_id)), problem.test.subset(slice(problem.n_id, None))
    result = evaluate_outputs(
        problem.fit, problem.head, id_test, {"ood": ood}, {"maha": {}, "rmaha": {}, "neco": {"dim": 4}}, progress=False
    )
    assert len(accumulators) == 1
    direct = create("maha").fit(problem.fit).score(id_test)
    np.testing.assert_allclose(result.scores["id"]["maha"], direct, rtol=1e-12)


def test_tune_shares_the_covariance_across_grid_points(problem, accumulators):
    id_val, ood_val = problem.test.subset(slice(0, problem.n_id)), problem.test.subset(slice(problem.n_id, None))
    result = tune("neco", {"dim": [2, 4, 8]}, problem.fit, problem.head, id_val, ood_val)
    assert len(accumulators) == 1 and len(result.points) == 3


def test_maha_and_rmaha_share_one_whitener(problem):
    """The within-class pseudo-inverse (a D x D eigendecomposition) is computed once per accumulator."""
    maha, rmaha = fit_all([create("maha"), create("rmaha")], problem.fit)
    assert maha.covariance_ is rmaha.covariance_
    stats = FitStatistics(problem.fit, ["features_by_class"]).get("features_by_class")
    first = stats.within_class_whitener()
    assert stats.within_class_whitener() is first
    stats.update(np.asarray(problem.fit.features[:10]), np.asarray(problem.fit.labels[:10]))
    assert stats.within_class_whitener() is not first  # more rows: recomputed


def test_float32_gram_moves_mahalanobis_distances_within_the_propagated_bound(problem, small_params):
    """Fitting with float32 Grams: distances within the first-order bound ‖ΔΣ‖₂/λ_min(Σ) of the float64 fit's.

    Σ⁻¹ moves by Σ⁻¹ΔΣΣ⁻¹ to first order, so |Δ(xᵀΣ⁻¹x)| ≤ ‖ΔΣ‖₂‖Σ⁻¹x‖² ≤ (‖ΔΣ‖₂/λ_min)·xᵀΣ⁻¹x, for each class
    and hence for the minimum over classes. ‖ΔΣ‖₂ ≤ ‖ΔΣ‖_F ≤ β·(Σ_j √G_jj)²/N from the entrywise Gram bound.
    """
    names = ("maha", "maha++", "rmaha", "rmaha++", "vim", "neco")
    exact = fit_all([create(name, **small_params.get(name, {})) for name in names], problem.fit, problem.head)
    stats = FitStatistics.for_detectors(
        problem.fit, [create(name, **small_params.get(name, {})) for name in names], problem.head, gram_dtype="float32"
    )
    fast = [create(name, **small_params.get(name, {})).fit(problem.fit, problem.head, stats=stats) for name in names]
    assert stats.passes == 1
    for detector64, detector32, need in zip(
        exact[:2], fast[:2], ("features_by_class", "normalized_by_class"), strict=True
    ):
        accumulator = stats.get(need)
        covariance = detector64.covariance_
        bound = accumulator.gram_error_bound() * np.sqrt(np.diag(accumulator.gram)).sum() ** 2 / accumulator.count
        relative = bound / np.linalg.eigvalsh(covariance)[0]
        assert 0 < relative < 0.05  # a meaningful bound on this well-conditioned problem
        np.testing.assert_allclose(detector32.covariance_, covariance, rtol=0, atol=bound)
        distance64, distance32 = -detector64.score(problem.test), -detector32.score(problem.test)
        # Beyond first order: |Δd| ≤ r/(1 − r)·d with r = ‖ΔΣ‖₂/λ_min (plus float64 rounding, ~1e-12 relative).
        limit = (relative / (1 - relative) + 1e-12) * np.abs(distance64)
        assert (np.abs(distance32 - distance64) <= limit).all()
        assert (distance32 != distance64).any()  # the float32 Gram did change them: the check is not vacuous
    for detector64, detector32 in zip(exact[2:], fast[2:], strict=True):
        assert np.isfinite(detector32.score(problem.test)).all()
        assert detector32.fit_info_ is not None and detector64.fit_info_ is not None


def _pass_statistics(fit_set: Outputs, gram_dtype: str) -> dict[str, np.ndarray]:
    stats = FitStatistics(fit_set, {"features_by_class", "normalized_by_class", "max_logit_sum"}, gram_dtype=gram_dtype)
    values = {"max_logit_sum": np.array(stats.get("max_logit_sum"))}
    for need in ("features_by_class", "normalized_by_class"):
        accumulator = stats.get(need)
        for name in ("shift", "sum", "gram", "class_sums", "class_counts"):
            values[f"{need}.{name}"] = np.array(getattr(accumulator, name))
        values[f"{need}.count"] = np.array(accumulator.count)
    return values


@pytest.mark.parametrize("gram_dtype", ["float64", "float32"])
@pytest.mark.parametrize("input_dtype", [np.float32, np.float64])
def test_the_two_accumulators_in_threads_sum_bit_for_bit_as_one_after_the_other(monkeypatch, gram_dtype, input_dtype):
    """Where the BLAS may use two threads the raw accumulator runs in a worker thread beside the normalised one; it
    gets the same calls in the same order, so every statistic equals the sequential pass's bit for bit."""
    from oodbench.detectors import _streaming, shared

    monkeypatch.setattr(_gaussian, "GRAM_ROWS", 96)  # several staged products and groups per block
    monkeypatch.setattr(_gaussian, "GRAM_GROUP_ROWS", 300)
    monkeypatch.setattr(_streaming, "FIT_CHUNK_BYTES", 64 * 1024)  # many blocks: many hand-overs to the worker
    rng = np.random.default_rng(5)
    features = (rng.normal(size=(3000, 24)) * np.linspace(0.5, 3.0, 24) + 2.0).astype(input_dtype)
    labels = rng.integers(0, 11, 3000)
    fit_set = Outputs(features, rng.normal(size=(3000, 11)).astype(np.float32), labels)
    threads = []
    original = shared._add_raw

    def spy(*args):
        threads.append(threading.current_thread().name)
        return original(*args)

    monkeypatch.setattr(shared, "_add_raw", spy)
    monkeypatch.setattr(shared, "blas_threads", lambda: 1)
    sequential = _pass_statistics(fit_set, gram_dtype)
    assert threads and all(name == threading.main_thread().name for name in threads)
    threads.clear()
    monkeypatch.setattr(shared, "blas_threads", lambda: 2)
    parallel = _pass_statistics(fit_set, gram_dtype)
    assert threads and all(name.startswith("oodbench-fit") for name in threads)
    assert sequential.keys() == parallel.keys()
    for name, value in sequential.items():
        np.testing.assert_array_equal(parallel[name], value, err_msg=name)


def test_an_error_in_the_worker_thread_reaches_the_caller(monkeypatch, problem):
    from oodbench.detectors import shared

    def failing(*args):
        raise DetectorError("the raw accumulator failed")

    monkeypatch.setattr(shared, "blas_threads", lambda: 2)
    monkeypatch.setattr(shared, "_add_raw", failing)
    stats = FitStatistics(problem.fit, {"features", "normalized_by_class"})
    with pytest.raises(DetectorError, match="the raw accumulator failed"):
        stats.get("features")
