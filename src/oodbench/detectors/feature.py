"""Detectors on the penultimate features: the Mahalanobis family, k-NN, class-centroid cosine and MCM, fDBD, NECO."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import l2_normalize, logsumexp_in_place
from ..core.outputs import Head, Outputs
from ..util.chunking import DEFAULT_CHUNK_BYTES
from ..util.cores import available_cores
from ._blas import blas_threads, one_blas_thread
from ._gaussian import CLASS_GAUSSIANS_STATE, ClassGaussians, symmetric_eigh
from ._streaming import fit_chunks, gather_rows, sample_rows
from .base import Detector, Paper, Requirements, Summary, _FitInfo
from .fitsize import FitSize
from .registry import register
from .shared import statistics_for
from .state import Array, FlatIndex, IVFIndex, Optional, Scalar, Spec

_LEE = Paper(
    "Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks",
    "NeurIPS 2018",
    "https://arxiv.org/abs/1807.03888",
    "class means from fit labels, one shared covariance (divide by N), precision by a symmetric pseudo-inverse "
    "(eigenvalues below D·eps of the largest dropped, as scipy.linalg.pinvh); no input preprocessing",
)
_REN = Paper(
    "Ren et al., A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection",
    "arXiv 2021",
    "https://arxiv.org/abs/2106.09022",
    "background Gaussian: mean and covariance of all fit features; score −min_c [MD_c − MD_0]",
)
_MUELLER = Paper(
    "Müller & Hein, Mahalanobis++: Feature Normalization as the Missing Ingredient for Reliable OOD Detection",
    "arXiv 2025",
    "https://arxiv.org/abs/2505.18032",
    "ℓ2-normalisation of the features at fit and at test (also for the background Gaussian of rmaha++)",
)


class _MahalanobisFamily(Detector):
    """Class-conditional Gaussians with a shared covariance; optionally relative and/or on ℓ2-normalised features."""

    requires = Requirements.of(fit=("features", "labels"), score=("features",))
    shared_statistics = frozenset({"features_by_class"})
    # K classes present in the fit set (at most one per row); r, s: ranks of the class and background whiteners.
    state = {
        "classes_": Array("int64", ("K",)),
        "means_": Array("float64", ("K", "D")),
        "covariance_": Array("float64", ("D", "D")),
        "gaussians_": CLASS_GAUSSIANS_STATE,
    }
    state_dims = {"K": "N", "r": "D", "s": "D"}
    normalize: bool = False
    relative: bool = False

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        (need,) = self.shared_statistics
        stats = statistics_for(self, fit_set).get(need)
        self.classes_ = stats.present_classes
        self.means_ = stats.class_means()
        self.covariance_ = stats.within_class_covariance()
        # rmaha's background Gaussian (mean and covariance of all fit rows) shares the centre of the class Gaussians.
        # A triangular whitener when the covariance is invertible (see triangular_whitener), else its pseudo-inverse.
        triangular = stats.within_class_triangular_whitener()
        whiteners = (
            {"triangular": triangular} if triangular is not None else {"whitener": stats.within_class_whitener()}
        )
        background = stats.covariance() if self.relative else None
        self.gaussians_ = ClassGaussians(self.means_, self.covariance_, stats.mean, background, **whiteners)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        gaussians = self.gaussians_
        if self.normalize:
            # One float64 array, converted and normalised in one pass, then centred in place (as l2_normalize and
            # whiten would, without temporaries); norms by einsum in float64 (np.linalg.norm squares the block into
            # a temporary first).
            features = np.asarray(chunk.features)
            norms = np.sqrt(np.einsum("nd,nd->n", features, features, dtype=np.float64))
            centred = np.divide(features, np.maximum(norms, 1e-12)[:, None], dtype=np.float64)
            centred -= gaussians.centre
        else:
            centred = gaussians.centre_rows(chunk.features)  # converted and centred in one pass
        if self.relative:
            # min_c [MD_c - MD_0] = min_c MD_c - MD_0, since MD_0 does not depend on c.
            return -gaussians.relative_sq_distance(centred, overwrite=True, centred=True)
        return -gaussians.min_sq_distance(centred, overwrite=True, centred=True)

    def _row_width(self, test: Outputs) -> int:
        # Per row: the features as read (float32: half a value), their float64 centred copy (whitened in place by
        # the triangular whitener; the full whitener of the relative pair writes a second array). The class
        # search's (tile x C) buffers are fixed, not per row (ClassGaussians.search_rows). Wider chunks keep the
        # BLAS products efficient: at 1,650 rows the triangular product ran at half its 4,096-row speed.
        return (3 if self.relative else 2) * test.num_features + 8


@register("maha")
class Mahalanobis(_MahalanobisFamily):
    """Negative squared Mahalanobis distance to the closest class mean (shared covariance)."""

    paper = _LEE
    summary = Summary(
        "−min_c (z−μ_c)ᵀP(z−μ_c), shared covariance",
        also_in="pytorch-ood, OpenOOD",
    )


@register("rmaha")
class RelativeMahalanobis(_MahalanobisFamily):
    """Relative Mahalanobis: −min_c [MD_c(z) − MD_0(z)], MD_0 under one Gaussian fit to all features."""

    relative = True
    paper = _REN
    summary = Summary(
        "−min_c [MD_c(z) − MD_0(z)], MD_0 from one Gaussian on all fit features",
        also_in="pytorch-ood, OpenOOD",
    )


@register("maha++")
class MahalanobisPlusPlus(_MahalanobisFamily):
    """Mahalanobis on ℓ2-normalised features (at fit and at test)."""

    shared_statistics = frozenset({"normalized_by_class"})
    normalize = True
    paper = _MUELLER
    summary = Summary(
        "`maha` on ℓ2-normalised features (fit and test)",
    )


@register("rmaha++")
class RelativeMahalanobisPlusPlus(_MahalanobisFamily):
    """Relative Mahalanobis on ℓ2-normalised features, background Gaussian included."""

    shared_statistics = frozenset({"normalized_by_class"})
    normalize = True
    relative = True
    paper = _MUELLER
    summary = Summary(
        "`rmaha` on ℓ2-normalised features, background Gaussian included",
    )


def _normalize_in_place(block: np.ndarray) -> np.ndarray:
    """Scale float32 rows to unit ℓ2 norm in place (all-zero rows stay zero)."""
    # Norms in float64: a float32 sum of squares underflows for tiny rows (entries of 1e-25) and overflows for large
    # ones (1e20), which would leave a row neither unit nor zero; every non-zero row becomes unit (each entry
    # divided in float64 and rounded once).
    norms = np.sqrt(np.einsum("nd,nd->n", block, block, dtype=np.float64))
    np.divide(block, np.where(norms > 0, norms, 1.0)[:, None], out=block, casting="same_kind")
    return block


def unit_float32(rows: np.ndarray) -> np.ndarray:
    """ℓ2-normalised rows as a new contiguous float32 array, the form faiss searches."""
    return _normalize_in_place(np.array(rows, dtype=np.float32, order="C"))


def _flat_index(features: np.ndarray) -> Any:
    """An exact faiss inner-product index (IndexFlatIP) of the normalised rows, filled in place chunk by chunk."""
    import faiss

    num_rows, dim = features.shape
    index = faiss.IndexFlatIP(dim)
    # Size the storage once: growing it add() by add() would briefly hold two copies of an N x D index.
    index.codes.resize(num_rows * dim * 4)
    storage = faiss.rev_swig_ptr(index.codes.data(), num_rows * dim * 4).view(np.float32).reshape(num_rows, dim)
    for rows in fit_chunks(num_rows, dim, "knn: index"):
        storage[rows] = features[rows]
        _normalize_in_place(storage[rows])
    index.ntotal = num_rows
    return index


def _ivf_lists(index: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """The coarse centroids and each inverted list's vectors of a faiss IndexIVFFlat, as float32 views (no copy)."""
    import faiss

    quantizer = faiss.downcast_index(index.quantizer)
    centroids = faiss.rev_swig_ptr(quantizer.get_xb(), index.nlist * index.d).reshape(index.nlist, index.d)
    lists = index.invlists
    vectors = []
    for number in range(index.nlist):
        size = int(lists.list_size(number))
        if size == 0:
            vectors.append(np.zeros((0, index.d), np.float32))
            continue
        codes = faiss.rev_swig_ptr(lists.get_codes(number), size * index.code_size)
        vectors.append(codes.view(np.float32).reshape(size, index.d))
    return centroids, vectors


class _RunningKth:
    """Each query's k largest values so far, fed one block of values (one list's products) at a time.

    A value at or below a query's k-th largest so far (`kth`: the least of its k held values, -inf until k are
    held) cannot change its final k-th largest, so it is dropped. Proof: let S be the k values held (each an
    element of the final multiset T, distinct from the dropped v) and s their least, so v <= s <= t, the k-th
    largest of T. Every element of S is >= s >= v and stays in T without v: T without v still holds k values
    >= s, and its k-th largest is >= s; if v < t, the k values of T that are >= t are all still there, so the
    k-th largest stays t; if v == t, then s == t and S's k values (>= t) are still there, so again it stays t.
    (Removing a value never raises a k-th largest, so it is exactly t.) Ties (v == s) thus drop too.
    The values above `kth` are appended to a per-query `pending` buffer of `width` slots; a query's buffer is
    merged into its k held values (one partition of k + width) only when the next block would overflow it, so
    a partition is paid per `width` entering values rather than per block (the threshold used to filter is then
    the one of the last merge: a lower bound of the current k-th, so the argument above still holds).
    """

    def __init__(self, rows: int, k: int, width: int, indexed: bool = False) -> None:
        self.k, self.width, self.indexed = k, width, indexed
        self.top = np.full((rows, k), -np.inf, dtype=np.float32)
        self.kth = np.full(rows, -np.inf, dtype=np.float32)
        self.pending = np.full((rows, width), -np.inf, dtype=np.float32)  # unfilled slots stay -inf
        self.fill = np.zeros(rows, dtype=np.int64)
        # With `indexed`, the column (bank row) of every held and pending value, -1 for an unfilled slot.
        self.top_ids = np.full((rows, k), -1, dtype=np.int64) if indexed else None
        self.pending_ids = np.full((rows, width), -1, dtype=np.int64) if indexed else None

    def hold(self, top: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Start from k values per query already known to be among its values (e.g. the k largest of a first block)."""
        self.top = np.ascontiguousarray(top, dtype=np.float32)
        self.kth = self.top.min(axis=1)
        if self.indexed:
            self.top_ids = np.ascontiguousarray(ids, dtype=np.int64)

    def _merge(self, rows: np.ndarray, extra: np.ndarray | None = None, extra_ids: np.ndarray | None = None) -> None:
        """Merge the pending values of `rows` (and `extra` values, one row each) into their k held values."""
        parts = [self.top[rows], self.pending[rows]] + ([] if extra is None else [extra])
        merged = np.concatenate(parts, axis=1)
        cut = merged.shape[1] - self.k
        if self.indexed:
            ids = [self.top_ids[rows], self.pending_ids[rows]] + ([] if extra is None else [extra_ids])
            keep = np.argpartition(merged, cut, axis=1)[:, cut:]
            top = np.take_along_axis(merged, keep, axis=1)
            self.top_ids[rows] = np.take_along_axis(np.concatenate(ids, axis=1), keep, axis=1)
            self.pending_ids[rows] = -1
        else:
            top = np.partition(merged, cut, axis=1)[:, cut:]
        self.top[rows] = top
        self.kth[rows] = top.min(axis=1)
        self.pending[rows] = -np.inf
        self.fill[rows] = 0

    def add(self, who: np.ndarray, values: np.ndarray, offset: int = 0) -> None:
        """Feed `values[i]` to query `who[i]` (the queries in `who` are distinct); value j of a line is the one of
        column (bank row) `offset` + j."""
        above = values > self.kth[who][:, None]
        count = np.count_nonzero(above, axis=1)
        full = self.fill[who] + count > self.width
        if full.any():
            self._merge(who[full])  # a tighter threshold first: fewer of this block's values then enter
            above[full] = values[full] > self.kth[who[full]][:, None]
            count[full] = np.count_nonzero(above[full], axis=1)
            wide = count > self.width  # more entering values than the buffer holds (a first, large list)
            if wide.any():
                columns = np.broadcast_to(offset + np.arange(values.shape[1]), (int(wide.sum()), values.shape[1]))
                self._merge(who[wide], values[wide], columns if self.indexed else None)
                above[wide] = False
                count[wide] = 0
        entering = values[above]  # row-major: line by line, each line's entering values in order
        if len(entering):
            # The j-th entering value of line i goes to slot fill + j of query who[i]'s buffer: flat position
            # who[i] * width + fill + (n - start[i]) for the n-th entering value overall.
            fill = self.fill[who]
            first = who * self.width + fill - (np.cumsum(count) - count)
            slots = np.repeat(first, count) + np.arange(len(entering))
            self.pending.reshape(-1)[slots] = entering
            if self.indexed:
                self.pending_ids.reshape(-1)[slots] = offset + np.nonzero(above)[1]
            self.fill[who] = fill + count

    def finish(self) -> np.ndarray:
        """Each query's k largest values over all blocks (rows x k, float32, in no order; -inf fills a short row);
        with `indexed`, their columns are then in `top_ids`."""
        waiting = np.flatnonzero(self.fill)
        for begin in range(0, len(waiting), 1024):  # bounded: 1,024 rows of k + width values at a time
            self._merge(waiting[begin : begin + 1024])
        return self.top

    def result(self) -> np.ndarray:
        """Each query's k-th largest value over all blocks (-inf where fewer than k were fed), as float64."""
        self.finish()
        return self.kth.astype(np.float64)


def ivf_kth_similarity(
    queries: np.ndarray,
    centroids: np.ndarray,
    lists: list[np.ndarray],
    nprobe: int,
    k: int,
    probe_with: np.ndarray | None = None,
    merge_width: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k-th largest inner product of each query among the vectors of its `nprobe` closest lists.

    What faiss's IndexIVFFlat search returns in its last column, computed list by list as BLAS products: the
    queries that probe a list are multiplied with its vectors in one GEMM, and each query keeps its k largest
    values so far (faiss scans one query's lists at a time, many times slower than a GEMM on these shapes; see
    docs/detectors.md). The lists are chosen by the inner products of `probe_with` (default: the queries) with the
    centroids; knn probes with its centred rows. Only products above a query's k-th so far are kept, and they are
    merged into its k held values `merge_width` (default 2k) at a time (`_RunningKth`). Returns the k-th similarity
    (-inf where fewer than k vectors were probed) and the number of vectors each query probed.
    """
    rows, nlist = queries.shape[0], centroids.shape[0]
    nprobe = min(nprobe, nlist)
    if nprobe < nlist:
        coarse = (queries if probe_with is None else probe_with) @ centroids.T
        probes = np.argpartition(-coarse, nprobe - 1, axis=1)[:, :nprobe]
    else:
        probes = np.broadcast_to(np.arange(nlist), (rows, nlist))
    probed = np.array([len(v) for v in lists], dtype=np.int64)[probes].sum(axis=1)
    running = _RunningKth(rows, k, 2 * k if merge_width is None else merge_width)
    pairs = probes.ravel()
    order = np.argsort(pairs, kind="stable")
    owner = np.repeat(np.arange(rows), nprobe)[order]
    bounds = np.searchsorted(pairs[order], np.arange(nlist + 1))
    # One BLAS thread for the per-list products: they are small (queries of a chunk that probe one list x its
    # rows), and two threads waited on each other between them when other processes held the cores (1/20 of the
    # benchmark, k = 50, 1,012 lists, 4 probed: 0.65 s on one thread against 4.65 s on two; docs/detectors.md).
    with one_blas_thread():
        for number in np.flatnonzero(np.diff(bounds)):
            vectors = lists[number]
            if len(vectors) == 0:
                continue
            who = owner[bounds[number] : bounds[number + 1]]
            running.add(who, queries[who] @ vectors.T)
    return running.result(), probed


# Fewest queries per thread of a parallel IVF search: below this the per-list products get too narrow to pay.
ROWS_PER_SEARCH_THREAD = 512

# Bank rows per product of an exact search: wide enough to run at the GEMM rate, few enough that a chunk's block of
# products stays small beside its rows (4,096 float32 values a query).
FLAT_BLOCK_ROWS = 4096
# Fewest multiply-adds in one thread's part of an exact search (a few milliseconds on one core): a smaller search,
# such as 1,000 queries in NNGuide's bank of 50 rows, costs less on the calling thread than a thread's start.
FLAT_PART_WORK = 1 << 27


def flat_vectors(index: Any) -> np.ndarray:
    """The vectors of a faiss IndexFlat (rows x D, float32) as a view of its storage: no copy."""
    import faiss

    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


def flat_top_similarities(queries: np.ndarray, bank: np.ndarray, k: int) -> np.ndarray:
    """Each query's k largest inner products with the rows of `bank`, exactly (rows x k, float32, in no order).

    What an exact faiss IndexFlatIP search returns, computed as BLAS products of the queries with blocks of
    FLAT_BLOCK_ROWS bank rows: faiss's own search ran 4.5 times slower than numpy's product and one partition on
    one core (1,000 queries in 5,000 rows at D = 512: 130 ms against 29 ms; docs/detectors.md). A bank of one
    block is one product and one partition; in a larger one the first block's k largest start each query's running
    top k (`_RunningKth`), which the later blocks' products above its k-th enter. Both are float32 products of D
    terms, as faiss's, so the values agree with its to their rounding.
    """
    return _flat_top(queries, bank, k, indexed=False)[0]


def flat_top_candidates(queries: np.ndarray, bank: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """flat_top_similarities with the bank row of each value: (values, rows), both rows x k, in no order."""
    values, ids = _flat_top(queries, bank, k, indexed=True)
    return values, ids


def _flat_top(queries: np.ndarray, bank: np.ndarray, k: int, indexed: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The k largest products of each query with the bank (and, `indexed`, their bank rows)."""
    rows, size = queries.shape[0], bank.shape[0]
    if k > size:
        raise DetectorError(f"k={k} exceeds the {size} rows searched")
    first = min(max(FLAT_BLOCK_ROWS, k), size)  # at least k rows, whose k largest products start the running top k
    products = queries @ bank[:first].T
    if indexed:
        ids = np.argpartition(products, first - k, axis=1)[:, first - k :]
        top = np.take_along_axis(products, ids, axis=1)
    else:
        ids, top = None, np.partition(products, first - k, axis=1)[:, first - k :]
    del products
    if first == size:
        return top, ids
    running = _RunningKth(rows, k, 2 * k, indexed=indexed)
    running.hold(top, ids)
    everyone = np.arange(rows)
    for start in range(first, size, FLAT_BLOCK_ROWS):
        running.add(everyone, queries @ bank[start : start + FLAT_BLOCK_ROWS].T, offset=start)
    return running.finish(), running.top_ids


def flat_search(queries: np.ndarray, index: Any, k: int) -> np.ndarray:
    """flat_top_similarities of the queries in a faiss IndexFlat's vectors, the queries split across the cores.

    Each part runs its products on one BLAS thread (as the IVF search): parts give the same values as one search
    up to the float32 rounding of the products, which the BLAS may order otherwise for another number of rows.
    """
    (top,) = _flat_parts(queries, index, lambda part, bank: (flat_top_similarities(queries[part], bank, k),))
    return top


def flat_search_candidates(queries: np.ndarray, index: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """flat_top_candidates of the queries in a faiss IndexFlat's vectors, split across the cores as flat_search."""
    values, ids = _flat_parts(queries, index, lambda part, bank: flat_top_candidates(queries[part], bank, k))
    return values, ids


def _flat_parts(
    queries: np.ndarray, index: Any, search: Callable[[slice, np.ndarray], tuple[np.ndarray, ...]]
) -> tuple[np.ndarray, ...]:
    """`search`(part, bank) over parts of the queries on the cores, each part holding FLAT_PART_WORK multiply-adds."""
    bank = flat_vectors(index)
    min_rows = -(-FLAT_PART_WORK // max(1, bank.shape[0] * bank.shape[1]))
    return searches_across_cores(lambda part: search(part, bank), len(queries), min_rows)


@dataclass(frozen=True)
class BankNorms:
    """Squared norms of a search bank's rows in float64, and what the exact k-th distance needs of them."""

    squared: np.ndarray  # (N,) float64
    low: float  # least squared norm of a non-zero row (1 when there is none)
    high: float  # largest squared norm of any row
    zero_rows: int  # rows that are all zero

    @classmethod
    def of(cls, bank: np.ndarray) -> BankNorms:
        """The norms of `bank` (N x D float32), computed in float64 in blocks of at most 2^24 values."""
        rows, dim = bank.shape
        squared = np.empty(rows, dtype=np.float64)
        step = max(1, (1 << 24) // max(1, dim))
        for start in range(0, rows, step):
            block = bank[start : start + step].astype(np.float64)
            squared[start : start + step] = np.einsum("nd,nd->n", block, block)
        nonzero = squared[squared > 0]
        low = float(nonzero.min()) if len(nonzero) else 1.0
        high = float(squared.max()) if rows else 0.0
        return cls(squared, low, high, int(rows - len(nonzero)))


def exact_kth_distance(
    queries: np.ndarray, bank: np.ndarray, values: np.ndarray, ids: np.ndarray, k: int, norms: BankNorms
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k-th smallest Euclidean distance to the bank rows, in float64, from its float32 candidates.

    `values`/`ids` hold, per query, the w >= k largest float32 products and their rows (flat_top_candidates). With
    a_j = q·b_j exact and s_j its float32 product, |s_j − a_j| <= δ = γ_D·sqrt(|q|²·max|b|²) (D roundings of
    float32 terms, Cauchy–Schwarz), and ‖q − b_j‖² = |q|² + |b_j|² − 2a_j. Let t be the k-th largest s and
    Δ = 2δ + (max|b|² − min|b|²)/2 over the non-zero rows. Then (1) the k rows at or above t are all within
    U = |q|² + max|b|² − 2t + 2δ, so the k-th distance is at most U, and a non-zero row with s < t − Δ lies beyond
    U: it cannot change the k-th; (2) without zero rows, a row with s >= t + Δ is no farther than any row with
    s <= t, of which there are at least N − k + 1, so it is among the k nearest and only their count m matters.
    The k-th distance is thus the (k − m)-th smallest of the exact distances to the rows with t − Δ <= s < t + Δ
    (all rows with s >= t − Δ, and each zero row at |q|, when the bank has zero rows): computed as ‖q − b_j‖ in
    float64 from the float32 rows, exact to float64 rounding, the same whichever rows are scored with it, and 0 for
    a query that repeats a bank row. Returns the distances and a mask of the queries whose rows with s >= t − Δ may
    reach beyond their w candidates (w < N and the least candidate >= t − Δ): search those again with more.
    """
    rows, dim = queries.shape
    size, width = bank.shape[0], values.shape[1]
    unit32 = 2.0**-24
    gamma = dim * unit32 / (1.0 - dim * unit32)
    q64 = queries.astype(np.float64)
    query_norms = np.einsum("nd,nd->n", q64, q64)
    kth = np.partition(values, width - k, axis=1)[:, width - k].astype(np.float64)
    delta = gamma * np.sqrt(query_norms * norms.high)
    # The slack covers the float64 rounding of the norms, of these bounds and of the distances (~D·2⁻⁵³ relative).
    band = (2.0 * delta + (norms.high - norms.low) / 2.0) * (1.0 + 1e-6) + 1e-12 * (query_norms + norms.high)
    band = np.maximum(band, 1e-300)  # a zero query: all its products are 0 exactly; handled below
    lowest = values.min(axis=1).astype(np.float64)
    overflow = (width < size) & (lowest >= kth - band) & (query_norms > 0)
    floor = kth - band
    refine = values.astype(np.float64) >= floor[:, None]
    sure = np.zeros(rows, dtype=np.int64)
    if norms.zero_rows == 0:
        above = values.astype(np.float64) >= (kth + band)[:, None]
        sure = np.count_nonzero(above, axis=1)
        refine &= ~above
    else:
        refine &= norms.squared[ids] > 0  # zero rows enter below, each at |q|
    squared = np.full(values.shape, np.inf)
    who, slot = np.nonzero(refine)
    step = max(1, (1 << 22) // max(1, dim))
    for start in range(0, len(who), step):
        q, s = who[start : start + step], slot[start : start + step]
        difference = q64[q] - bank[ids[q, s]].astype(np.float64)
        squared[q, s] = np.einsum("nd,nd->n", difference, difference)
    if norms.zero_rows:
        zeros = np.repeat(query_norms[:, None], min(norms.zero_rows, k), axis=1)
        squared = np.concatenate([squared, zeros], axis=1)
    squared.sort(axis=1)
    result = squared[np.arange(rows), k - sure - 1]
    empty = query_norms == 0  # a zero query is at |b_j| from every row: the k-th smallest bank norm
    if empty.any():
        result[empty] = np.partition(norms.squared, k - 1)[k - 1]
    return np.sqrt(result), overflow


def searches_across_cores(
    search: Callable[[slice], tuple[np.ndarray, ...]], rows: int, min_rows: int | None = None
) -> tuple[np.ndarray, ...]:
    """across_cores on as many threads as the BLAS may use, each part's products on one BLAS thread.

    One limit for the whole parallel section: a limit entered and left inside each thread would give the BLAS its
    threads back while another part still runs. The number of threads is read before that limit, which would
    otherwise report one thread.
    """
    threads = blas_threads()
    with one_blas_thread():
        return across_cores(search, rows, threads, min_rows)


def across_cores(
    search: Callable[[slice], tuple[np.ndarray, ...]], rows: int, threads: int, min_rows: int | None = None
) -> tuple[np.ndarray, ...]:
    """`search` over contiguous parts of `rows` queries, on up to `threads` threads; the parts' results in row order.

    The IVF search's per-list products run on one BLAS thread each (ivf_kth_similarity), so one search uses one
    core. Queries are independent, so parts give the results of one search over all rows up to the float32
    rounding of the products: the BLAS may sum a product in another order for another number of rows (OpenBLAS
    0.3.31 does, from one row up), never by more than that rounding. numpy releases the GIL in its products and
    partitions, so threads suffice. `threads` is read by the caller before it limits the BLAS to one thread; each
    part holds at least `min_rows` queries (default ROWS_PER_SEARCH_THREAD).
    """
    workers = max(1, min(threads, rows // (ROWS_PER_SEARCH_THREAD if min_rows is None else max(1, min_rows))))
    if workers == 1:
        return search(slice(0, rows))
    bounds = np.linspace(0, rows, workers + 1).astype(int)
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(search, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))
    return tuple(np.concatenate(results) for results in zip(*parts, strict=True))


def default_nlist(num_rows: int, k: int) -> int:
    """knn's number of IVF lists: lists of about k rows, kept between sqrt(N) and 4 sqrt(N) lists (and <= N).

    A query's k nearest neighbours in one cluster then fill about one list, so a few probed lists hold them (at
    1/20 of the benchmark with k = 50 and 4 lists probed, AUROC moved by 0.005 points with 1,012 lists and by 27
    with sqrt(N) = 253; docs/detectors.md). The clip bounds the fit: k-means and the assignment cost N x L
    products, the search Q x N x nprobe / L; at ImageNet's N = 1.28 M and k = 1000 the rule gives 1,281 lists, near sqrt(N) = 1,131.
    """
    root = math.sqrt(num_rows)
    # At most 4 sqrt(N) lists, and no more than leave 39 rows per list (faiss's minimum for k-means) where
    # that still allows sqrt(N).
    most = max(root, min(4 * root, num_rows / 39))
    return max(1, min(num_rows, int(round(min(max(num_rows / k, root), most)))))


@register("knn")
class KNN(Detector):
    """Negative distance to the K-th nearest ℓ2-normalised fit feature (exact by default, IVF when asked)."""

    requires = Requirements.of(fit=("features",), score=("features",))
    paper = Paper(
        "Sun, Ming, Zhu & Li, Out-of-Distribution Detection with Deep Nearest Neighbors",
        "ICML 2022",
        "https://arxiv.org/abs/2204.06507",
        "k=1000: the paper's ImageNet setting (alpha = 100% of the training set); index='flat' is exact "
        "(every inner product of the unit vectors as float32 BLAS products; with exact=True the k-th distance "
        "||q - b|| in float64 among the rows within the products' rounding of the k-th, exact=False "
        "sqrt(2 - 2 cos) of the float32 k-th product, as faiss and the peers); index='ivf' is approximate "
        "(faiss IndexIVFFlat: lists by spherical k-means of the centred normalised rows, nlist default N/k "
        "clipped to [sqrt(N), 4 sqrt(N)], k-means on 64 rows per list with 10 iterations, "
        "nprobe=32 lists searched per query, searched list by list as BLAS products). The index holds the "
        "fit set in RAM as float32 (N x D x 4 bytes)",
    )
    summary = Summary(
        "−‖ẑ − ẑ_(K)‖, the K-th nearest normalised fit feature",
        defaults='k: the paper\'s ImageNet setting, 100% of the training set; index "flat" is exact, "ivf" approximate (faiss IVF lists searched as BLAS products); nlist None: N/k within [√N, 4√N]; exact: the k-th distance in float64 (False: from the float32 product, as the peers)',
        also_in="pytorch-ood, OpenOOD",
    )

    def __init__(
        self,
        k: int = 1000,
        index: str = "flat",
        nlist: int | None = None,
        nprobe: int = 32,
        seed: int = 0,
        exact: bool = True,
    ) -> None:
        self.k = k
        self.index = index
        self.exact = exact
        self.nlist = nlist
        self.nprobe = nprobe
        self.seed = seed

    def _validate_params(self) -> None:
        self._check_int(k=self.k, nprobe=self.nprobe)
        self._check_int(minimum=0, seed=self.seed)
        if self.index not in ("flat", "ivf"):
            raise DetectorError(f"knn: index must be 'flat' (exact) or 'ivf' (approximate); got {self.index!r}")
        if self.nlist is not None:
            self._check_int(nlist=self.nlist)

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """The flat index holds the N normalised fit rows; the IVF index also its L <= N centroids (nlist_)."""
        if fit.num_rows is not None and self.k > fit.num_rows:
            raise DetectorError(f"knn: k={self.k} exceeds the fit set's {fit.num_rows} rows")
        if self.index == "flat":
            return {"index_": FlatIndex("N", "D")}
        return {
            "index_": IVFIndex("N", "D", "L", int(self.nprobe)),
            "nlist_": Scalar(int, "L", "L"),
            # None in files saved before the lists were built from centred rows: they probe uncentred, as built.
            "centre_": Optional(Array("float32", ("D",))),
        }

    state_dims = {"L": "N"}

    def size_problems(self, size: FitSize) -> list[str]:
        problems = []
        if self.k > size.rows:
            problems.append(f"k={self.k} exceeds the fit set's {size.rows} rows; use k <= {size.rows}")
        if self.index == "ivf" and self.nlist is not None and self.nlist > size.rows:
            problems.append(f"nlist={self.nlist} exceeds the fit set's {size.rows} rows; use nlist <= {size.rows}")
        return problems

    def adapted_to(self, size: FitSize) -> dict[str, Any]:
        # One neighbour per 1,000 fit rows (at least one): the default k=1000 keeps about that share of
        # ImageNet-1k's training set, the fit set it was chosen for.
        changes: dict[str, Any] = {}
        if self.k > size.rows:
            changes["k"] = max(1, round(size.rows / 1000))
        if self.index == "ivf" and self.nlist is not None and self.nlist > size.rows:
            changes["nlist"] = None  # the default rule, which never exceeds the rows
        return changes

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        import faiss

        num_rows, dim = len(fit_set), fit_set.num_features
        if self.index == "flat":
            self.index_ = _flat_index(fit_set.features)
            return
        nlist = self.nlist if self.nlist is not None else default_nlist(num_rows, self.k)
        if nlist > num_rows:
            raise DetectorError(f"knn: nlist={nlist} exceeds the fit set's {num_rows} rows")
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        # k-means on 64 rows per list (faiss warns below 39) for 10 iterations: the sample and the iterations
        # are the fit's cost at full size, and more of either moved the benchmark's AUROC by < 0.01 points.
        index.cp.niter = 10
        index.cp.max_points_per_centroid = 64
        index.cp.seed = int(self.seed)
        sample = unit_float32(
            gather_rows(fit_set.features, sample_rows(num_rows, min(num_rows, 64 * nlist), self.seed))
        )
        # The lists come from the centred rows: unit features share a large common direction (post-ReLU features
        # are all positive), and clustered as they are, one list near that direction drew the rows of many classes
        # (the largest of 1,012 lists held 2,129 rows against a mean of 63 at 1/20 of the benchmark; centred, 247).
        # Within one query's search the centre shifts every similarity by the same q·centre, so the ranking, and
        # thus which rows are near, does not change; the lists still hold the uncentred unit rows.
        self.centre_ = sample.mean(axis=0, dtype=np.float64).astype(np.float32)
        index.train(_normalize_in_place(sample - self.centre_))
        del sample
        index.nprobe = self.nprobe
        self.nlist_ = nlist
        for rows in fit_chunks(num_rows, dim, "knn: index"):
            unit = unit_float32(fit_set.features[rows])
            _, lists = index.quantizer.search(_normalize_in_place(unit - self.centre_), 1)
            lists = np.ascontiguousarray(lists.ravel(), dtype=np.int64)
            index.add_core(len(unit), faiss.swig_ptr(unit), None, faiss.swig_ptr(lists))
        self.index_ = index

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        queries = unit_float32(chunk.features)
        if self.index == "flat" and self.exact:
            return -self._exact_distances(queries)
        if self.index == "flat":
            kth = flat_search(queries, self.index_, self.k).min(axis=1).astype(np.float64)
        else:
            centroids, lists = _ivf_lists(self.index_)
            probe_with = queries if self.centre_ is None else _normalize_in_place(queries - self.centre_)
            nprobe = int(self.index_.nprobe)

            def search(part: slice) -> tuple[np.ndarray, np.ndarray]:
                return ivf_kth_similarity(queries[part], centroids, lists, nprobe, self.k, probe_with=probe_with[part])

            kth, probed = searches_across_cores(search, len(queries))
            if (probed < self.k).any():
                raise DetectorError(
                    f"knn: the IVF index found fewer than k={self.k} neighbours for some rows (as few as "
                    f"{int(probed.min())}); raise nprobe (now {self.nprobe}) or use index='flat'"
                )
        # Unit vectors: ||a - b||^2 = 2 - 2 cos(a, b); clamp the float32 round-off below zero.
        return -np.sqrt(np.maximum(2.0 - 2.0 * kth, 0.0))

    def _exact_distances(self, queries: np.ndarray) -> np.ndarray:
        """The k-th nearest distance of each query in the flat index, exactly (exact_kth_distance)."""
        bank = flat_vectors(self.index_)
        norms = getattr(self, "_bank_norms", None)
        if norms is None or len(norms.squared) != len(bank):
            norms = self._bank_norms = BankNorms.of(bank)  # once per fitted or loaded detector; derived, not state
            # knn's rows are float32 unit vectors (or zero): |b|² within a few γ_(D+4) of 1. A loaded index of other
            # rows would widen every band (and the candidates kept) by their spread, so it is refused.
            unit = 2.0**-24
            spread = 4.0 * (bank.shape[1] + 4) * unit / (1.0 - (bank.shape[1] + 4) * unit)
            if norms.high > 1.0 + spread or norms.low < 1.0 - spread:
                raise DetectorError(
                    f"knn: the flat index's rows are not unit vectors (squared norms {norms.low:.6g} to "
                    f"{norms.high:.6g}); it was not built by knn's fit"
                )
        size, distances = len(bank), np.empty(len(queries))
        # A few more candidates than k: the rows within the float32 rounding of the k-th then fit among them.
        width, todo = min(size, self.k + max(self.k // 4, 16)), np.arange(len(queries))
        while len(todo):
            values, ids = flat_search_candidates(queries[todo], self.index_, width)
            found, overflow = exact_kth_distance(queries[todo], bank, values, ids, self.k, norms)
            distances[todo[~overflow]] = found[~overflow]
            todo, width = todo[overflow], min(size, 4 * width)
        return distances

    # The IVF search multiplies the queries of a chunk that probe one list with its vectors: about
    # rows x nprobe / nlist queries per product, which needs wide chunks to run at the GEMM rate; a chunk is
    # split across the cores (across_cores), so it is wider again by their number.
    chunk_bytes = 4 * DEFAULT_CHUNK_BYTES * min(available_cores(), 4)

    def _row_width(self, test: Outputs) -> int:
        if self.index == "flat":
            # The normalised float32 row, its products with a block of the bank (the first block holds at least k
            # rows) and their partitioned copy, the running top k and its buffer of 2k (float32: half a value each).
            block = min(int(self.index_.ntotal), max(FLAT_BLOCK_ROWS, self.k))
            # The candidates (w ~ 1.25k): float32 values and their float64 copies, int64 rows, float64 distances.
            width = min(int(self.index_.ntotal), self.k + max(self.k // 4, 16))
            return (test.num_features + 2 * block + 3 * width) // 2 + 4 * width + 2 * test.num_features + 1
        # The normalised float32 row, its centred copy that chooses the lists and its gathered copy, the coarse
        # products, the running top k and its buffer of 2k entering values (float32: half a value each); the per-list
        # products and their merge are bounded by the largest list, not per row.
        return (3 * test.num_features + self.nlist_ + 5 * self.k) // 2


class _CentroidDetector(Detector):
    """Shared by the class-centroid scores: class means of the fit features (labels), ℓ2-normalised."""

    requires = Requirements.of(fit=("features", "labels"), score=("features",))
    shared_statistics = frozenset({"class_sums"})
    state = {
        "classes_": Array("int64", ("K",)),
        "centroids_": Array("float64", ("K", "D")),
        "centroids_f32_": Array("float32", ("K", "D")),
    }
    state_dims = {"K": "N"}

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        stats = statistics_for(self, fit_set).get("class_sums")
        self.classes_ = stats.present_classes
        self.centroids_ = l2_normalize(stats.class_means())
        self.centroids_f32_ = self.centroids_.astype(np.float32)

    def _products(self, chunk: Outputs) -> tuple[np.ndarray, np.ndarray]:
        """z · μ̂_c (float32, rows x classes) and 1/‖z‖: cosines without a normalised copy of the features.

        Cosines lie in [-1, 1], so float32 keeps them to ~1e-7, at twice float64's speed.
        """
        features = np.asarray(chunk.features, dtype=np.float32)
        norms = np.sqrt(np.einsum("nd,nd->n", features, features))
        return features @ self.centroids_f32_.T, 1.0 / np.maximum(norms, np.float32(1e-12))

    def _row_width(self, test: Outputs) -> int:
        return 2 * test.num_features + 3 * self.centroids_.shape[0]


@register("cosine")
class Cosine(_CentroidDetector):
    """Maximum cosine similarity to the class means of the fit features."""

    paper = Paper(
        "Class-centroid counterpart of the CLIP cosine score (Müller & Hein's NINCO evaluation code)",
        "arXiv 2025",
        "https://github.com/mueller-mp/maha-norm",
        "class means of the raw fit features, then ℓ2-normalised; no hyper-parameters",
    )
    summary = Summary(
        "max_c cos(z, μ_c), class means of the fit features",
    )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        products, inverse_norms = self._products(chunk)
        return products.max(axis=1).astype(np.float64) * inverse_norms


@register("mcm")
class MCM(_CentroidDetector):
    """Maximum softmax over classes of cos(z, μ_c)/τ (MCM with class means in place of text embeddings)."""

    paper = Paper(
        "Ming et al., Delving into Out-of-Distribution Detection with Vision-Language Representations",
        "NeurIPS 2022",
        "https://arxiv.org/abs/2211.13445",
        "temperature=1: the MCM paper's default tau and the class-mean variant in Müller & Hein's evaluation "
        "code (github.com/mueller-mp/maha-norm)",
    )
    summary = Summary(
        "max_c softmax_c(cos(z, μ_c)/τ)",
        defaults="MCM's τ; the class-mean variant of Müller & Hein's code",
        also_in="pytorch-ood, OpenOOD (on CLIP text embeddings)",
    )

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _validate_params(self) -> None:
        self._check_positive(temperature=self.temperature)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        scaled, inverse_norms = self._products(chunk)
        scaled *= (inverse_norms / np.float32(self.temperature))[:, None]  # cos(z, μ_c) / τ
        peak = scaled.max(axis=1).astype(np.float64)
        # max_c softmax_c = exp(max - logsumexp): float32 exponentials, float64 sums.
        return np.exp(peak - logsumexp_in_place(scaled))


@register("fdbd")
class FDBD(Detector):
    """fDBD: mean over c ≠ ŷ of |f_ŷ − f_c| / ‖w_ŷ − w_c‖, divided by ‖z − mean_fit(z)‖."""

    requires = Requirements.of(fit=("features",), score=("features", "logits"), head=True)
    shared_statistics = frozenset({"mean"})
    state = {"train_mean_": Array("float64", ("D",)), "inverse_distances_": Array("float64", ("C", "C"))}
    paper = Paper(
        "Liu & Qin, Fast Decision Boundary based Out-of-Distribution Detector",
        "ICML 2024",
        "https://arxiv.org/abs/2312.11536",
        "the paper's score (feature distance to the fit-set mean as the normaliser, as in its ImageNet "
        "results); the mean over the C - 1 other classes; no hyper-parameters",
    )
    summary = Summary(
        "mean_{c≠ŷ} |f_ŷ − f_c| / ‖w_ŷ − w_c‖, over ‖z − mean_fit(z)‖",
        also_in="pytorch-ood, OpenOOD",
        agreement="OpenOOD sums over the classes (the c = ŷ term is 0): (C − 1) × this score, the same ranks, to 2.4e-7 relative (its `fdbd.yml`, distance_as_normalizer=True); pytorch-ood not compared",
    )

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        weight = np.asarray(head.weight, dtype=np.float64)
        self.train_mean_ = statistics_for(self, fit_set).get("mean").mean
        norms = np.einsum("cd,cd->c", weight, weight)
        squared = np.maximum(norms[:, None] + norms[None, :] - 2.0 * (weight @ weight.T), 0.0)
        distances = np.sqrt(squared)
        np.fill_diagonal(distances, 1.0)  # the c = ŷ term has a zero numerator; any non-zero denominator will do
        if (distances == 0.0).any():
            i, j = np.argwhere(distances == 0.0)[0]
            raise DetectorError(f"fdbd: head rows {i} and {j} are identical, so their decision boundary is undefined")
        self.inverse_distances_ = 1.0 / distances

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        logits = np.asarray(chunk.logits, dtype=np.float64)
        predicted = logits.argmax(axis=1)
        top = logits[np.arange(logits.shape[0]), predicted]
        boundary = np.einsum("nc,nc->n", top[:, None] - logits, self.inverse_distances_[predicted])
        distance = np.linalg.norm(np.asarray(chunk.features, dtype=np.float64) - self.train_mean_, axis=1)
        return boundary / (logits.shape[1] - 1) / distance

    def _row_width(self, test: Outputs) -> int:
        return 2 * test.num_features + 4 * test.num_classes


@register("neco")
class NECO(Detector):
    """NECO: ‖PCA_d(x)‖ / ‖x‖ for x the fit-standardised features; optionally times the max logit."""

    requires = Requirements.of(fit=("features",), score=("features",))
    shared_statistics = frozenset({"features"})
    # k: the principal components kept (dim_, chosen at fit when dim is a fraction of variance).
    state = {
        "mean_": Array("float64", ("D",)),
        "scale_": Array("float64", ("D",)),
        "components_": Array("float64", ("D", "k")),
        "dim_": Scalar(int, "k", "k"),
        "explained_variance_": Array("float64", ("D",)),
    }
    state_dims = {"k": "D"}
    paper = Paper(
        "Ben Ammar et al., NECO: NEural Collapse Based Out-of-distribution Detection",
        "ICLR 2024",
        "https://arxiv.org/abs/2310.06823",
        "dim=100: the reference code's --neco_dim default (an int is a number of components, a float in "
        "(0, 1) a fraction of explained variance, as in Müller & Hein's evaluation code with 0.9); "
        "use_maxlogit=False as the reference for ResNets (it multiplies by the max logit for ViT/Swin/DeiT)",
    )
    summary = Summary(
        "‖PCA_d(x)‖/‖x‖, x the fit-standardised z; optionally × max logit",
        defaults="dim: the reference's `--neco_dim` (a float in (0, 1): an explained-variance fraction); use_maxlogit: the reference's choice for ResNets, True for ViT/Swin/DeiT",
    )

    def __init__(self, dim: int | float = 100, use_maxlogit: bool = False) -> None:
        self.dim = dim
        self.use_maxlogit = use_maxlogit

    def _validate_params(self) -> None:
        if isinstance(self.dim, (bool, np.bool_)) or not isinstance(self.dim, (int, float, np.integer, np.floating)):
            raise DetectorError(
                f"neco: dim must be an int (components) or a float in (0, 1) (explained variance); got {self.dim!r}"
            )
        if isinstance(self.dim, (int, np.integer)) and self.dim < 1:
            raise DetectorError(f"neco: dim must be >= 1; got {self.dim}")
        if isinstance(self.dim, (float, np.floating)) and not 0 < self.dim < 1:
            raise DetectorError(f"neco: a float dim is a fraction of explained variance in (0, 1); got {self.dim}")
        if not isinstance(self.use_maxlogit, (bool, np.bool_)):
            raise DetectorError(f"neco: use_maxlogit must be True or False; got {self.use_maxlogit!r}")

    def size_problems(self, size: FitSize) -> list[str]:
        whole = isinstance(self.dim, (int, np.integer)) and not isinstance(self.dim, (bool, np.bool_))
        if not whole:
            return []
        if size.features is not None and self.dim > size.features:
            return [f"dim={self.dim} exceeds the feature dimension D={size.features}; use dim <= {size.features}"]
        if self.dim >= size.rows:
            # N centred rows span at most N - 1 directions; components past them are arbitrary null-space vectors.
            return [
                f"dim={self.dim} principal components need more fit rows than that, and the fit set has "
                f"{size.rows}; use dim < {size.rows}"
            ]
        return []

    def adapted_to(self, size: FitSize) -> dict[str, Any]:
        if not self.size_problems(size) or self._dim_is_fraction():
            return {}
        span = min(size.rows - 1, size.features or size.rows)
        return {"dim": max(1, span // 2)} if span >= 2 else {}

    def _dim_is_fraction(self) -> bool:
        """True when dim is a fraction of explained variance (float), not a number of components."""
        return isinstance(self.dim, (float, np.floating))

    def requirements(self) -> Requirements:
        if self.use_maxlogit:
            return Requirements.of(fit=("features",), score=("features", "logits"))
        return self.requires

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        stats = statistics_for(self, fit_set).get("features")
        self.mean_ = stats.mean
        covariance = stats.covariance()
        std = np.sqrt(np.maximum(np.diag(covariance), 0.0))
        # StandardScaler leaves constant features unscaled (scale 1) rather than dividing by zero.
        self.scale_ = np.where(std > 10 * np.finfo(np.float64).eps * np.maximum(np.abs(self.mean_), 1.0), std, 1.0)
        standardised = covariance / np.outer(self.scale_, self.scale_)
        values, vectors = symmetric_eigh(standardised)
        values = np.maximum(values, 0.0)
        if isinstance(self.dim, (float, np.floating)):
            explained = np.cumsum(values) / values.sum()
            self.dim_ = int(np.searchsorted(explained, self.dim) + 1)
        else:
            self.dim_ = int(self.dim)
        self.components_ = np.ascontiguousarray(vectors[:, : self.dim_])
        self.explained_variance_ = values

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        standardised = (np.asarray(chunk.features, dtype=np.float64) - self.mean_) / self.scale_
        projected = standardised @ self.components_
        score = np.linalg.norm(projected, axis=1) / np.linalg.norm(standardised, axis=1)
        if self.use_maxlogit:
            score = score * np.asarray(chunk.logits, dtype=np.float64).max(axis=1)
        return score
