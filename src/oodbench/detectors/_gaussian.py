"""Streaming Gaussian statistics (class means, shared and total covariance) and Mahalanobis scoring by matmuls."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import DetectorError
from ..outputs import Outputs
from ._streaming import fit_chunks, read_rows


class ScatterAccumulator:
    """Float64 sufficient statistics over row chunks: count, sum and Gram matrix about a shift, per-class sums."""

    def __init__(
        self, dim: int, *, shift: np.ndarray | None = None, by_class: bool = False, with_gram: bool = True
    ) -> None:
        self.dim = dim
        self.with_gram = with_gram
        # Accumulating (x - shift)(x - shift)^T instead of x x^T avoids the cancellation of E[xx^T] - mu mu^T when
        # the mean is large against the spread; by default the shift is the first chunk's mean.
        self.shift = None if shift is None else np.asarray(shift, dtype=np.float64)
        self.by_class = by_class
        self.count = 0
        self.sum = np.zeros(dim)
        self.gram = np.zeros((dim, dim) if with_gram else (0, 0))
        self.class_counts = np.zeros(0, dtype=np.int64)
        self.class_sums = np.zeros((0, dim))

    def update(self, block: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Add a float64 block of rows (and their integer labels when accumulating per class)."""
        if block.shape[0] == 0:
            return
        if not self.with_gram:
            # Sums alone need no shift; summing the raw (float32) block into float64 avoids a float64 copy.
            if self.shift is None:
                self.shift = np.zeros(self.dim)
            centred = block if not self.shift.any() else block - self.shift
        else:
            if self.shift is None:
                self.shift = block.mean(axis=0, dtype=np.float64)
            centred = block.astype(np.float64)  # one float64 copy, centred in place
            centred -= self.shift
            self.gram += centred.T @ centred  # numpy dispatches A^T A to a symmetric rank-k update
        self.count += block.shape[0]
        self.sum += centred.sum(axis=0, dtype=np.float64)
        if self.by_class:
            if labels is None:
                raise DetectorError("per-class statistics need labels")
            self._update_classes(centred, labels)

    def _update_classes(self, centred: np.ndarray, labels: np.ndarray) -> None:
        if labels.min() < 0:
            raise DetectorError(f"labels must be non-negative class indices; found {int(labels.min())}")
        num_classes = int(labels.max()) + 1
        if num_classes > self.class_counts.shape[0]:
            grown = num_classes - self.class_counts.shape[0]
            self.class_counts = np.concatenate([self.class_counts, np.zeros(grown, dtype=np.int64)])
            self.class_sums = np.concatenate([self.class_sums, np.zeros((grown, self.dim))])
        rows = centred.shape[0]
        # A sparse one-hot (classes x rows) times the block sums rows per class in O(rows x D).
        # float64 ones make the product accumulate in float64 whatever the block's dtype.
        import scipy.sparse  # imported on use: `oodbench --help` does not load scipy

        one_hot = scipy.sparse.csr_matrix(
            (np.ones(rows), (labels, np.arange(rows))), shape=(self.class_counts.shape[0], rows)
        )
        self.class_sums += one_hot @ centred
        self.class_counts += np.bincount(labels, minlength=self.class_counts.shape[0])

    # ----------------------------------------------------------------- results
    @property
    def mean(self) -> np.ndarray:
        """Mean of all rows."""
        return self.shift + self.sum / self.count

    def second_moment(self) -> np.ndarray:
        """E[(x - shift)(x - shift)^T]: the covariance about the shift (divide by N)."""
        return self.gram / self.count

    def covariance(self) -> np.ndarray:
        """Covariance of all rows about their mean (divide by N)."""
        centred_mean = self.sum / self.count
        return self.gram / self.count - np.outer(centred_mean, centred_mean)

    @property
    def present_classes(self) -> np.ndarray:
        """Class indices with at least one row."""
        return np.flatnonzero(self.class_counts > 0)

    def class_means(self) -> np.ndarray:
        """Means of the present classes, shape (len(present_classes), D)."""
        present = self.present_classes
        return self.shift + self.class_sums[present] / self.class_counts[present, None]

    def within_class_covariance(self) -> np.ndarray:
        """Shared covariance: the rows' scatter about their own class mean, divided by N."""
        present = self.present_classes
        sums = self.class_sums[present]
        between = (sums / self.class_counts[present, None]).T @ sums  # sum_c n_c m_c m_c^T, with m_c = sums_c / n_c
        return (self.gram - between) / self.count


def accumulate(
    fit_set: Outputs,
    *,
    by_class: bool = False,
    shift: np.ndarray | None = None,
    with_gram: bool = True,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    description: str = "statistics",
) -> ScatterAccumulator:
    """One streamed pass over the fit set's features (optionally transformed per chunk) into a ScatterAccumulator."""
    features = fit_set.features
    stats = ScatterAccumulator(fit_set.num_features, shift=shift, by_class=by_class, with_gram=with_gram)
    for rows in fit_chunks(len(fit_set), 3 * fit_set.num_features, description):
        # Untransformed rows go in as stored (update() casts once); a transform gets them as float64.
        block = np.asarray(features[rows]) if transform is None else transform(read_rows(features, rows))
        stats.update(block, None if not by_class else np.asarray(fit_set.labels[rows]))
    return stats


def symmetric_eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending) and eigenvectors (columns) of a symmetric matrix."""
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2.0)
    return values[::-1], vectors[:, ::-1]


def pinv_sqrt(covariance: np.ndarray, rtol: float | None = None) -> np.ndarray:
    """A (D x r) with A A^T = pseudo-inverse of the symmetric PSD `covariance` (eigenvalues <= rtol * max dropped)."""
    values, vectors = symmetric_eigh(covariance)
    # The cut-off of scipy.linalg.pinvh (which sklearn's EmpiricalCovariance uses): D * eps relative to the top.
    rtol = covariance.shape[0] * np.finfo(np.float64).eps if rtol is None else rtol
    keep = values > rtol * max(values[0], 0.0)
    if not keep.any():
        raise DetectorError("the covariance matrix is zero: all fit features are identical")
    return vectors[:, keep] / np.sqrt(values[keep])


class ClassGaussians:
    """Class means and a shared precision, held whitened, for squared Mahalanobis distances by matmuls."""

    def __init__(self, means: np.ndarray, covariance: np.ndarray, centre: np.ndarray) -> None:
        self.centre = centre
        self.whitener = pinv_sqrt(covariance)  # (D, r)
        # Whitened, centred class means: M = (mu_c - centre) A; distances follow ||y||^2 - 2 y.M_c + ||M_c||^2.
        self.means = (means - centre) @ self.whitener  # (C, r)
        self.means_sq = np.einsum("cr,cr->c", self.means, self.means)

    def whiten(self, block: np.ndarray) -> np.ndarray:
        """Centred and whitened rows y = (z - centre) A."""
        return (block - self.centre) @ self.whitener

    def min_sq_distance(self, block: np.ndarray) -> np.ndarray:
        """min_c (z - mu_c)^T P (z - mu_c) for every row, without a loop over classes."""
        whitened = self.whiten(block)
        cross = whitened @ self.means.T  # (n, C): the one large product
        cross *= -2.0  # in place: ||M_c||^2 - 2 y.M_c without further (n, C) temporaries
        cross += self.means_sq
        return np.einsum("nr,nr->n", whitened, whitened) + cross.min(axis=1)


class Gaussian:
    """One Gaussian (mean, precision) held whitened: squared Mahalanobis distance of rows."""

    def __init__(self, mean: np.ndarray, covariance: np.ndarray) -> None:
        self.mean = mean
        self.whitener = pinv_sqrt(covariance)

    def sq_distance(self, block: np.ndarray) -> np.ndarray:
        """(z - mu)^T P (z - mu) for every row."""
        whitened = (block - self.mean) @ self.whitener
        return np.einsum("nr,nr->n", whitened, whitened)
