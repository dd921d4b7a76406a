"""Exact Euclidean nearest neighbours over (possibly memory-mapped) arrays, streamed over base chunks with faiss."""

from __future__ import annotations

import faiss
import numpy as np

from ..core.errors import AuditError
from ..util.chunking import iter_chunks, rows_per_chunk

__all__ = ["nearest_rows", "class_means", "nearest_class_mean"]

# Base rows per faiss index: bounded memory (float32) however large the fit set is.
_BASE_CHUNK_BYTES = 256 * 2**20


def _unit(block: np.ndarray) -> np.ndarray:
    block = np.asarray(block, dtype=np.float32)
    return block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)


def nearest_rows(
    base: np.ndarray, queries: np.ndarray, k: int, *, exclude_self: bool = False, cosine: bool = False
) -> np.ndarray:
    """Indices (Q, k) of each query's k nearest base rows (squared L2; on L2-normalised rows with ``cosine``).

    With ``exclude_self`` the queries are the base itself (same order) and each row's own index is dropped, so
    duplicates of a row still count as its neighbours.
    """
    n, q = base.shape[0], queries.shape[0]
    if base.ndim != 2 or queries.ndim != 2 or base.shape[1] != queries.shape[1]:
        raise AuditError(f"base {base.shape} and queries {queries.shape} must be 2-D with the same width")
    wanted = k + 1 if exclude_self else k
    if k < 1 or wanted > n:
        raise AuditError(
            f"k={k} neighbours requested but the base has {n} rows" + (" (self excluded)" if exclude_self else "")
        )
    query32 = np.ascontiguousarray(_unit(queries) if cosine else queries, dtype=np.float32)
    best_dist = np.full((q, wanted), np.inf, dtype=np.float32)
    best_index = np.full((q, wanted), -1, dtype=np.int64)
    for rows in iter_chunks(n, rows_per_chunk(base.shape[1], bytes_per_value=4, budget_bytes=_BASE_CHUNK_BYTES)):
        index = faiss.IndexFlatL2(base.shape[1])
        block = _unit(base[rows]) if cosine else base[rows]
        index.add(np.ascontiguousarray(block, dtype=np.float32))
        dist, found = index.search(query32, min(wanted, rows.stop - rows.start))
        found = np.where(found >= 0, found + rows.start, -1)
        # Merge this chunk's candidates with the running best: a (Q, 2k) partial sort per chunk.
        all_dist = np.concatenate([best_dist, dist], axis=1)
        all_index = np.concatenate([best_index, found], axis=1)
        order = np.argsort(all_dist, axis=1, kind="stable")[:, :wanted]
        best_dist = np.take_along_axis(all_dist, order, axis=1)
        best_index = np.take_along_axis(all_index, order, axis=1)
    if not exclude_self:
        return best_index
    own = np.arange(q)[:, None]
    is_self = best_index == own
    # Drop the own index where found, else the farthest candidate (the own row tied with duplicates beyond k).
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), wanted - 1)
    keep = np.ones_like(best_index, dtype=bool)
    keep[np.arange(q), drop] = False
    return best_index[keep].reshape(q, k)


def class_means(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class mean features (C, D) in float64 for the sorted distinct labels, streamed over row chunks."""
    labels = np.asarray(labels)
    classes, inverse = np.unique(labels, return_inverse=True)
    sums = np.zeros((classes.shape[0], features.shape[1]))
    for rows in iter_chunks(features.shape[0], rows_per_chunk(features.shape[1])):
        block = np.asarray(features[rows], dtype=np.float64)
        codes = inverse[rows]
        order = np.argsort(codes, kind="stable")
        present, starts = np.unique(codes[order], return_index=True)
        sums[present] += np.add.reduceat(block[order], starts, axis=0)
    counts = np.bincount(inverse, minlength=classes.shape[0])
    return sums / counts[:, None], classes


def nearest_class_mean(features: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Index of the nearest class mean by cosine similarity for each row (L2-normalised features and means)."""
    unit_means = means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    out = np.empty(features.shape[0], dtype=np.int64)
    for rows in iter_chunks(features.shape[0], rows_per_chunk(max(features.shape[1], means.shape[0]))):
        block = np.asarray(features[rows], dtype=np.float64)
        block /= np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
        out[rows] = (block @ unit_means.T).argmax(axis=1)
    return out
