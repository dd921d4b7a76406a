"""Streaming fits: exact percentiles, Gaussian statistics, and memory-mapped fit sets read in many small chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oodbench.core.errors import DetectorError
from oodbench.core.outputs import Outputs
from oodbench.detectors import Detector, _gaussian, _streaming, available, create
from oodbench.detectors._gaussian import (
    ClassGaussians,
    ScatterAccumulator,
    add_rows_by_class,
    pinv_sqrt,
    triangular_whitener,
    whiten_triangular,
)


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
    extras = {}
    for key, values in problem.fit.extras.items():  # the network-time detectors' arrays, mapped too
        np.save(tmp_path / f"extra.{key}.npy", values)
        extras[key] = np.load(tmp_path / f"extra.{key}.npy", mmap_mode="r")
    fit = Outputs(mapped["features"], mapped["logits"], problem.fit.labels, extras=extras)
    monkeypatch.setattr(_streaming, "FIT_CHUNK_BYTES", 2048)  # a few rows per chunk: many fit chunks
    monkeypatch.setattr(Detector, "chunk_bytes", 2048)  # and many score chunks
    streamed = create(name, **params).fit(fit, problem.head).score(problem.test)
    np.testing.assert_allclose(streamed, expected, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float32, 1e-6)])
def test_logsumexp_in_place(dtype, rtol):
    from scipy.special import logsumexp

    from oodbench.core.numerics import logsumexp_in_place

    rng = np.random.default_rng(3)
    for spread in (1.0, 50.0, 1e4):  # the last one underflows most terms
        logits = (rng.standard_normal((40, 300)) * spread).astype(dtype)
        expected = logsumexp(logits.astype(np.float64), axis=1)
        np.testing.assert_allclose(logsumexp_in_place(logits.copy()), expected, rtol=rtol)


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1.0 - n * unit)


def test_float32_gram_covariance_stays_within_the_proven_bound(monkeypatch):
    """|Ĉ − C|_jl ≤ β·sqrt(G_jj G_ll)/N (gram_error_bound), on data built to stress float32 accumulation."""

    # Tiny products and groups: many float64 additions of float32 groups, so a float32 total would show.
    monkeypatch.setattr(_gaussian, "SYRK_ROWS", 8)
    monkeypatch.setattr(_gaussian, "GRAM_ROWS", 8)
    monkeypatch.setattr(_gaussian, "GRAM_GROUP_ROWS", 8)
    rng = np.random.default_rng(7)
    rows, dim = 60_000, 6
    mixing = rng.normal(size=(dim, dim))
    scales = np.array([1e-3, 1.0, 10.0, 1.0, 1e3, 5.0])  # columns of very different scale
    # A mean far from zero against the spread (the shift must take it out) and correlated columns.
    features = ((rng.normal(size=(rows, dim)) @ mixing) * scales + 1e4 * scales).astype(np.float32)
    fast = ScatterAccumulator(dim, gram_dtype="float32")
    for start in range(0, rows, 997):
        fast.update(features[start : start + 997])
    exact = ScatterAccumulator(dim, shift=fast.shift)  # the float64 Gram about the same shift
    exact.update(features)
    gram = exact.gram
    scale = np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    beta = fast.gram_error_bound()
    # Depth: at most 8 rows per product plus 2 products per group (a chunk's last, short block starts a group).
    assert beta <= _gaussian.gram_error_bound(10, rows) < 1e-6
    # The float64 reference's own error: γ64 of its accumulation depth on the same Cauchy–Schwarz scale, and the
    # float64 roundings of G/N − d dᵀ.
    offset = exact.sum / rows
    bound = (beta + _gamma(rows + 8, 2.0**-53)) * scale / rows
    bound += 8 * 2.0**-53 * (np.abs(exact.covariance()) + np.abs(np.outer(offset, offset)))
    error = np.abs(fast.covariance() - exact.covariance())
    assert (error <= bound).all(), (error / bound).max()
    assert error.max() > 0  # the float32 path did run
    # The bound has teeth: summing the same float32 group Grams in float32 (no float64 total) breaks it.
    naive = np.zeros((dim, dim), dtype=np.float32)
    centred = (features.astype(np.float64) - fast.shift).astype(np.float32)
    for start in range(0, rows, 8):
        block = centred[start : start + 8]
        naive += block.T @ block
    naive_covariance = naive.astype(np.float64) / rows - np.outer(offset, offset)
    assert (np.abs(naive_covariance - exact.covariance()) > bound).any()


def test_moment_about_a_point_matches_direct_computation():
    rng = np.random.default_rng(4)
    features = rng.normal(size=(300, 5)) + 50.0
    point = rng.normal(size=5) * 100.0
    stats = ScatterAccumulator(5)
    stats.update(features)
    direct = (features - point).T @ (features - point) / 300
    np.testing.assert_allclose(stats.moment_about(point), direct, rtol=1e-11)


def test_class_sums_per_block_equal_class_sums_per_part():
    """update_classes on a block (the shared pass) and labels given with each part (update_owned) agree."""
    rng = np.random.default_rng(7)
    features = rng.normal(size=(900, 5)) * 2 + 50.0
    labels = rng.integers(0, 30, 900)
    labels[labels == 4] = 5  # a class absent from the data keeps a zero count
    by_part = ScatterAccumulator(5, by_class=True)
    by_block = ScatterAccumulator(5, by_class=True)
    for start in range(0, 900, 128):
        rows = slice(start, start + 128)
        by_part.update_owned(features[rows].copy(), labels[rows])
        by_block.update_owned(features[rows].copy())
        by_block.update_classes(features[rows], labels[rows])
    np.testing.assert_array_equal(by_block.class_counts, by_part.class_counts)
    assert by_block.class_counts[4] == 0
    # Two float64 orders of summing the same ≤ 128 values of size ~50 per class: |difference| ≤ 2·128·u·50·128.
    np.testing.assert_allclose(by_block.class_sums, by_part.class_sums, rtol=0, atol=2 * 128 * 2**-53 * 50 * 128)
    means = np.stack([features[labels == c].mean(axis=0) for c in by_part.present_classes])
    np.testing.assert_allclose(by_block.class_means(), means, rtol=1e-12)
    with pytest.raises(DetectorError, match="about the shift"):
        ScatterAccumulator(5, by_class=True).update_classes(features[:3], labels[:3])


def test_gram_stays_right_when_read_between_updates():
    """Reading the Gram mirrors it in place; later updates must still give the Gram of all rows."""
    rng = np.random.default_rng(8)
    features = rng.normal(size=(1500, 700))
    for gram_dtype, rtol in (("float64", 1e-12), ("float32", 1e-4)):
        stats = ScatterAccumulator(700, gram_dtype=gram_dtype, shift=np.zeros(700))
        stats.update(features[:600])
        np.testing.assert_allclose(stats.gram, features[:600].T @ features[:600], rtol=rtol, atol=rtol * 600)
        stats.update(features[600:])
        expected = features.T @ features
        # float32: the proven entrywise bound β·sqrt(G_jj G_ll), with G_jj ≈ 1500 here.
        atol = stats.gram_error_bound() * 1500 * 1.01 if gram_dtype == "float32" else 1e-9
        np.testing.assert_allclose(stats.gram, expected, rtol=0, atol=atol)
        np.testing.assert_array_equal(stats.gram, stats.gram.T)


def test_triangular_whitener_whitens_and_declines_singular_covariances():
    rng = np.random.default_rng(9)
    basis = rng.normal(size=(40, 40))
    covariance = basis @ basis.T / 40 + 0.1 * np.eye(40)
    upper = triangular_whitener(covariance)
    assert upper is not None and np.array_equal(upper, np.triu(upper))
    # U Uᵀ = Σ⁻¹: relative error a few times cond(Σ)·D·u (cond ≈ 400 here).
    np.testing.assert_allclose(
        upper @ upper.T, np.linalg.inv(covariance), rtol=0, atol=1e-9 * np.abs(np.linalg.inv(covariance)).max()
    )
    rank_deficient = basis[:, :30] @ basis[:, :30].T
    assert triangular_whitener(rank_deficient) is None  # pinv_sqrt would drop directions: no triangular factor
    centred = rng.normal(size=(300, 40))
    # Each entry is a float64 dot product of ≤ 40 terms, whichever memory order the whitener comes in (a fitted
    # detector's is Fortran-ordered, a loaded one's C-ordered); in place when asked, a copy otherwise.
    bound = 40 * 2**-53 / (1 - 40 * 2**-53) * (np.abs(centred) @ np.abs(upper))
    for order in ("F", "C"):
        kept = centred.copy()
        whitened = whiten_triangular(kept, np.asarray(upper, order=order))
        assert (np.abs(whitened - centred @ upper) <= 2 * bound + 1e-300).all()
        np.testing.assert_array_equal(kept, centred)
        in_place = whiten_triangular(kept, np.asarray(upper, order=order), overwrite=True)
        assert np.shares_memory(in_place, kept)
        np.testing.assert_array_equal(in_place, whitened)


def test_mahalanobis_uses_the_triangular_whitener_only_when_the_covariance_is_invertible():
    rng = np.random.default_rng(10)
    features = rng.normal(size=(2000, 12)) + rng.integers(0, 5, 2000)[:, None]
    labels = rng.integers(0, 5, 2000)
    test = Outputs(rng.normal(size=(300, 12)))
    full = create("maha").fit(Outputs(features, labels=labels))
    assert full.gaussians_.triangular
    # The eigen-based whitener (pinv_sqrt) gives the same distances: the same formula, other rounding.
    reference = ClassGaussians(
        full.means_, full.covariance_, full.gaussians_.centre, whitener=pinv_sqrt(full.covariance_)
    )
    assert not reference.triangular
    block = np.asarray(test.features, dtype=np.float64)
    np.testing.assert_allclose(full.gaussians_.min_sq_distance(block), reference.min_sq_distance(block), rtol=1e-10)
    # A duplicated column makes the within-class covariance singular: pinv_sqrt's whitener, not a triangular one.
    singular = create("maha").fit(Outputs(np.hstack([features, features[:, :1]]), labels=labels))
    assert not singular.gaussians_.triangular
    assert singular.gaussians_.whitener.shape == (13, 12)


@pytest.mark.parametrize(
    "gram_dtype,input_dtype", [("float64", np.float64), ("float32", np.float32), ("float32", np.float64)]
)
def test_staged_rank_k_products_give_the_gram_of_every_row(monkeypatch, gram_dtype, input_dtype):
    """Rows staged across update calls of every size (a part, several stages, a stage boundary) all reach the Gram,
    also when it is read between updates; the float32 depth counts the widest product and the group's calls."""
    monkeypatch.setattr(_gaussian, "SYRK_ROWS", 4)
    monkeypatch.setattr(_gaussian, "GRAM_ROWS", 7)
    monkeypatch.setattr(_gaussian, "GRAM_GROUP_ROWS", 10)
    rng = np.random.default_rng(11)
    features = (rng.normal(size=(120, 5)) * [1.0, 3.0, 0.5, 2.0, 1.0] + 4.0).astype(input_dtype)
    accumulator = ScatterAccumulator(5, gram_dtype=gram_dtype)
    sizes = [3, 11, 1, 7, 20, 2, 6, 30, 40]  # sums to 120: parts shorter than, equal to and longer than a stage
    starts = np.cumsum([0] + sizes)
    for index, (start, stop) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        accumulator.update(features[start:stop])
        if index == 4:  # a read in between flushes the staged rows; the rows after it must still be added
            # Loose: it only has to tell a missing row (an O(1) error) from float32 rounding (β < 1e-6 here).
            centred = features[:stop].astype(np.float64) - accumulator.shift
            np.testing.assert_allclose(accumulator.gram, centred.T @ centred, rtol=1e-4, atol=1e-3)
    centred = features.astype(np.float64) - accumulator.shift
    expected = centred.T @ centred
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
    assert accumulator.count == 120
    np.testing.assert_allclose(accumulator.sum, centred.sum(axis=0), rtol=1e-12, atol=1e-10)
    if gram_dtype == "float64":
        # Both are float64 sums of 120 products, in different orders: each within γ64(120)·Σ|y_j||y_l| ≤
        # γ64(120)·sqrt(G_jj G_ll) of the exact value; 1e-12 of that scale is ~40 times their sum.
        assert (np.abs(accumulator.gram - expected) <= 1e-12 * scale).all()
    else:
        # Products of at most 7 rows and at most 2 of them per group of 10 rows (7 + 7 passes 10): depth 7 + 2.
        assert accumulator.gram_depth == 9
        beta = accumulator.gram_error_bound()
        # β bounds the float32 Gram's error; the float64 reference adds γ64(120) on the same scale.
        assert (np.abs(accumulator.gram - expected) <= (beta + 1e-13) * scale).all()


@pytest.mark.parametrize("path", ["numpy", "torch"])
@pytest.mark.parametrize("order", ["shuffled", "sorted"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_class_sums_add_each_row_in_row_order(monkeypatch, path, order, dtype):
    """Per-class sums are the row-order float64 sums np.add.at gives, bit for bit, across parts, calls and new classes."""
    monkeypatch.setattr(_gaussian, "_CLASS_SUM_ROWS", 7)  # many parts per call, and a short last one
    monkeypatch.setattr(_gaussian, "_ORDERED_PART_VALUES", 7 * 6)
    if path == "numpy":
        import sys

        monkeypatch.delitem(sys.modules, "torch", raising=False)
    else:
        monkeypatch.setattr(_gaussian, "NUMPY_CLASS_SUM_ROWS", 0)
    rng = np.random.default_rng(12)
    features = (rng.normal(size=(300, 6)) * 3 + 20).astype(dtype)
    labels = rng.integers(0, 9, 300)
    if order == "sorted":  # a class-ordered fit set: every part holds one or two classes
        labels = np.sort(labels)
    labels[250:] += 3  # classes 9-11 appear only in the later calls: the totals grow
    read_only = labels.copy()
    read_only.flags.writeable = False  # labels from a memory-mapped store
    accumulator = ScatterAccumulator(6, by_class=True, with_gram=False)
    for start, stop in ((0, 100), (100, 101), (101, 250), (250, 300)):
        accumulator.update(features[start:stop], read_only[start:stop])
    expected = np.zeros((12, 6))
    np.add.at(expected, labels, features.astype(np.float64))
    np.testing.assert_array_equal(
        accumulator.class_sums + accumulator.class_counts[:, None] * accumulator.shift, expected
    )
    np.testing.assert_array_equal(accumulator.class_counts, np.bincount(labels, minlength=12))


@pytest.mark.parametrize("step_values", [128, 0, 10**9])  # the default; every part by steps; every part by np.add.at
@pytest.mark.parametrize("labels_kind", ["uniform", "sorted", "one large class", "one class"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_add_rows_by_class_is_np_add_at_bit_for_bit(monkeypatch, step_values, labels_kind, dtype):
    """The vectorised ordered adds give np.add.at's float64 sums bit for bit: into running totals, on rows whose
    magnitudes span 10^±26 (so that any other order of the additions rounds differently), in parts of any size."""
    monkeypatch.setattr(_gaussian, "_STEP_VALUES", step_values)
    rng = np.random.default_rng(3)
    num_rows, dim, num_classes = 700, 5, 13
    labels = {
        "uniform": rng.integers(0, num_classes, num_rows),
        "sorted": np.sort(rng.integers(0, num_classes, num_rows)),
        "one large class": np.where(rng.random(num_rows) < 0.9, 4, rng.integers(0, num_classes, num_rows)),
        "one class": np.full(num_rows, 7),
    }[labels_kind]
    rows = (rng.normal(size=(num_rows, dim)) * 10.0 ** rng.uniform(-26, 26, size=(num_rows, 1))).astype(dtype)
    start = rng.normal(size=(num_classes, dim)) * 1e3  # totals of earlier rows
    expected = start.copy()
    np.add.at(expected, labels, rows.astype(np.float64))
    backwards = start.copy()
    np.add.at(backwards, labels[::-1], rows[::-1].astype(np.float64))
    assert not np.array_equal(backwards, expected)  # the order matters on these rows: the check is not vacuous
    for part_values in (1 << 22, 37 * dim, dim):  # one part, parts of 37 rows, a part per row
        monkeypatch.setattr(_gaussian, "_ORDERED_PART_VALUES", part_values)
        totals = start.copy()
        add_rows_by_class(totals, rows, labels)
        np.testing.assert_array_equal(totals, expected)
    totals = start.copy()
    add_rows_by_class(totals, rows[:0], labels[:0])  # no rows: nothing changes
    np.testing.assert_array_equal(totals, start)


def test_class_sums_without_torch_are_torchs_bit_for_bit(monkeypatch):
    """A small fit set's class sums come from np.add.at while torch is not imported (importing it costs seconds):
    the same row-order float64 sums as torch's accumulating index_put_, which larger fit sets use."""
    rng = np.random.default_rng(5)
    features = (rng.normal(size=(3000, 9)) * 10 ** rng.uniform(-3, 3, size=9)).astype(np.float32)
    labels = rng.integers(0, 7, 3000)

    def sums(use_numpy: bool) -> np.ndarray:
        monkeypatch.setattr(_gaussian, "NUMPY_CLASS_SUM_ROWS", 10**9 if use_numpy else 0)
        import sys

        if use_numpy:
            monkeypatch.delitem(sys.modules, "torch", raising=False)
        stats = ScatterAccumulator(9, by_class=True)
        for start in range(0, 3000, 700):
            stats.update(features[start : start + 700], labels[start : start + 700])
        if use_numpy:
            assert "torch" not in sys.modules  # the numpy path imported nothing
        monkeypatch.undo()
        return stats.class_sums

    np.testing.assert_array_equal(sums(True), sums(False))
