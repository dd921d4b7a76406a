"""Overlap index L_k: the mean fraction of a point's k nearest neighbours that carry another label.

Following Ascárate et al. (2026), a cheap pre-check of how mixed two (or more) labelled sets are in an embedding:
0 means every neighbourhood is pure, and under random labels the expected value is
``chance = sum_g N_g (N - N_g) / (N (N - 1))``. We report L_k with its k, the per-label means and the ratio
to chance (1 = as mixed as random labels). Neighbours are exact Euclidean, the point itself excluded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..core.errors import AuditError
from ..core.outputs import Outputs
from ._rows import sample_index
from .neighbours import nearest_rows

__all__ = ["OverlapIndex", "overlap_index", "pair_overlap"]


@dataclass(frozen=True)
class OverlapIndex:
    """L_k over a labelled set, per label, its chance level under random labels, and the ratio to chance."""

    k: int
    value: float
    per_label: dict[int, float]
    chance: float
    n: int

    @property
    def relative(self) -> float:
        """L_k divided by its chance level (0 = separated, 1 = as mixed as random labels)."""
        return self.value / self.chance if self.chance > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        data = asdict(self)
        data["per_label"] = {str(k): v for k, v in self.per_label.items()}
        data["relative"] = self.relative
        return data


def overlap_index(features: np.ndarray, labels: np.ndarray, k: int = 10) -> OverlapIndex:
    """L_k of `features` (N, D) with integer `labels` (N,): mean share of each point's k neighbours with another label."""
    labels = np.asarray(labels)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise AuditError(f"features must be (N, D) and labels (N,); got {features.shape} and {labels.shape}")
    n = labels.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise AuditError(f"k must be a positive integer; got {k!r}")
    if n < k + 1:
        raise AuditError(f"L_k with k={k} needs at least {k + 1} points; got {n}")
    neighbours = nearest_rows(features, features, int(k), exclude_self=True)
    other = (labels[neighbours] != labels[:, None]).mean(axis=1)
    classes, counts = np.unique(labels, return_counts=True)
    per_label = {int(c): float(other[labels == c].mean()) for c in classes}
    chance = float(np.sum(counts * (n - counts)) / (n * (n - 1)))
    return OverlapIndex(int(k), float(other.mean()), per_label, chance, int(n))


def pair_overlap(
    id_set: Outputs, ood: Outputs, *, k: int = 10, max_rows_per_side: int | None = 5000, seed: int = 0
) -> OverlapIndex:
    """L_k of the union of an ID set (label 1) and an OOD set (label 0), each side subsampled to `max_rows_per_side`."""
    rng = np.random.default_rng(seed)
    id_rows = sample_index(len(id_set), max_rows_per_side, rng)
    ood_rows = sample_index(len(ood), max_rows_per_side, rng)
    features = np.concatenate(
        [np.asarray(id_set.features[id_rows], dtype=np.float32), np.asarray(ood.features[ood_rows], dtype=np.float32)]
    )
    labels = np.concatenate([np.ones(len(id_rows), dtype=np.int64), np.zeros(len(ood_rows), dtype=np.int64)])
    return overlap_index(features, labels, k)
