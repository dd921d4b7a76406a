"""Streaming Gaussian statistics (class means, shared and total covariance) and Mahalanobis scoring by matmuls."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..util.chunking import iter_chunks
from ._blas import syrk_update
from .state import Array, Dims, Object, Optional, Scalar

# Unit roundoffs of float32 and float64 (round to nearest).
_U32 = 2.0**-24
_U64 = 2.0**-53
# Rows of a cache-sized float64 working block (centring, sums, normalising; one float64 rank-k product each),
# rows per float32 symmetric rank-k product (BLAS ssyrk), and rows of float32 products summed before they are
# added into the float64 Gram. The float32 rows are staged into products of GRAM_ROWS rows: each call reads and
# writes the whole D x D accumulator and wakes the BLAS's threads: on 2 busy cores, 512-row calls (D = 768) took
# 1.8x the time of the same rows in 2048-row ones (on one thread, the same time). GRAM_ROWS and GRAM_GROUP_ROWS set
# the float32 error bound below (gram_error_bound): each product in a group adds one rounding to the depth, so
# groups of 8 products (depth 2048 + 8) bound the error as tightly as groups of 2, and add the float32 buffer into
# the float64 total (a pass over D x D values) a quarter as often.
SYRK_ROWS = 512
GRAM_ROWS = 2048
GRAM_GROUP_ROWS = 16384
# Rows per tile of the float32 class search: the tile's (rows x C) float32 product stays in cache while it is
# reduced (4 MiB at C = 1000).
SEARCH_ROWS = 1024
# Rows per part of the per-class sums (a cache-sized float64 copy each).
_CLASS_SUM_ROWS = 512
# Up to this many rows in all, and while torch is not imported yet, class sums are numpy's (`add_rows_by_class`):
# 3 ms for 5,000 rows at D = 512 (np.add.at: 40 ms), where a first import of torch takes seconds.
NUMPY_CLASS_SUM_ROWS = 20_000
# Values (rows x D) per part of `add_rows_by_class`: its gathered copy of the part stays at most 32 MB.
_ORDERED_PART_VALUES = 1 << 22
# One step of `add_rows_by_class` (a numpy call, ~1 µs) costs about what np.add.at spends on this many values: with
# fewer values per step (a fit set of a few large classes at a small D), np.add.at is the faster of the two.
_STEP_VALUES = 128
SEARCH_TILE_BYTES = 16 * 2**20


def _gamma(n: int, unit: float) -> float:
    """Higham's γ_n = n·u / (1 − n·u): the relative error bound of n roundings."""
    return n * unit / (1.0 - n * unit)


def gram_error_bound(depth: int, groups: int) -> float:
    """β with |Ĝ_jl − G_jl| ≤ β·sqrt(G_jj·G_ll) for the Gram Ĝ that ScatterAccumulator builds (float32 products).

    G = Σ_i y_i y_iᵀ with y = x − shift. Derivation (Higham, Accuracy and Stability of Numerical Algorithms, §3.1):
    1. y is formed in float64 and rounded to float32: ŷ = y(1 + θ), |θ| ≤ ρ = (1 + u64)(1 + u32) − 1.
    2. Within a group, the float32 BLAS forms each product ŷ_j ŷ_l and sums them in float32; whatever its order
       and blocking, no term passes through more than `depth` roundings (rows of the largest rank-k product plus
       the number of products accumulated into the group's buffer), so the group's error is at most
       γ32_depth · Σ |ŷ_j||ŷ_l|.
    3. Groups are summed in float64: at most `groups` more roundings, γ64_groups relative.
    4. Σ |ŷ_j||ŷ_l| ≤ (1 + ρ)² Σ |y_j||y_l| ≤ (1 + ρ)² sqrt(G_jj G_ll) (Cauchy–Schwarz).
    Together: β = (1 + ρ)²(1 + γ32_depth)(1 + γ64_groups) − 1 ≈ γ32_depth + 2·u32 (1.2e-4 at the default depth 2056).
    The covariance Ĝ/N − d dᵀ (d the mean offset, exact in float64) inherits β·sqrt(G_jj G_ll)/N.
    """
    rho = (1.0 + _U64) * (1.0 + _U32) - 1.0
    return (1.0 + rho) ** 2 * (1.0 + _gamma(max(depth, 1), _U32)) * (1.0 + _gamma(max(groups, 1), _U64)) - 1.0


GRAM_DTYPES = ("float64", "float32")


def check_gram_dtype(gram_dtype: str) -> str:
    """`gram_dtype` if it names a Gram precision, else a DetectorError listing them."""
    if gram_dtype not in GRAM_DTYPES:
        raise DetectorError(f"gram_dtype must be one of {', '.join(GRAM_DTYPES)}; got {gram_dtype!r}")
    return gram_dtype


def add_rows_by_class(totals: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> None:
    """totals[labels[i]] += rows[i] for each row i in row order, in float64: np.add.at's sums bit for bit, vectorised."""
    for part in iter_chunks(labels.shape[0], max(1, _ORDERED_PART_VALUES // max(1, totals.shape[1]))):
        _add_part_by_class(totals, rows[part], labels[part])


def _add_part_by_class(totals: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> None:
    """add_rows_by_class for one part: every class's r-th row added at step r, the classes side by side."""
    # np.add.at adds value by value (40 ms for 5,000 rows at D = 512), and np.add.reduceat, like np.add.reduce along
    # a 1-D axis, sums pairwise: other bits. Step r adds, for every class with more than r rows, its r-th row to its
    # total: per class the same float64 additions in the same order as np.add.at, as one vectorised add per step.
    # Classes sorted by decreasing size make the classes of a step a prefix of them, and their rows one contiguous
    # slice of the gathered copy.
    if labels.shape[0] == 0:
        return
    counts = np.bincount(labels, minlength=totals.shape[0])
    by_size = np.argsort(-counts, kind="stable")[: np.count_nonzero(counts)]
    sizes = counts[by_size]
    if sizes[0] * _STEP_VALUES > labels.shape[0] * totals.shape[1]:  # few values per step: row by row is faster
        np.add.at(totals, labels, np.asarray(rows, dtype=np.float64))
        return
    place = np.empty(totals.shape[0], dtype=np.intp)
    place[by_size] = np.arange(by_size.shape[0])
    grouped = np.argsort(place[labels], kind="stable")  # rows by class, in row order within each class
    rank = np.arange(labels.shape[0]) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # position within its class
    by_step = grouped[np.argsort(rank, kind="stable")]  # step 0's rows, then step 1's, each in class order
    gathered = rows[by_step]  # as stored: the add below converts to float64 (exactly) as it goes
    # Classes with more than r rows: a non-increasing count per step r.
    active = sizes.shape[0] - np.searchsorted(sizes[::-1], np.arange(sizes[0]), side="right")
    work = totals[by_size]
    start = 0
    for step_classes in active.tolist():
        step = work[:step_classes]
        np.add(step, gathered[start : start + step_classes], out=step)
        start += step_classes
    totals[by_size] = work


def _mirror_upper(matrix: np.ndarray, block: int = 512) -> None:
    """Copy the upper triangle of a square matrix onto its lower triangle, in place, block by block."""
    for cols in iter_chunks(matrix.shape[0], block):
        diagonal = matrix[cols, cols]
        diagonal[...] = np.triu(diagonal) + np.triu(diagonal, 1).T
        matrix[cols.stop :, cols] = matrix[cols, cols.stop :].T


class ScatterAccumulator:
    """Sufficient statistics over row chunks: count, sum and Gram matrix about a shift, per-class sums.

    Sums are float64. The Gram matrix, the one O(N·D²) part, is built by symmetric rank-k products (BLAS syrk).
    With gram_dtype="float64" (the default) they accumulate in float64, one per cache-sized block of at most
    SYRK_ROWS rows. With "float32" they run at float32's speed (about twice float64's) on rows staged into products
    of at most GRAM_ROWS rows, accumulate in a float32 buffer for at most GRAM_GROUP_ROWS rows and are then added
    into float64; `gram_error_bound()` bounds the result. With with_sum=False (no Gram) it keeps the per-class sums
    and the count only.
    """

    def __init__(
        self,
        dim: int,
        *,
        shift: np.ndarray | None = None,
        by_class: bool = False,
        with_gram: bool = True,
        gram_dtype: str = "float64",
        with_sum: bool = True,
    ) -> None:
        check_gram_dtype(gram_dtype)
        if with_gram and not with_sum:
            raise DetectorError("a Gram matrix about the shift needs the sum of the rows: with_sum=False needs no Gram")
        self.dim = dim
        self.with_gram = with_gram
        self.with_sum = with_sum
        self.gram_dtype = gram_dtype
        # Accumulating (x - shift)(x - shift)^T instead of x x^T avoids the cancellation of E[xx^T] - mu mu^T when
        # the mean is large against the spread; by default the shift is the first chunk's mean.
        self.shift = None if shift is None else np.asarray(shift, dtype=np.float64)
        self.by_class = by_class
        self.count = 0
        self.sum = np.zeros(dim)
        self.class_counts = np.zeros(0, dtype=np.int64)
        # Per-class sums of the rows as added, and per class the rows added uncentred (their sums still hold the
        # shift): `class_sums` subtracts n·shift once, at the end, instead of per block.
        self._class_totals = np.zeros((0, dim))
        self._uncentred_counts = np.zeros(0, dtype=np.int64)
        # The Gram's upper triangle: float64 total (Fortran order, so dsyrk updates it in place) and, for float32,
        # the buffer of the current group.
        self._gram_upper = np.zeros((dim, dim) if with_gram else (0, 0), order="F")
        self._buffer: np.ndarray | None = None
        self._buffer_rows = self._buffer_calls = self._buffer_widest = 0
        # Float32 centred rows waiting for the next rank-k product, and how many it holds.
        self._stage: np.ndarray | None = None
        self._staged = 0
        self._gram: np.ndarray | None = None
        self.gram_depth = 0  # the largest number of float32 roundings on one term (see gram_error_bound)
        self.gram_groups = 0
        self._derived: dict[str, Any] = {}

    def update(self, block: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Add a block of rows (any float dtype) and their integer labels when accumulating per class."""
        if block.shape[0] == 0:
            return
        self._derived.clear()
        if self.by_class and labels is None:
            raise DetectorError("per-class statistics need labels")
        if not self.with_gram:
            # Sums alone need no shift and no float64 copy: numpy sums the raw rows into float64 directly.
            if self.shift is None:
                self.shift = np.zeros(self.dim)
            self.count += block.shape[0]
            if self.with_sum:  # a pass over the block (1 ms for 5,000 x 512 rows): skipped where only class sums serve
                self.sum += block.sum(axis=0, dtype=np.float64) - block.shape[0] * self.shift
            if self.by_class:
                self.update_classes(block, labels)
            return
        if self.float32_input(block):
            self._update_float32(block)
            if self.by_class:
                self.update_classes(block, labels)
            return
        labels = np.asarray(labels).ravel() if self.by_class else None
        for part in iter_chunks(block.shape[0], SYRK_ROWS):
            # A cache-sized float64 copy: centring, sums, class sums and the float32 rounding stay out of main
            # memory. The shared pass adds its parts the same way, so a fit shared or alone sums alike, bit for bit.
            self.update_owned(np.array(block[part], dtype=np.float64), None if labels is None else labels[part])

    def float32_input(self, block: np.ndarray) -> bool:
        """Whether `update` takes the float32 path for this block: a float32 Gram of float32 rows (no float64 copy)."""
        return self.with_gram and self.gram_dtype == "float32" and block.dtype == np.float32

    def _update_float32(self, block: np.ndarray) -> None:
        """Add float32 rows to a float32 Gram: centred in float32 about a float32 shift, summed in float64.

        With x and the shift s both float32, the float32 subtraction is correctly rounded, ŷ = (x − s)(1 + θ) with
        |θ| ≤ u32 ≤ ρ: step 1 of gram_error_bound holds as for float64 centring (float64 rows must be centred in
        float64 first: rounding x itself to float32 would err by u32·|x|, not u32·|x − s|).
        """
        if self.shift is None:
            self.shift = block.mean(axis=0, dtype=np.float64).astype(np.float32).astype(np.float64)
        shift32 = self.shift.astype(np.float32)  # exact: the shift is a float32 value
        self.count += block.shape[0]
        # Σ(x − s) = Σx − n·s in float64: an error of at most γ64(n)·Σ|x| (numpy sums pairwise: far less in
        # practice), against the float32 Gram's β ≥ 2·u32 relative on the same scale.
        self.sum += block.sum(axis=0, dtype=np.float64) - block.shape[0] * self.shift
        self._gram = None
        start = 0
        while start < block.shape[0]:
            # Centred straight into the staged rows of the next rank-k product: no other copy of the block.
            free = self._stage_rows(block.shape[0] - start)
            np.subtract(block[start : start + free.shape[0]], shift32, out=free)
            start += free.shape[0]
            self._staged += free.shape[0]

    def update_classes(self, block: np.ndarray, labels: np.ndarray) -> None:
        """Add per-class sums (about the shift) and counts of a block whose rows update() or update_owned() added."""
        if self.shift is None:
            raise DetectorError("class sums are kept about the shift: add the rows (update_owned) first")
        self._derived.clear()
        self._add_class_sums(block, np.asarray(labels), subtract_shift=True)

    def update_owned(self, values: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Add a float64 block of at most SYRK_ROWS rows that the accumulator may overwrite (centred in place).

        Per-class sums: pass `labels` here, or add them for a whole block of such parts with update_classes.
        """
        self._derived.clear()
        if self.shift is None:
            self.shift = values.mean(axis=0)
        values -= self.shift
        self.count += values.shape[0]
        self.sum += values.sum(axis=0)
        if labels is not None:
            if not self.by_class:
                raise DetectorError("labels given to an accumulator without per-class sums")
            self._add_class_sums(values, np.asarray(labels), subtract_shift=False)
        if not self.with_gram:
            return
        self._gram = None
        if self.gram_dtype == "float64":
            # G += values^T values on the upper triangle, the GIL released (the shared pass runs its accumulators in
            # threads).
            syrk_update(values, self._gram_upper)
            return
        start = 0
        while start < values.shape[0]:
            # Rounded to float32 as they are staged: the one float32 copy of the float64 centred rows.
            free = self._stage_rows(values.shape[0] - start)
            free[...] = values[start : start + free.shape[0]]
            start += free.shape[0]
            self._staged += free.shape[0]

    def _stage_rows(self, wanted: int) -> np.ndarray:
        """Free staged rows for up to `wanted` more rows (at least one), after a rank-k product if the stage is full."""
        if self._stage is None:
            self._stage = np.empty((GRAM_ROWS, self.dim), dtype=np.float32)
        if self._staged == self._stage.shape[0]:
            self._add_staged()
        return self._stage[self._staged : self._staged + min(wanted, self._stage.shape[0] - self._staged)]

    def _add_staged(self) -> None:
        """Add the staged rows' Gram (one rank-k product) and empty the stage."""
        count = self._staged
        if count == 0:
            return
        rows = self._stage[:count]
        self._staged = 0
        if self._buffer is None:
            self._buffer = np.zeros((self.dim, self.dim), dtype=np.float32, order="F")
        # The group's first product overwrites the buffer (beta = 0): no pass to zero it after each flush. Only the
        # upper triangle is written and read.
        beta = 1.0 if self._buffer_calls else 0.0
        syrk_update(rows, self._buffer, beta=beta)
        self._buffer_rows += count
        self._buffer_calls += 1
        self._buffer_widest = max(self._buffer_widest, count)
        if self._buffer_rows >= GRAM_GROUP_ROWS:
            self._flush_group()

    def _flush_group(self) -> None:
        if self._buffer is None or self._buffer_rows == 0:
            return
        self._gram_upper += self._buffer
        self.gram_depth = max(self.gram_depth, self._buffer_widest + self._buffer_calls)
        self.gram_groups += 1
        self._buffer_rows = self._buffer_calls = self._buffer_widest = 0

    def _flush(self) -> None:
        """Add every staged row and the current float32 group into the float64 Gram."""
        self._add_staged()
        self._flush_group()

    @property
    def gram(self) -> np.ndarray:
        """Σ (x − shift)(x − shift)ᵀ over all rows (float64, symmetric)."""
        if self._gram is None:
            self._flush()
            # The float32 group buffer (D² / 2 values) and the stage are not needed until the next update.
            self._buffer = self._stage = None
            # Mirrored in place (syrk leaves the lower triangle stale; the next update refreshes only the upper):
            # no D x D temporaries, which at D = 4096 are 134 MB each.
            _mirror_upper(self._gram_upper)
            self._gram = self._gram_upper
        return self._gram

    def gram_error_bound(self) -> float:
        """β with |gram_jl − exact_jl| ≤ β·sqrt(gram_jj·gram_ll) for a float32 Gram (see the module function)."""
        if self.gram_dtype != "float32":
            raise DetectorError("gram_error_bound describes the float32 Gram; this accumulator works in float64")
        self._flush()
        return gram_error_bound(self.gram_depth, self.gram_groups)

    def _add_class_sums(self, rows: np.ndarray, labels: np.ndarray, subtract_shift: bool) -> None:
        labels = labels.ravel()
        if labels.min() < 0:
            raise DetectorError(f"labels must be non-negative class indices; found {int(labels.min())}")
        num_classes = max(int(labels.max()) + 1, self.class_counts.shape[0])
        if num_classes > self.class_counts.shape[0]:
            grown = num_classes - self.class_counts.shape[0]
            self.class_counts = np.concatenate([self.class_counts, np.zeros(grown, dtype=np.int64)])
            self._uncentred_counts = np.concatenate([self._uncentred_counts, np.zeros(grown, dtype=np.int64)])
            self._class_totals = np.concatenate([self._class_totals, np.zeros((grown, self.dim))])
        counts = np.bincount(labels, minlength=num_classes)
        # Each row is added into its class's float64 total, in row order (the sums np.add.at would give, bit for bit),
        # by torch's index_put_ with accumulate=True, part by cache-sized part (one float64 copy each). On one core
        # at D = 768 that took 0.15 s per 200,000 rows, against 0.35-0.45 s for a sparse one-hot product (which
        # writes a fresh classes x D block per call and adds it into the totals again) and 1.6 s for np.add.at
        # (sort + reduceat, 1.7 s, sums pairwise: other bits). Accumulating index_put_ runs on the calling thread;
        # index_add_, as fast, wakes torch's thread pool, whose spinning threads then doubled the time of the BLAS's
        # Gram products between.
        if int(self.class_counts.sum()) + rows.shape[0] <= NUMPY_CLASS_SUM_ROWS and "torch" not in sys.modules:
            # A fit set of a few thousand rows: numpy's ordered adds (the same sums, bit for bit) cost less than
            # importing torch (seconds); once torch is imported its index_put_ is a little faster (2.2 ms against
            # 2.8 ms for 5,000 rows at D = 512). The rows beyond NUMPY_CLASS_SUM_ROWS of a larger one go through torch.
            add_rows_by_class(self._class_totals, rows, labels)
            self.class_counts += counts
            if subtract_shift:
                self._uncentred_counts += counts
            return
        import torch  # imported on use: `oodbench --help` does not load torch

        totals = torch.from_numpy(self._class_totals)
        index = torch.from_numpy(np.array(labels, dtype=np.int64))  # a copy: torch wants writable arrays
        reuse = rows.dtype == np.float64 and rows.flags.c_contiguous and rows.flags.writeable
        buffer = None if reuse else np.empty((min(rows.shape[0], _CLASS_SUM_ROWS), self.dim))
        for part in iter_chunks(rows.shape[0], _CLASS_SUM_ROWS):
            if reuse:
                values = rows[part]
            else:
                values = buffer[: part.stop - part.start]
                values[...] = rows[part]
            totals.index_put_((index[part],), torch.from_numpy(values), accumulate=True)
        self.class_counts += counts
        if subtract_shift:
            self._uncentred_counts += counts

    @property
    def class_sums(self) -> np.ndarray:
        """Per-class sums of (x − shift), shape (classes, D) (computed once per state of the accumulator)."""

        def compute() -> np.ndarray:
            if not self._uncentred_counts.any():
                return self._class_totals
            # Σ(x − shift) = Σx − n·shift, per class.
            return self._class_totals - self._uncentred_counts[:, None] * self.shift

        return self.derived("class_sums", compute)

    # ----------------------------------------------------------------- results
    @property
    def mean(self) -> np.ndarray:
        """Mean of all rows."""
        if not self.with_sum:
            raise DetectorError("this accumulator keeps per-class sums only (with_sum=False): it has no mean")
        return self.shift + self.sum / self.count

    def second_moment(self) -> np.ndarray:
        """E[(x - shift)(x - shift)^T]: the covariance about the shift (divide by N)."""
        return self.gram / self.count

    def covariance(self) -> np.ndarray:
        """Covariance of all rows about their mean (divide by N)."""
        centred_mean = self.sum / self.count
        return self.gram / self.count - np.outer(centred_mean, centred_mean)

    def moment_error_bound(self, moment: np.ndarray, gram_dtype: str | None = None) -> float:
        """A bound on the spectral norm of `moment`'s rounding error (moment = moment_about(p)) for a Gram built in
        `gram_dtype` (default: this accumulator's): an eigenvalue below it cannot be told from zero."""
        # Weyl: each eigenvalue moves by at most ‖E‖₂ ≤ ‖E‖_F. The Gram's entries err by at most β·sqrt(G_jj G_ll)
        # (gram_error_bound for float32 products; γ_N for float64 sums of N terms), so ‖E_G‖_F ≤ β·tr(G). The sum
        # S, the outer products and the division add float64 roundings of terms bounded by tr(G)/N + tr(moment)
        # (|shift − p|² is at most twice that), covered by 4·γ_(N+8).
        self._flush()
        float32 = (gram_dtype or self.gram_dtype) == "float32"
        beta = gram_error_bound(self.gram_depth, self.gram_groups) if float32 else 0.0
        beta += 4.0 * _gamma(self.count + 8, _U64)
        return beta * (float(np.trace(self.gram)) / self.count + float(np.trace(moment)))

    def moment_about(self, point: np.ndarray) -> np.ndarray:
        """E[(x − point)(x − point)ᵀ] (divide by N), from the Gram about the shift without a second pass."""
        # Σ(x − p)(x − p)ᵀ = G + S dᵀ + d Sᵀ + N d dᵀ with d = shift − p and S = Σ(x − shift): sums of terms, no
        # cancellation of large numbers when the shift sits inside the data.
        offset = self.shift - np.asarray(point, dtype=np.float64)
        cross = np.outer(self.sum, offset)
        return (self.gram + cross + cross.T) / self.count + np.outer(offset, offset)

    @property
    def present_classes(self) -> np.ndarray:
        """Class indices with at least one row."""
        return np.flatnonzero(self.class_counts > 0)

    def class_means(self) -> np.ndarray:
        """Means of the present classes, shape (len(present_classes), D)."""
        present = self.present_classes
        return self.shift + self.class_sums[present] / self.class_counts[present, None]

    def within_class_covariance(self) -> np.ndarray:
        """Shared covariance: the rows' scatter about their own class mean, divided by N (computed once)."""

        def compute() -> np.ndarray:
            present = self.present_classes
            sums = self.class_sums[present]
            between = (sums / self.class_counts[present, None]).T @ sums  # sum_c n_c m_c m_c^T, m_c = sums_c / n_c
            return (self.gram - between) / self.count

        return self.derived("within_class_covariance", compute)

    def within_class_whitener(self) -> np.ndarray:
        """pinv_sqrt of the within-class covariance, computed once (maha and rmaha share it: one D x D eigh)."""
        return self.derived("within_class_whitener", lambda: pinv_sqrt(self.within_class_covariance()))

    def within_class_triangular_whitener(self) -> np.ndarray | None:
        """triangular_whitener of the within-class covariance (None when singular), computed once."""
        return self.derived(
            "within_class_triangular_whitener", lambda: triangular_whitener(self.within_class_covariance())
        )

    def derived(self, key: str, compute: Callable[[], Any]) -> Any:
        """A quantity derived from the final statistics, computed on first request and kept (do not modify it)."""
        if key not in self._derived:
            self._flush()
            self._derived[key] = compute()
        return self._derived[key]


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
        raise DetectorError(
            "the covariance matrix is zero: no fit row differs from its mean (the rows are identical, "
            "or every class holds a single row)"
        )
    return vectors[:, keep] / np.sqrt(values[keep])


def triangular_whitener(covariance: np.ndarray) -> np.ndarray | None:
    """Upper-triangular U with U Uᵀ = covariance⁻¹, or None when pinv_sqrt would drop a direction (or Cholesky fails).

    With Σ = R Rᵀ (Cholesky, R lower), U = R⁻ᵀ: ‖(x − c) U‖² = (x − c)ᵀ Σ⁻¹ (x − c). Where pinv_sqrt keeps every
    eigenvalue its pseudo-inverse is the inverse, so both whiteners give the same distances; the triangular one
    costs half the multiplications per scored row (whiten_triangular, one BLAS trmm).
    """
    dim = covariance.shape[0]
    symmetric = (covariance + covariance.T) / 2.0
    spectrum = np.linalg.eigvalsh(symmetric)
    if not (spectrum > dim * np.finfo(np.float64).eps * max(spectrum[-1], 0.0)).all():
        return None
    try:
        lower = np.linalg.cholesky(symmetric)
    except np.linalg.LinAlgError:
        return None
    import scipy.linalg.lapack  # imported on use: `oodbench --help` does not load scipy

    inverse, info = scipy.linalg.lapack.dtrtri(lower, lower=1)
    if info != 0:
        return None
    # Fortran order, the form BLAS trmm takes (whiten_triangular): the scoring Gaussians keep this very array, so
    # at D = 4096 no second 134 MB copy of it stays beside the accumulator's.
    return np.asfortranarray(np.triu(inverse.T))


def whiten_triangular(centred: np.ndarray, upper: np.ndarray, overwrite: bool = False) -> np.ndarray:
    """centred @ upper for an upper-triangular `upper`: one BLAS trmm (D²/2 multiply-adds a row, the zero half of
    `upper` skipped), in place on `centred` when `overwrite` and it is a C-contiguous float64 array."""
    import scipy.linalg.blas  # imported on use: `oodbench --help` does not load scipy

    rows = np.asarray(centred, dtype=np.float64)
    if not (overwrite and rows.flags.c_contiguous and rows.flags.writeable):
        rows = np.array(rows, dtype=np.float64, order="C")
    if rows.shape[0] == 0:
        return rows
    # rows.T is Fortran-contiguous: trmm computes (rows · U)ᵀ = Uᵀ · rowsᵀ on it in place. A C-ordered U (a loaded
    # detector's) is handed over as its transpose, a Fortran-ordered lower triangle: no copy either way.
    if upper.flags.f_contiguous:
        product = scipy.linalg.blas.dtrmm(1.0, upper, rows.T, side=0, lower=0, trans_a=1, overwrite_b=1)
    else:
        product = scipy.linalg.blas.dtrmm(1.0, upper.T, rows.T, side=0, lower=1, trans_a=0, overwrite_b=1)
    return product.T


def blas_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b for C-contiguous 2-D float32 or float64 arrays by scipy's BLAS (into `out`, C-contiguous, if given).

    The scoring path's triangular products need scipy's BLAS (trmm), and numpy's matmul runs on another copy of
    OpenBLAS: alternating the two, each one's idle threads spin while the other's work, which on 2 cores made
    scoring 1.5x slower. Every product of the scoring path goes through here, so it stays on one thread pool.
    """
    import scipy.linalg.blas  # imported on use: `oodbench --help` does not load scipy

    gemm = scipy.linalg.blas.sgemm if a.dtype == np.float32 else scipy.linalg.blas.dgemm
    a = np.ascontiguousarray(a)
    # (a b)ᵀ = bᵀ aᵀ: the transpose of a C-contiguous array is the Fortran-contiguous operand BLAS takes; a
    # transposed view (Fortran-contiguous b) goes as it is, with BLAS transposing it.
    if b.flags.f_contiguous and not b.flags.c_contiguous:
        first, transpose = b, 1
    else:
        first, transpose = np.ascontiguousarray(b).T, 0
    if out is None:
        return gemm(1.0, first, a.T, trans_a=transpose).T
    return gemm(1.0, first, a.T, beta=0.0, c=out.T, overwrite_c=1, trans_a=transpose).T


class ClassGaussians:
    """Class means and a shared precision, held whitened, for squared Mahalanobis distances by matmuls.

    The class search returns the float64 answer of the all-float64 computation (same values to float64 rounding,
    hence the same order of rows) at close to float32 speed for the (rows x classes) product: it runs in float32,
    with a proven bound on its error, and only the classes that the bound cannot rule out are evaluated in float64
    (`float64_search = True` evaluates all of them, the reference). The derivation is in `_search_error_scale`.

    With a `background` covariance (relative Mahalanobis), when neither pseudo-inverse drops a direction the
    whitener is rotated so that the background's precision is diagonal in the same coordinates: one whitening
    product serves both distances.
    """

    def __init__(
        self,
        means: np.ndarray,
        covariance: np.ndarray,
        centre: np.ndarray,
        background: np.ndarray | None = None,
        whitener: np.ndarray | None = None,
        triangular: np.ndarray | None = None,
    ) -> None:
        self.centre = centre
        self.float64_search = False
        # An upper-triangular whitener (triangular_whitener) whenever the covariance is invertible: without a
        # background it halves the multiplications per row; with one it is a cheaper start for the joint basis
        # than an eigendecomposition. `whitener` (pinv_sqrt) or `triangular` are given when already computed.
        if whitener is None and triangular is None:
            triangular = triangular_whitener(covariance)
        if triangular is not None:
            whitener = triangular
        elif whitener is None:
            whitener = pinv_sqrt(covariance)  # (D, r)
        self.triangular = background is None and triangular is not None
        # The background distance, either Σ_j y_j² w_j in the whitened coordinates or its own Gaussian.
        self.background_weights: np.ndarray | None = None
        self.background: Gaussian | None = None
        if background is not None:
            joint = _joint_basis(whitener, background)
            if joint is None:
                self.background = Gaussian(centre, background)
            else:
                whitener, self.background_weights = joint
        # A triangular whitener is kept as given (triangular_whitener builds it in the Fortran order trmm takes;
        # whiten_triangular takes a C-ordered one as its transpose): a copy here would double its D x D memory.
        self.whitener = whitener
        # Whitened, centred class means: M = (mu_c - centre) A; distances follow ||y||^2 - 2 y.M_c + ||M_c||^2.
        self.means = (means - centre) @ self.whitener  # (C, r)
        self.means_sq = np.einsum("cr,cr->c", self.means, self.means)
        rank = self.means.shape[1]
        # The float32 search operand [−2 Mᵀ; ‖M‖²] (r + 1, C): [y, 1] times it gives ‖M_c‖² − 2 y·M_c in one GEMM.
        self.search_ = np.empty((rank + 1, self.means.shape[0]), dtype=np.float32)
        self.search_[:rank] = -2.0 * self.means.T
        self.search_[rank] = self.means_sq
        self.radius_ = float(np.sqrt(self.means_sq.max()))
        self.error_scale_ = _search_error_scale(rank)

    @property
    def search_rows(self) -> int:
        """Rows per tile of the class search: SEARCH_ROWS, fewer when C is so large that the tile's float32
        product and its operand would pass SEARCH_TILE_BYTES."""
        per_row = 4 * (self.search_.shape[0] + self.search_.shape[1])
        return max(1, min(SEARCH_ROWS, SEARCH_TILE_BYTES // per_row))

    def centre_rows(self, block: np.ndarray) -> np.ndarray:
        """z − centre as a new float64 array, converted and centred in one pass (pass it on with centred=True)."""
        return np.subtract(block, self.centre, dtype=np.float64)

    def whiten(self, block: np.ndarray, overwrite: bool = False, centred: bool = False) -> np.ndarray:
        """Centred and whitened rows y = (z - centre) A (`overwrite`: centre the float64 `block` in place;
        `centred`: `block` already is z − centre)."""
        owned = overwrite
        if not centred:
            if overwrite:
                block -= self.centre
            else:
                block = block - self.centre  # a new array: ours to overwrite
                owned = True
        if self.triangular:
            return whiten_triangular(block, self.whitener, overwrite=owned)
        return blas_matmul(block, self.whitener)

    def min_sq_distance(self, block: np.ndarray, overwrite: bool = False, centred: bool = False) -> np.ndarray:
        """min_c (z - mu_c)^T P (z - mu_c) for every row."""
        return self._min_sq(self.whiten(block, overwrite, centred))

    def relative_sq_distance(self, block: np.ndarray, overwrite: bool = False, centred: bool = False) -> np.ndarray:
        """min_c (z - mu_c)^T P (z - mu_c) − (z − centre)^T P_0 (z − centre), P_0 the background's precision."""
        if self.background_weights is None:
            # The background Gaussian's mean is the centre; before `block` may be overwritten.
            background = self.background.sq_distance(block + self.centre if centred else block)
            return self._min_sq(self.whiten(block, overwrite, centred)) - background
        whitened = self.whiten(block, overwrite, centred)
        background = np.einsum("nr,nr,r->n", whitened, whitened, self.background_weights)
        return self._min_sq(whitened) - background

    def _min_sq(self, whitened: np.ndarray) -> np.ndarray:
        norms_sq = np.einsum("nr,nr->n", whitened, whitened)
        if self.float64_search:
            cross = blas_matmul(whitened, self.means.T)  # (n, C): the one large product
            cross *= -2.0  # in place: ||M_c||^2 - 2 y.M_c without further (n, C) temporaries
            cross += self.means_sq
            return norms_sq + cross.min(axis=1)
        nearest = np.empty(whitened.shape[0])
        tile_rows = min(self.search_rows, whitened.shape[0])
        lifted = np.empty((tile_rows, whitened.shape[1] + 1), dtype=np.float32)
        lifted[:, -1] = 1.0
        # One (rows x C) product buffer for every tile: a fresh one per tile costs page faults.
        products = np.empty((tile_rows, self.search_.shape[1]), dtype=np.float32)
        for tile in iter_chunks(whitened.shape[0], tile_rows):
            # A tile's (rows x C) product stays in cache for the reductions that follow it.
            rows = tile.stop - tile.start
            nearest[tile] = self._search(whitened[tile], norms_sq[tile], lifted[:rows], products[:rows])
        return norms_sq + nearest

    def _search(
        self, whitened: np.ndarray, norms_sq: np.ndarray, lifted: np.ndarray, products: np.ndarray
    ) -> np.ndarray:
        """min_c ‖M_c‖² − 2 y·M_c in float64 for a tile of rows: a float32 search, float64 values."""
        rows = whitened.shape[0]
        index = np.arange(rows)
        lifted[:, :-1] = whitened
        approx = blas_matmul(lifted, self.search_, out=products)  # (n, C) float32: ĝ_c ≈ ‖M_c‖² − 2 y·M_c
        best = approx.argmin(axis=1)
        lowest = approx[index, best].astype(np.float64)
        # |ĝ_c − g_c| ≤ e for every class, so the float64 minimiser lies within 2e of the float32 minimum.
        slack = self.error_scale_ * self.radius_ * (2.0 * np.sqrt(norms_sq) + self.radius_)
        threshold = lowest + 2.0 * slack
        # Rounded up to float32 so the comparison runs in float32 and the candidate set only grows.
        threshold32 = np.nextafter(threshold.astype(np.float32), np.float32(np.inf))
        exact = self.means_sq[best] - 2.0 * np.einsum("nr,nr->n", whitened, self.means[best])
        # Another class is a candidate iff the smallest of the others is within the threshold: one more min over
        # the tile, rather than a (rows x C) mask and its count.
        approx[index, best] = np.inf
        unresolved = np.flatnonzero((approx.min(axis=1) <= threshold32) | ~np.isfinite(threshold))
        if unresolved.size:
            # Near ties (and rows beyond float32's range): every class the bound cannot exclude, in float64.
            mask = approx[unresolved] <= threshold32[unresolved, None]
            mask[np.arange(unresolved.size), best[unresolved]] = True
            mask[~np.isfinite(threshold[unresolved])] = True
            row, cls = np.nonzero(mask)
            values = self.means_sq[cls] - 2.0 * np.einsum("kr,kr->k", whitened[unresolved[row]], self.means[cls])
            starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
            exact[unresolved] = np.minimum.reduceat(values, starts)
        return exact


def _joint_basis(whitener: np.ndarray, background: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(B, w) with B Bᵀ = P and B diag(w) Bᵀ = P_0 = background⁻¹, or None when a pseudo-inverse drops a direction.

    A = whitener (A Aᵀ = P, square and invertible when nothing is dropped). T = Aᵀ Σ_0 A = U Λ Uᵀ; B = A U gives
    B Bᵀ = A Aᵀ = P and Bᵀ Σ_0 B = Λ, so Σ_0⁻¹ = B Λ⁻¹ Bᵀ: with y = x B, xᵀ P x = ‖y‖², xᵀ P_0 x = Σ_j y_j² / λ_j.
    """
    dim = background.shape[0]
    if whitener.shape[1] != dim:
        return None
    spectrum = np.linalg.eigvalsh((background + background.T) / 2.0)
    # pinv_sqrt's cut-off: when it would drop a direction of the background, P_0 is a pseudo-inverse; keep it apart.
    if not (spectrum > dim * np.finfo(np.float64).eps * max(spectrum[-1], 0.0)).all():
        return None
    values, rotation = symmetric_eigh(whitener.T @ background @ whitener)
    if not (values > 0).all():
        return None
    return whitener @ rotation, 1.0 / values


def _search_error_scale(rank: int) -> float:
    """κ with |ĝ_c − g_c| ≤ κ·R·(2‖y‖ + R) for the float32 class search of ClassGaussians (R = max_c ‖M_c‖).

    g_c = ‖M_c‖² − 2 y·M_c = Σ_k y_k·(−2 M_ck) + ‖M_c‖²: a dot product of r + 1 terms of [y, 1] and [−2M_c, ‖M_c‖²].
    The float32 search rounds its inputs (y, M and ‖M‖² are float64): ŷ = y(1 + θ), −2M̂ = −2M(1 + θ')
    (scaling by 2 is exact), ŝ = ‖M_c‖²(1 + θ''), each |θ| ≤ u = 2⁻²⁴. Exact arithmetic on the rounded inputs
    then misses g_c by at most (2u + u²)·2Σ|y_k||M_ck| + u‖M_c‖². The float32 GEMM sums r + 1 rounded products
    in some order: at most γ_{r+1}·(Σ|ŷ_k||2M̂_ck| + ŝ) ≤ γ_{r+1}(1 + u)²·(2Σ|y_k||M_ck| + ‖M_c‖²) more
    (Higham §3.1). With Σ|y_k||M_ck| ≤ ‖y‖‖M_c‖ (Cauchy–Schwarz) and ‖M_c‖ ≤ R, the sum is at most
    κ·(2‖y‖R + R²) with κ = γ_{r+1}(1 + u)² + 2u + u². The float64 quantities (y, ‖y‖, R, the threshold) carry
    relative errors near 1e-16, against κ ≥ 1.2e-7; a factor 1 + 2⁻²⁰ covers them.
    """
    gamma = _gamma(rank + 1, _U32)
    return (gamma * (1.0 + _U32) ** 2 + 2.0 * _U32 + _U32**2) * (1.0 + 2.0**-20)


class Gaussian:
    """One Gaussian (mean, precision) held whitened: squared Mahalanobis distance of rows."""

    def __init__(self, mean: np.ndarray, covariance: np.ndarray) -> None:
        self.mean = mean
        self.whitener = pinv_sqrt(covariance)

    def sq_distance(self, block: np.ndarray) -> np.ndarray:
        """(z - mu)^T P (z - mu) for every row."""
        whitened = (block - self.mean) @ self.whitener
        return np.einsum("nr,nr->n", whitened, whitened)


def class_gaussians_state(dim: int | str = "D", rank: str = "r", background_rank: str = "s") -> Object:
    """The declared state of ClassGaussians over `dim` features: K classes, whiteners of rank `rank` (class) and
    `background_rank` (background); a detector with several (one per layer) names each its own dimensions."""

    def check(gaussians: ClassGaussians, dims: Dims) -> None:
        # Relations between the attributes that their shapes alone do not state.
        width, whitened = dims.value(dim, "whitener"), gaussians.whitener.shape[1]
        if whitened > width:
            raise DetectorError(f"a whitener of {width} features has rank at most {width}, not {whitened}")
        if gaussians.triangular and (whitened != width or gaussians.background_weights is not None):
            raise DetectorError(f"a triangular whitener must be square ({width} x {width}), without a background")
        if gaussians.background_weights is not None and gaussians.background is not None:
            raise DetectorError("the background is either weights in the whitened coordinates or its own Gaussian")
        if gaussians.error_scale_ != _search_error_scale(whitened):
            raise DetectorError(f"error_scale_ {gaussians.error_scale_!r} is not the bound for rank {whitened}")

    return Object(
        ClassGaussians,
        {
            "whitener": Array("float64", (dim, rank)),
            "centre": Array("float64", (dim,)),
            "float64_search": Scalar(bool),
            "triangular": Scalar(bool),
            "background_weights": Optional(Array("float64", (rank,))),
            "background": Optional(
                Object(
                    Gaussian, {"mean": Array("float64", (dim,)), "whitener": Array("float64", (dim, background_rank))}
                )
            ),
            "means": Array("float64", ("K", rank)),
            "means_sq": Array("float64", ("K",)),
            "search_": Array("float32", (f"{rank}+1", "K")),
            "radius_": Scalar(float, 0.0),
            "error_scale_": Scalar(float, 0.0),
        },
        check=check,
    )


# The fitted state of ClassGaussians over the D features (K classes, r = the whitener's rank, s = the background's).
CLASS_GAUSSIANS_STATE = class_gaussians_state()
