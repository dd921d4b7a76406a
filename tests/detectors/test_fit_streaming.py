"""Streaming fits: exact percentiles, Gaussian statistics, and memory-mapped fit sets read in many small chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oodbench.detectors import Detector, _streaming, available, create
from oodbench.detectors._gaussian import ScatterAccumulator, pinv_sqrt
from oodbench.outputs import Outputs


@settings(max_examples=40, deadline=None)
@given(
    arrays(
        np.float32,
        st.tuples(st.integers(1, 40), st.integers(1, 6)),
        elements=st.one_of(st.sampled_from([0.0, 1.0, -2.5]), st.floats(-1e6, 1e6, width=32)),
    ),
    st.floats(0.0, 100.0),
)
def test_exact_percentile_equals_numpy(values, q):
    expected = np.percentile(values.astype(np.float64), q)
    assert _streaming.exact_percentile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("path", ["sampled bracket", "histogram refinement"])
def test_exact_percentile_on_large_arrays(monkeypatch, path):
    monkeypatch.setattr(_streaming, "FIT_CHUNK_BYTES", 4096)
    monkeypatch.setattr(_streaming, "_SAMPLE_VALUES", 2000)  # a sample smaller than the array
    if path == "histogram refinement":
        monkeypatch.setattr(_streaming, "_bracketed_ranks", lambda *args: None)
        monkeypatch.setattr(_streaming, "_COLLECT", 64)  # refine over several levels before sorting in memory
    rng = np.random.default_rng(0)
    values = np.maximum(rng.normal(size=(3000, 7)), 0).astype(np.float32)  # a mass of exact zeros, then a tail
    values[5, 3] = 1e30  # a huge outlier stretches the first level's range
    for q in (10.0, 50.0, 85.0, 90.0, 99.99):
        assert _streaming.exact_percentile(values, q) == pytest.approx(
            np.percentile(values.astype(np.float64), q), rel=1e-12
        )


def test_scatter_accumulator_matches_direct_statistics():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(500, 6)) * 3 + 1000.0  # a large mean: the shift keeps the covariance accurate
    labels = rng.integers(0, 4, 500)
    stats = ScatterAccumulator(6, by_class=True)
    for start in range(0, 500, 37):
        stats.update(features[start : start + 37], labels[start : start + 37])
    np.testing.assert_allclose(stats.mean, features.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(stats.covariance(), np.cov(features.T, bias=True), rtol=1e-9)
    means = np.stack([features[labels == c].mean(axis=0) for c in range(4)])
    np.testing.assert_allclose(stats.class_means(), means, rtol=1e-12)
    within = sum((features[labels == c] - means[c]).T @ (features[labels == c] - means[c]) for c in range(4)) / 500
    np.testing.assert_allclose(stats.within_class_covariance(), within, rtol=1e-9)


def test_pinv_sqrt_is_a_pseudo_inverse_square_root():
    rng = np.random.default_rng(2)
    basis = rng.normal(size=(6, 3))
    covariance = basis @ basis.T  # rank 3
    whitener = pinv_sqrt(covariance)
    assert whitener.shape == (6, 3)
    np.testing.assert_allclose(whitener @ whitener.T, np.linalg.pinv(covariance), atol=1e-10)


@pytest.mark.parametrize("name", available())
def test_memory_mapped_fit_in_small_chunks_matches_in_memory(problem, small_params, tmp_path, monkeypatch, name):
    params = small_params.get(name, {})
    expected = create(name, **params).fit(problem.fit, problem.head).score(problem.test)
    mapped = {}
    for key in ("features", "logits"):
        array = np.lib.format.open_memmap(
            tmp_path / f"{key}.npy", mode="w+", dtype=np.float32, shape=getattr(problem.fit, key).shape
        )
        array[:] = getattr(problem.fit, key)
        array.flush()
        mapped[key] = np.load(tmp_path / f"{key}.npy", mmap_mode="r")
    fit = Outputs(mapped["features"], mapped["logits"], problem.fit.labels)
    monkeypatch.setattr(_streaming, "FIT_CHUNK_BYTES", 2048)  # a few rows per chunk: many fit chunks
    monkeypatch.setattr(Detector, "chunk_bytes", 2048)  # and many score chunks
    streamed = create(name, **params).fit(fit, problem.head).score(problem.test)
    np.testing.assert_allclose(streamed, expected, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float32, 1e-6)])
def test_logsumexp_in_place(dtype, rtol):
    from scipy.special import logsumexp

    from oodbench.numerics import logsumexp_in_place

    rng = np.random.default_rng(3)
    for spread in (1.0, 50.0, 1e4):  # the last one underflows most terms
        logits = (rng.standard_normal((40, 300)) * spread).astype(dtype)
        expected = logsumexp(logits.astype(np.float64), axis=1)
        np.testing.assert_allclose(logsumexp_in_place(logits.copy()), expected, rtol=rtol)
