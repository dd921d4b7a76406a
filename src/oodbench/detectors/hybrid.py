"""Detectors combining a feature-space term with the logits' energy: ViM and NNGuide."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import energy, l2_normalize
from ..core.outputs import Head, Outputs
from ._gaussian import symmetric_eigh
from ._streaming import fit_chunks, gather_rows, sample_rows
from .base import Detector, Paper, Requirements, Summary, _FitInfo
from .feature import FLAT_BLOCK_ROWS, flat_search, unit_float32
from .fitsize import FitSize
from .registry import register
from .shared import FitStatistics, statistics_for
from .state import Array, FlatIndex, Scalar, Spec


def vim_default_dim(num_features: int) -> int:
    """The ViM paper's principal dimension by feature size: 1000 for D >= 2048, 512 for D >= 768, else D/2."""
    if num_features >= 2048:
        return 1000
    if num_features >= 768:
        return 512
    return num_features // 2


def _min_norm_solution(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """pinv(matrix) @ rhs (numpy's default cut-off, max(M, N)·eps) by a rank-revealing QR: twice an SVD's speed."""
    import scipy.linalg  # imported on use: `oodbench --help` does not load scipy

    cutoff = max(matrix.shape) * np.finfo(np.float64).eps
    return scipy.linalg.lstsq(matrix, rhs, cond=cutoff, lapack_driver="gelsy")[0]


class _ResidualSpace(Detector):
    """Shared by ViM and Residual: the fit set's principal subspace about the head's origin u = −pinv(W) b."""

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim

    def _validate_params(self) -> None:
        if self.dim is not None:
            self._check_int(dim=self.dim)

    def _principal_dim(self, num_features: int) -> int:
        """dim, or the paper's rule for D features, checked to lie in [1, D)."""
        dim = vim_default_dim(num_features) if self.dim is None else int(self.dim)
        if not 1 <= dim < num_features:
            raise DetectorError(f"{self.name}: dim={dim} must lie in [1, D) for D={num_features} features")
        return dim

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """The dim_ principal directions kept and the D − dim_ residual ones, for this D."""
        dim = self._principal_dim(fit.num_features)
        return {
            "dim_": Scalar(int, dim, dim),
            "origin_": Array("float64", ("D",)),
            "residual_basis_": Array("float64", ("D", fit.num_features - dim)),
        }

    def _fit_residual_space(
        self, fit_set: Outputs, head: Head
    ) -> tuple[FitStatistics, np.ndarray, np.ndarray, np.ndarray]:
        """Set dim_, origin_ and residual_basis_; return the fit statistics, the moment about the origin and its
        eigenvalues and eigenvectors (largest first)."""
        self.dim_ = self._principal_dim(fit_set.num_features)
        weight = np.asarray(head.weight, dtype=np.float64)
        self.origin_ = -_min_norm_solution(weight, np.asarray(head.bias, dtype=np.float64))
        stats = statistics_for(self, fit_set)
        # (1/N) sum (z - u)(z - u)^T from the Gram about the accumulator's shift (no second pass, no cancellation).
        features = stats.get("features")
        moment = features.moment_about(self.origin_)
        values, vectors = symmetric_eigh(moment)
        self.residual_basis_ = np.ascontiguousarray(vectors[:, self.dim_ :])  # the D − dim least-variance directions
        return stats, moment, values, vectors


@register("vim")
class ViM(_ResidualSpace):
    """ViM: energy(f) − α‖residual of (z − u) off the fit set's principal subspace‖, u = −pinv(W) b."""

    requires = Requirements.of(fit=("features", "logits"), score=("features", "logits"), head=True)
    shared_statistics = frozenset({"features", "max_logit_sum"})
    paper = Paper(
        "Wang, Li, Feng & Zhang, ViM: Out-Of-Distribution with Virtual-logit Matching",
        "CVPR 2022",
        "https://arxiv.org/abs/2203.10807",
        "dim=None picks the paper's rule (D >= 2048: 1000, D >= 768: 512, else D/2); covariance of z − u about "
        "u (divide by N, as EmpiricalCovariance(assume_centered=True)); alpha = mean max-logit / mean "
        "residual norm over the fit set",
    )
    summary = Summary(
        "energy(f) − α‖(z−u) off the principal subspace‖, u = −pinv(W)b",
        defaults="None: by D as the paper, 1000 (D ≥ 2048), 512 (D ≥ 768), D/2",
        also_in="pytorch-ood, OpenOOD",
    )

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """The residual space's state for this D, and alpha."""
        return {**super().state_spec(fit), "alpha_": Scalar(float)}

    def size_problems(self, size: FitSize) -> list[str]:
        if size.features is None:
            return []
        dim = vim_default_dim(size.features) if self.dim is None else int(self.dim)
        shown = f"dim={dim}" if self.dim is not None else f"dim={dim} (the default for D={size.features})"
        if not 1 <= dim < size.features:
            return [f"{shown} must lie in [1, D) for D={size.features} features"]
        if dim >= size.rows:
            # The fit rows span at most `rows` directions, all inside a principal subspace that wide: their residual
            # is rounding noise and alpha (mean max-logit / mean residual) meaningless.
            return [
                f"{shown} needs more fit rows than principal directions, and the fit set has {size.rows}; use dim < {size.rows}"
            ]
        return []

    def adapted_to(self, size: FitSize) -> dict[str, Any]:
        if size.features is None or not self.size_problems(size):
            return {}
        dim = max(1, min(size.rows, size.features) // 2)  # the paper's D/2 rule, on the smaller of N and D
        return {"dim": dim} if dim < size.features and dim < size.rows else {}

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        num_features = fit_set.num_features
        stats, moment, values, vectors = self._fit_residual_space(fit_set, head)
        max_logit_sum = stats.get("max_logit_sum")
        residual_sum = squared_sum = 0.0
        # alpha is a ratio of means, so its residual norms need no float64 answers; they need the basis, hence this
        # second pass. Of the two ways to get them, take the cheaper: the D − dim residual directions in float32
        # (relative error ~1e-6), or ‖x‖² − ‖x V_dim‖² with the dim principal directions, in float64 (half float32's
        # speed; the subtraction loses digits only for residuals below ~1e-6 of ‖x‖) or, when the fit statistics
        # run in float32 (gram_dtype="float32", the fast-fit mode), in float32 (residuals below ~1e-3 of ‖x‖ lose
        # digits then).
        principal = 2 * self.dim_ < num_features - self.dim_
        if principal:
            dtype = np.float32 if stats.gram_dtype == "float32" else np.float64
            basis = np.ascontiguousarray(vectors[:, : self.dim_], dtype=dtype)
        else:
            basis = self.residual_basis_.astype(np.float32)
        origin = self.origin_.astype(basis.dtype)
        buffer = None
        for rows in fit_chunks(len(fit_set), 2 * num_features, "vim: alpha"):
            features = np.asarray(fit_set.features[rows])
            if buffer is None or buffer.shape[0] < features.shape[0]:
                buffer = np.empty(features.shape, dtype=basis.dtype)  # reused: fresh blocks cost page faults
            block = np.subtract(features, origin, out=buffer[: features.shape[0]], dtype=basis.dtype)
            projected = block @ basis
            if principal:
                # Squared norms in the basis's precision. In float32 the product x·V already errs by up to γ_D·‖x‖
                # (D float32 roundings), so float32 sums of squares (error ≤ γ_D·‖x‖²) keep the residual's error of
                # the same order, and save numpy's float64 copies of both operands.
                squared = np.einsum("nd,nd->n", block, block).astype(np.float64) - np.einsum(
                    "nk,nk->n", projected, projected
                ).astype(np.float64)
                squared = np.maximum(squared, 0.0)
            else:
                squared = np.einsum("nk,nk->n", projected, projected).astype(np.float64)
            squared_sum += float(squared.sum())
            residual_sum += float(np.sqrt(squared).sum())
        self._check_residual(squared_sum / len(fit_set), stats, moment, values, basis.dtype)
        self.alpha_ = (max_logit_sum / len(fit_set)) / (residual_sum / len(fit_set))

    def _check_residual(
        self, mean_squared: float, stats: FitStatistics, moment: np.ndarray, values: np.ndarray, dtype: np.dtype
    ) -> None:
        """Refuse a fit set whose residual off the principal subspace is within rounding of zero (alpha undefined)."""
        noise = stats.get("features").moment_error_bound(moment, "float64")
        total = float(np.trace(moment))  # the mean squared norm of z − u
        depth, kept = moment.shape[0], moment.shape[0] - self.dim_
        unit = float(np.finfo(dtype).eps) / 2.0
        gamma = depth * unit / (1.0 - depth * unit)
        # What the computed mean squared residual may hold when the exact one is zero:
        # - its own rounding: ‖x‖² − ‖x V‖² errs by up to 2γ_D(‖x‖² + ‖x V‖²) ≤ 4γ_D‖x‖²; a projection on the D − dim
        #   residual directions by up to γ_D‖x‖ + 2u‖x‖ per coordinate (products; basis and origin rounded), squared;
        # - the basis's: with the moment's error E, data of rank <= dim leaves at most 2(D − dim)‖E‖ of mean squared
        #   norm in the computed residual directions (Weyl: each of their eigenvalues is at most ‖E‖; minus tr(P E P)).
        #   ‖E‖ is a float64 moment's: a float32 Gram's bound (~1e-4 of the trace) would refuse real features.
        if 2 * self.dim_ < kept:
            own = 4.0 * gamma * total
        else:
            own = kept * (gamma + 2.0 * unit) ** 2 * total
        if mean_squared > own + 2.0 * kept * noise:
            return
        rank = int(np.count_nonzero(values > noise))  # the directions a float64 moment certifies
        hint = f"use dim < {rank}" if rank >= 2 else "no dim in [1, D) leaves them a residual"
        raise DetectorError(
            f"vim: the fit features' mean squared residual off their {self.dim_} principal directions "
            f"({mean_squared:.3g} of {total:.3g}) is within its rounding error: they span at most {rank} of the "
            f"{depth} directions about the head's origin, so alpha would be rounding noise; {hint}"
        )

    def _residual_norm(self, block: np.ndarray) -> np.ndarray:
        return np.linalg.norm((block - self.origin_) @ self.residual_basis_, axis=1)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        residual = self._residual_norm(np.asarray(chunk.features, dtype=np.float64))
        return energy(chunk.logits) - self.alpha_ * residual


@register("nnguide")
class NNGuide(Detector):
    """NNGuide: energy(x) · mean of the top-K inner products of ẑ with a bank of energy-scaled ẑ_j (α of the fit set)."""

    requires = Requirements.of(fit=("features", "logits"), score=("features", "logits"))
    paper = Paper(
        "Park, Jung & Teoh, Nearest Neighbor Guidance for Out-of-Distribution Detection",
        "ICCV 2023",
        "https://arxiv.org/abs/2309.14888",
        "k=100, alpha=0.01: OpenOOD v1.5's nnguide.yml (the paper's bank is a 1% subset of the training set); "
        "the bank is a seeded uniform random alpha-fraction of the fit set; exact inner-product search (BLAS products)",
    )
    summary = Summary(
        "energy(f)·mean top-K ⟨ẑ, bank⟩, bank = ẑ_j·energy_j for a random α of the fit set",
        defaults="OpenOOD `nnguide.yml`",
        also_in="pytorch-ood, OpenOOD",
    )

    def __init__(self, k: int = 100, alpha: float = 0.01, seed: int = 0) -> None:
        self.k = k
        self.alpha = alpha
        self.seed = seed

    def _validate_params(self) -> None:
        self._check_int(k=self.k)
        self._check_int(minimum=0, seed=self.seed)
        if not isinstance(self.alpha, (int, float, np.integer, np.floating)) or not 0 < self.alpha <= 1:
            raise DetectorError(f"nnguide: alpha (bank fraction) must lie in (0, 1]; got {self.alpha!r}")

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """The bank: int(alpha·N) fit rows (their numbers, and their energy-scaled unit features in an index)."""
        if fit.num_rows is None:
            raise DetectorError("nnguide: the fit recorded no row count")
        bank = int(fit.num_rows * float(self.alpha))
        if self.k > bank:
            raise DetectorError(f"nnguide: k={self.k} exceeds the bank's {bank} rows")
        return {"bank_rows_": Array("int64", (bank,)), "index_": FlatIndex(bank, "D")}

    def size_problems(self, size: FitSize) -> list[str]:
        bank_size = int(size.rows * float(self.alpha))
        if bank_size >= self.k:
            return []
        if size.rows >= self.k:
            needed = math.ceil(self.k / size.rows * 1000) / 1000  # rounded up: int(rows * alpha) must reach k
            fix = f"raise alpha to >= {needed:g} or lower k to <= {max(bank_size, 1)}"
        else:
            fix = f"lower k to <= {size.rows} (with alpha=1, the whole fit set)"
        return [f"the bank holds {bank_size} rows (alpha={self.alpha} of {size.rows}) but k={self.k}; {fix}"]

    def adapted_to(self, size: FitSize) -> dict[str, Any]:
        if not self.size_problems(size):
            return {}
        # A small fit set is the whole bank, searched for about 1% of its rows (the defaults' share on
        # ImageNet-1k: k=100 of a 12,812-row bank is 0.8%), at least one.
        return {"alpha": 1.0, "k": min(self.k, max(1, round(size.rows / 100)))}

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        import faiss

        bank_size = int(len(fit_set) * float(self.alpha))
        self.bank_rows_ = sample_rows(len(fit_set), bank_size, int(self.seed))
        features = gather_rows(fit_set.features, self.bank_rows_)
        confidence = energy(gather_rows(fit_set.logits, self.bank_rows_))
        bank = l2_normalize(features) * confidence[:, None]
        self.index_ = faiss.IndexFlatIP(fit_set.num_features)
        self.index_.add(np.ascontiguousarray(bank, dtype=np.float32))

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        queries = unit_float32(chunk.features)  # normalised as knn's queries: in float32, one pass, no float64 copy
        # The k largest in descending order, as faiss returns them: their float64 mean is then summed in one order.
        top = -np.sort(-flat_search(queries, self.index_, self.k), axis=1)
        return energy(chunk.logits) * top.astype(np.float64).mean(axis=1)

    def _row_width(self, test: Outputs) -> int:
        # The float32 unit row, a block of products and their partition (float32: half a value each; the first block
        # holds at least k rows), the top k with its negated and sorted copies and their float64 form, and the
        # float64 logits of the energy.
        bank = min(int(self.index_.ntotal), max(FLAT_BLOCK_ROWS, self.k))
        return (test.num_features + 1) // 2 + bank + 3 * self.k + int(test.num_classes or 0)
