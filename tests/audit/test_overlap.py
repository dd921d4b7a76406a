"""Overlap index L_k, exact neighbours, class means, memory-bounded row selection and the pool helpers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench import Outputs
from oodbench.audit import IsolationForestScorer, _rows, neighbours, overlap_index, pair_overlap
from oodbench.audit.config import AuditConfig
from oodbench.audit.neighbours import class_means, nearest_class_mean, nearest_rows
from oodbench.audit.pool import knn_k_for, resolve_pool
from oodbench.core.errors import AuditError

from .audit_helpers import single_thread_blas  # noqa: F401 (autouse fixture)


def _brute_overlap(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """O(N²) reference: for each point, sort the others by distance (ties by index) and count other labels."""
    shares = []
    for i in range(len(x)):
        d = ((x - x[i]) ** 2).sum(1)
        d[i] = np.inf
        order = np.lexsort((np.arange(len(x)), d))[:k]
        shares.append(np.mean(y[order] != y[i]))
    return float(np.mean(shares))


def test_overlap_is_zero_for_separated_sets_and_has_the_closed_form_chance():
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(30, 2)), rng.normal(loc=100, size=(10, 2))]
    y = np.r_[np.zeros(30, int), np.ones(10, int)]
    result = overlap_index(x, y, k=5)
    assert result.value == 0.0 and result.per_label == {0: 0.0, 1: 0.0}
    assert result.chance == pytest.approx((30 * 10 + 10 * 30) / (40 * 39))
    assert result.relative == 0.0 and result.k == 5 and result.n == 40


def test_overlap_on_a_line_by_hand():
    # Points 0, 1, 2.1, 3.3 on a line; k=1 neighbours: 0->1, 1->0, 2.1->1 (1.1 < 1.2), 3.3->2.1.
    x = np.array([[0.0], [1.0], [2.1], [3.3]])
    assert overlap_index(x, np.array([0, 1, 0, 1]), k=1).value == 1.0
    mixed = overlap_index(x, np.array([0, 0, 1, 1]), k=1)  # only 2.1's neighbour (1.0) has the other label
    assert mixed.value == 0.25 and mixed.per_label == {0: 0.0, 1: 0.5}


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=6))
def test_overlap_matches_brute_force(seed: int, k: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = rng.integers(0, 3, size=40)
    assert overlap_index(x, y, k).value == pytest.approx(_brute_overlap(x.astype(np.float64), y, k), abs=1e-12)


def test_pair_overlap_labels_and_subsampling():
    rng = np.random.default_rng(1)
    ids = Outputs(rng.normal(size=(300, 4)).astype(np.float32))
    same = Outputs(rng.normal(size=(300, 4)).astype(np.float32))
    result = pair_overlap(ids, same, k=10, max_rows_per_side=100)
    assert result.n == 200 and set(result.per_label) == {0, 1}
    assert 0.75 < result.relative < 1.25  # same distribution: as mixed as random labels
    with pytest.raises(AuditError, match="needs at least"):
        overlap_index(np.zeros((3, 2)), np.array([0, 1, 0]), k=5)


def test_nearest_rows_matches_brute_force_across_base_chunks(monkeypatch):
    monkeypatch.setattr(neighbours, "_BASE_CHUNK_BYTES", 8 * 4 * 7)  # 7 rows of 8 floats per faiss index
    rng = np.random.default_rng(2)
    base, queries = rng.normal(size=(50, 8)), rng.normal(size=(9, 8))
    found = nearest_rows(base, queries, 4)
    d = ((queries[:, None, :] - base[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(found, np.argsort(d, axis=1, kind="stable")[:, :4])
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    cos = nearest_rows(base, queries, 3, cosine=True)
    np.testing.assert_array_equal(cos, np.argsort(-(unit(queries) @ unit(base).T), axis=1, kind="stable")[:, :3])


def test_nearest_rows_excludes_self_even_with_duplicates():
    base = np.array([[0.0, 0.0], [0.0, 0.0], [5.0, 5.0], [5.1, 5.0]])
    found = nearest_rows(base, base, 1, exclude_self=True)
    np.testing.assert_array_equal(found[:, 0], [1, 0, 3, 2])
    with pytest.raises(AuditError, match="self excluded"):
        nearest_rows(base, base, 4, exclude_self=True)


def test_class_means_and_nearest_mean():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(70, 5))
    y = rng.choice([2, 5, 9], size=70)
    means, classes = class_means(x, y)
    np.testing.assert_array_equal(classes, [2, 5, 9])
    np.testing.assert_allclose(means, np.stack([x[y == c].mean(0) for c in classes]))
    picked = nearest_class_mean(means * 3.0, means)
    np.testing.assert_array_equal(picked, [0, 1, 2])


def test_select_rows_through_a_scratch_memory_map(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    source = Outputs(
        rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 3, 40)
    )
    keep = rng.random(40) > 0.5
    monkeypatch.setattr(_rows, "IN_MEMORY_BYTES", 0)
    selected = _rows.select_rows(source, keep, scratch=tmp_path)
    assert isinstance(selected.features, np.memmap)
    np.testing.assert_array_equal(selected.features, source.features[keep])
    np.testing.assert_array_equal(selected.logits, source.logits[keep])
    np.testing.assert_array_equal(selected.labels, source.labels[keep])
    with pytest.raises(AuditError, match="empty"):
        _rows.select_rows(source, np.zeros(40, bool))


def test_relabel_is_contiguous_in_sorted_order():
    labels, classes = _rows.relabel(np.array([7, 3, 7, 9]))
    np.testing.assert_array_equal(labels, [1, 0, 1, 2])
    np.testing.assert_array_equal(classes, [3, 7, 9])


def test_isolation_forest_scores_outliers_lower():
    rng = np.random.default_rng(5)
    fit = Outputs(rng.normal(size=(300, 2)).astype(np.float32))
    scorer = IsolationForestScorer(n_estimators=50).fit(fit)
    scores = scorer.score(Outputs(np.array([[0.0, 0.0], [8.0, 8.0]], np.float32)))
    assert scores[0] > scores[1]
    assert scorer.fit_rows_ == 300
    capped = IsolationForestScorer(n_estimators=10, max_fit_rows=50).fit(fit)
    assert capped.fit_rows_ == 50


def test_knn_k_rule_and_default_pool_resolution():
    assert knn_k_for(1_281_167) == 1000 and knn_k_for(50_000) == 50 and knn_k_for(650) == 10 and knn_k_for(5) == 4
    members, missing = resolve_pool(AuditConfig())
    assert [m.name for m in members] == ["maha", "rmaha", "maha++", "rmaha++", "knn", "iforest"] and not missing
