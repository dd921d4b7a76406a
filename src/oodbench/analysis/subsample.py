"""Subsampling study (the Fi-ImageNet-1k paper's §4.6, Appendix C, Table A6, Fig. A4): how much would FPR@95 move on a smaller OOD set?

For one (model, OOD set): every detector's ID threshold is fixed from the full ID test set, so whether an OOD image
is accepted is one bit per (image, detector), computed once. A draw of n OOD images without replacement then gives
each detector's FPR as a bit count. Images with the same bits across detectors are interchangeable, so a draw is
fully described by how many images it takes from each group of equal bits (a multivariate hypergeometric draw,
sampled in O(n) per draw), and R draws are one (R × groups) @ (groups × D) product. The best
detector on the full set is fixed; we report its full FPR, the mean, bias and standard deviation over draws, the
closed-form standard error √(p(1−p)/n)·√((N−n)/(N−1)) (hypergeometric sampling), and the mean Spearman ρ between
the detector ranking on each draw and on the full set.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import metrics
from ..core.errors import AnalysisError
from ..util.chunking import DEFAULT_CHUNK_BYTES
from ..util.progress import progress_bar
from .records import plain_dict
from .rundata import RunData

__all__ = [
    "PAPER_N",
    "AcceptanceBits",
    "SubsampleStudy",
    "SubsampleSummary",
    "acceptance_bits",
    "average_ranks",
    "rank_correlation",
    "closed_form_se",
    "draw_counts",
    "subsample_fpr",
    "subsample_curve",
    "resolve_n",
    "subsample_run",
]

# The Fi-ImageNet-1k paper's subset size: the size of Fi-ImageNet-1k, its smallest OOD set, so every set is
# compared at equal n.
PAPER_N = 655


@dataclass(frozen=True)
class AcceptanceBits:
    """Per-detector ID thresholds and the (N_ood × D) matrix of OOD acceptance bits (ood >= threshold)."""

    detectors: tuple[str, ...]
    thresholds: np.ndarray  # (D,)
    accepted: np.ndarray  # (N, D) bool
    full_auroc: dict[str, float]  # filled only where needed to break FPR ties

    @property
    def n_total(self) -> int:
        return int(self.accepted.shape[0])

    @property
    def full_fpr(self) -> np.ndarray:
        return self.accepted.sum(axis=0, dtype=np.int64) / self.n_total


def acceptance_bits(
    id_scores: Mapping[str, object],
    ood_scores: Mapping[str, object],
    tpr: float = 0.95,
    thresholds: dict[str, float] | None = None,
) -> AcceptanceBits:
    """Thresholds from the full ID scores and the OOD acceptance bits of every detector present in both mappings.

    `thresholds` is a cache shared across OOD sets of one ID set: missing entries are computed and added.
    """
    names = [name for name in ood_scores if name in id_scores]
    missing = sorted(set(ood_scores) ^ set(id_scores))
    if missing:
        raise AnalysisError(f"detectors {missing} have scores for only one of ID and OOD; pass matching mappings")
    if not names:
        raise AnalysisError("no detector scores given")
    oods = [metrics.as_scores(f"ood_scores[{name!r}]", ood_scores[name]) for name in names]
    sizes = {name: o.shape[0] for name, o in zip(names, oods, strict=False)}
    if len(set(sizes.values())) != 1:
        raise AnalysisError(f"OOD score arrays of one dataset must have one length; got {sizes}")
    cache = thresholds if thresholds is not None else {}
    for name in names:
        if name not in cache:
            cache[name] = metrics.threshold_at_tpr(id_scores[name], tpr)
    values = np.array([cache[name] for name in names])
    accepted = np.empty((oods[0].shape[0], len(names)), dtype=bool)
    for column, (ood, threshold) in enumerate(zip(oods, values, strict=False)):
        np.greater_equal(ood, threshold, out=accepted[:, column])
    return AcceptanceBits(tuple(names), values, accepted, {})


def closed_form_se(p: float | np.ndarray, n: int, n_total: int) -> float | np.ndarray:
    """Standard error of a proportion from n of N items drawn without replacement: √(p(1−p)/n)·√((N−n)/(N−1))."""
    if not 1 <= n <= n_total:
        raise AnalysisError(f"subset size n={n} must lie in [1, N={n_total}]")
    fpc = (n_total - n) / (n_total - 1) if n_total > 1 else 0.0
    return np.sqrt(np.asarray(p) * (1 - np.asarray(p)) / n * fpc) if np.ndim(p) else math.sqrt(p * (1 - p) / n * fpc)


def _pattern_groups(accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct acceptance patterns (P, D) over the detectors and how many OOD images share each (P,)."""
    packed = np.ascontiguousarray(np.packbits(accepted, axis=1))
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, sizes = np.unique(keys, return_index=True, return_counts=True)
    return accepted[first], sizes.astype(np.int64)


def draw_counts(
    accepted: np.ndarray, n: int, draws: int, rng: np.random.Generator, budget_bytes: int = DEFAULT_CHUNK_BYTES
) -> np.ndarray:
    """(draws, D) accepted counts, each row from a uniform draw of n of the N rows of `accepted` without replacement.

    Only how many drawn images share each acceptance pattern matters, and for a uniform n-subset those numbers
    follow the multivariate hypergeometric law over the pattern groups. numpy's "count" method samples it with a
    partial Fisher–Yates shuffle, O(min(n, N − n)) per draw after an O(N) set-up per block, and the detectors'
    counts are then one (R × P) @ (P × D) product over the P distinct patterns.
    """
    n_total, width = accepted.shape
    if not 1 <= n <= n_total:
        raise AnalysisError(f"cannot draw n={n} of N={n_total} OOD images without replacement")
    patterns, sizes = _pattern_groups(np.asarray(accepted, dtype=bool))
    # Every partial sum is a count <= n, exact in float32 below 2**24; the product runs on BLAS.
    dtype = np.float32 if n < 2**24 else np.float64
    weights = patterns.astype(dtype)
    counts = np.empty((draws, width), dtype=np.int64)
    rows = max(1, min(draws, budget_bytes // (12 * sizes.shape[0])))  # int64 counts + their float copy
    for start in range(0, draws, rows):
        stop = min(draws, start + rows)
        per_group = rng.multivariate_hypergeometric(sizes, n, size=stop - start, method="count")
        counts[start:stop] = np.rint(per_group.astype(dtype) @ weights).astype(np.int64)
    return counts


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Row-wise ranks (1 = smallest) with ties given their average rank, for a (R, D) array."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise AnalysisError(f"average_ranks needs a (rows, items) array; got shape {values.shape}")
    rows, width = values.shape
    ranks = np.empty((rows, width), dtype=np.float64)
    # Pairwise comparison keeps ties exact; chunked so a block holds at most ~4M comparisons.
    step = max(1, 4_000_000 // max(1, width * width))
    for start in range(0, rows, step):
        block = values[start : start + step]
        below = (block[:, None, :] < block[:, :, None]).sum(axis=2)
        equal = (block[:, None, :] == block[:, :, None]).sum(axis=2)
        ranks[start : start + step] = below + (equal + 1) / 2.0
    return ranks


def rank_correlation(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Spearman ρ (average ranks for ties) of each row of `values` (R, D) with `reference` (D,); NaN if a side is constant."""
    values = np.asarray(values, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if values.ndim != 2 or reference.shape != (values.shape[1],):
        raise AnalysisError(f"rank_correlation needs (R, D) and (D,); got {values.shape} and {reference.shape}")
    row_ranks = average_ranks(values)
    ref_ranks = average_ranks(reference[None, :])[0]
    row_centered = row_ranks - row_ranks.mean(axis=1, keepdims=True)
    ref_centered = ref_ranks - ref_ranks.mean()
    numerator = row_centered @ ref_centered
    denominator = np.sqrt((row_centered**2).sum(axis=1) * (ref_centered**2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)
    return np.clip(rho, -1.0, 1.0)


@dataclass(frozen=True)
class SubsampleSummary:
    """One row of Table A6: the best detector's FPR@95 on the full set and over draws of n OOD images."""

    model: str
    id_dataset: str
    ood_dataset: str
    detector: str
    n: int
    n_total: int
    draws: int
    full: float
    mean: float
    bias: float
    std: float
    se: float
    spearman: float
    spearman_defined: int

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON (an undefined ρ becomes null: JSON has no NaN)."""
        return plain_dict(self)


@dataclass(frozen=True)
class SubsampleStudy:
    """All draws of one (model, OOD set, n): FPR per draw and detector, with the full-set values."""

    model: str
    id_dataset: str
    ood_dataset: str
    detectors: tuple[str, ...]
    n: int
    n_total: int
    seed: int
    full_fpr: np.ndarray  # (D,)
    draw_counts: np.ndarray  # (R, D) accepted OOD images per draw and detector
    best: str

    @property
    def draws(self) -> int:
        return int(self.draw_counts.shape[0])

    @property
    def draw_fpr(self) -> np.ndarray:
        """(R, D) FPR@95 per draw and detector."""
        return self.draw_counts / float(self.n)

    @property
    def best_index(self) -> int:
        return self.detectors.index(self.best)

    @property
    def spearman(self) -> np.ndarray:
        """ρ between each draw's detector ranking and the full-set ranking (NaN where a ranking is all ties)."""
        return rank_correlation(self.draw_fpr, self.full_fpr)

    def summary(self) -> SubsampleSummary:
        """Table A6 row of this study."""
        counts = self.draw_counts[:, self.best_index]
        full = float(self.full_fpr[self.best_index])
        # Moments from exact integer sums, so identical draws give a std of exactly 0 and no rounding bias.
        total, squares, draws = int(counts.sum()), int((counts * counts).sum()), self.draws
        mean = total / (draws * self.n)
        variance = (draws * squares - total * total) / (draws * (draws - 1)) / self.n**2
        rho = self.spearman
        defined = rho[~np.isnan(rho)]
        return SubsampleSummary(
            model=self.model,
            id_dataset=self.id_dataset,
            ood_dataset=self.ood_dataset,
            detector=self.best,
            n=self.n,
            n_total=self.n_total,
            draws=self.draws,
            full=full,
            mean=mean,
            bias=mean - full,
            std=math.sqrt(variance),
            se=float(closed_form_se(full, self.n, self.n_total)),
            spearman=float(defined.mean()) if defined.size else float("nan"),
            spearman_defined=int(defined.size),
        )


def _best_detector(bits: AcceptanceBits, id_scores: Mapping[str, object], ood_scores: Mapping[str, object]) -> str:
    """Lowest full-set FPR@95; ties broken by higher AUROC, then by the given order."""
    fpr = bits.full_fpr
    tied = [bits.detectors[i] for i in np.flatnonzero(fpr == fpr.min())]
    if len(tied) == 1:
        return tied[0]
    for name in tied:
        if name not in bits.full_auroc:
            bits.full_auroc[name] = metrics.auroc(id_scores[name], ood_scores[name])
    return max(tied, key=lambda name: (bits.full_auroc[name], -tied.index(name)))


def _rng(seed: int, n: int, ood_dataset: str) -> np.random.Generator:
    # One independent stream per (seed, n, dataset): results do not depend on which sets run or in which order.
    return np.random.default_rng([int(seed), int(n), zlib.crc32(ood_dataset.encode("utf-8"))])


def _check_draws(draws: int) -> None:
    if int(draws) < 2:
        raise AnalysisError(f"draws must be at least 2 (a standard deviation needs two); got {draws}")


def subsample_fpr(
    id_scores: Mapping[str, object],
    ood_scores: Mapping[str, object],
    n: int,
    *,
    draws: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
    best: str | None = None,
    model: str = "",
    id_dataset: str = "",
    ood_dataset: str = "ood",
    bits: AcceptanceBits | None = None,
) -> SubsampleStudy:
    """Draw `draws` subsets of n OOD images without replacement and compute every detector's FPR@95 on each."""
    _check_draws(draws)
    bits = bits if bits is not None else acceptance_bits(id_scores, ood_scores, tpr)
    if best is None:
        best = _best_detector(bits, id_scores, ood_scores)
    elif best not in bits.detectors:
        raise AnalysisError(f"best detector {best!r} has no scores; available: {', '.join(bits.detectors)}")
    if not 1 <= int(n) <= bits.n_total:
        raise AnalysisError(f"n={n} must lie in [1, {bits.n_total}] for {ood_dataset!r} ({bits.n_total} OOD images)")
    counts = draw_counts(bits.accepted, int(n), int(draws), _rng(seed, int(n), ood_dataset))
    return SubsampleStudy(
        model=model,
        id_dataset=id_dataset,
        ood_dataset=ood_dataset,
        detectors=bits.detectors,
        n=int(n),
        n_total=bits.n_total,
        seed=int(seed),
        full_fpr=bits.full_fpr,
        draw_counts=counts,
        best=best,
    )


def subsample_curve(
    id_scores: Mapping[str, object],
    ood_scores: Mapping[str, object],
    ns: Sequence[int],
    *,
    draws: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
    model: str = "",
    id_dataset: str = "",
    ood_dataset: str = "ood",
    bits: AcceptanceBits | None = None,
) -> list[SubsampleStudy]:
    """One study per n (Fig. A4), sharing thresholds, acceptance bits and the fixed best detector."""
    bits = bits if bits is not None else acceptance_bits(id_scores, ood_scores, tpr)
    best = _best_detector(bits, id_scores, ood_scores)
    return [
        subsample_fpr(
            id_scores,
            ood_scores,
            n,
            draws=draws,
            seed=seed,
            tpr=tpr,
            best=best,
            model=model,
            id_dataset=id_dataset,
            ood_dataset=ood_dataset,
            bits=bits,
        )
        for n in ns
    ]


def resolve_n(n: int | str | None, sizes: Mapping[str, int]) -> int:
    """The subset size to use: an explicit n, or 'auto' = the paper's 655 capped at half the smallest OOD set."""
    if n is None or (isinstance(n, str) and n.strip().lower() == "auto"):
        if not sizes:
            raise AnalysisError("no OOD datasets to subsample")
        return max(1, min(PAPER_N, min(sizes.values()) // 2))
    try:
        value = int(n)
    except (TypeError, ValueError):
        raise AnalysisError(f"n must be a positive integer or 'auto'; got {n!r}") from None
    if value < 1:
        raise AnalysisError(f"n must be a positive integer; got {value}")
    return value


def subsample_run(
    run: RunData,
    n: int | str | None = "auto",
    *,
    draws: int = 1000,
    seed: int = 0,
    tpr: float = 0.95,
    ood_datasets: Sequence[str] | None = None,
    detectors: Sequence[str] | None = None,
    progress: bool = True,
    skip_too_large: bool = False,
) -> tuple[list[SubsampleStudy], list[str]]:
    """Subsampling study of every (model, OOD set) of a run; returns the studies and notes on skipped sets.

    An n larger than every OOD set is an error, unless `skip_too_large` (one n of several): then no studies and a note.
    """
    _check_draws(draws)
    plans = run.ood_plans(ood_datasets)
    loaded = {plan: run.paired_scores(*plan, detectors=detectors) for plan in plans}
    sizes = {f"{m}/{o}": len(next(iter(ood.values()))) for (m, _, o), (_, ood) in loaded.items()}
    size_n = resolve_n(n, sizes)
    studies: list[SubsampleStudy] = []
    notes: list[str] = []
    thresholds: dict[tuple[str, str], dict[str, float]] = {}  # per (model, ID set): computed once
    with progress_bar(progress) as bar:
        task = bar.add_task("subsampling", total=len(plans))
        for (model, id_dataset, ood), (id_scores, ood_scores) in loaded.items():
            total = sizes[f"{model}/{ood}"]
            if size_n > total:
                notes.append(f"{model}/{ood}: skipped, n={size_n} exceeds its {total} OOD images")
            else:
                bits = acceptance_bits(id_scores, ood_scores, tpr, thresholds.setdefault((model, id_dataset), {}))
                studies.append(
                    subsample_fpr(
                        id_scores,
                        ood_scores,
                        size_n,
                        draws=draws,
                        seed=seed,
                        tpr=tpr,
                        model=model,
                        id_dataset=id_dataset,
                        ood_dataset=ood,
                        bits=bits,
                    )
                )
            bar.advance(task)
    if not studies:
        problem = f"n={size_n} exceeds every OOD set ({', '.join(f'{k}: {v}' for k, v in sizes.items())})"
        if skip_too_large:
            return [], [f"{problem}; skipped"]
        raise AnalysisError(f"{problem}; pass a smaller n, e.g. {max(1, min(sizes.values()) // 2)}")
    return studies, notes
