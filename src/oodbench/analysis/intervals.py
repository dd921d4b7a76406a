"""Confidence intervals for FPR@95 and AUROC.

- FPR@95 at a **fixed** threshold (the one the full ID set gives) is a binomial proportion of the OOD set:
  Wilson's score interval and the exact Clopper–Pearson interval.
- The stratified bootstrap resamples ID and OOD independently (with replacement), so the threshold moves too.
  A resample is represented by its multiplicity counts over the sorted scores: a replicate of FPR@95 or AUROC is
  then a cumulative sum and a gather, vectorised over blocks of replicates, never a sort per replicate. Counts
  are drawn per side from a stream keyed by (seed, side, size), so the pairs of a run that share a side's size
  share its draws: a run's bootstrap costs one draw per side and size, and a gather per pair.
  Intervals: percentile, and BCa (bias-corrected and accelerated) with the two-sample jackknife acceleration
  of Efron & Tibshirani (1993, §14.3), which for these statistics is itself closed-form.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy import special, stats

from ..core import metrics
from ..core.errors import AnalysisError
from ..util.chunking import DEFAULT_CHUNK_BYTES
from ..util.cores import available_cores
from .records import plain_dict

__all__ = [
    "Interval",
    "BootstrapResult",
    "wilson_interval",
    "clopper_pearson_interval",
    "fpr_interval",
    "bootstrap_replicates",
    "bootstrap_replicates_many",
    "jackknife_values",
    "percentile_interval",
    "bca_interval",
    "bootstrap",
    "bootstrap_many",
    "BOOTSTRAP_METRICS",
]

BOOTSTRAP_METRICS = ("fpr95", "auroc")
# The largest count × running total multiplied in int32 (past it the products are taken in int64).
INT32_PRODUCT_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    method: str
    confidence: float

    def as_dict(self) -> dict[str, object]:
        """Plain dict (for JSON)."""
        return plain_dict(self)


def _check_confidence(confidence: float) -> float:
    if not 0.0 < float(confidence) < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1); got {confidence}")
    return float(confidence)


def _check_counts(successes: object, trials: object) -> tuple[np.ndarray, np.ndarray]:
    k = np.asarray(successes)
    n = np.asarray(trials)
    if not (np.issubdtype(k.dtype, np.integer) and np.issubdtype(n.dtype, np.integer)):
        if not (np.all(np.mod(k, 1) == 0) and np.all(np.mod(n, 1) == 0)):
            raise AnalysisError("successes and trials must be whole numbers")
    k = k.astype(np.float64)
    n = n.astype(np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise AnalysisError("need 0 <= successes <= trials and trials >= 1")
    return k, n


def _unwrap(value: np.ndarray) -> float | np.ndarray:
    return float(value) if np.ndim(value) == 0 else value


def wilson_interval(
    successes: object, trials: object, confidence: float = 0.95
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """Wilson score interval for a binomial proportion (vectorised over arrays of counts)."""
    k, n = _check_counts(successes, trials)
    z = stats.norm.ppf(0.5 + _check_confidence(confidence) / 2)
    center = (k + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * np.sqrt(k * (n - k) / n + z * z / 4)
    # At k = 0 and k = n one root is exactly 0 (resp. 1); pin it rather than keep the rounding residue.
    low = np.where(k == 0, 0.0, np.clip(center - half, 0.0, 1.0))
    high = np.where(k == n, 1.0, np.clip(center + half, 0.0, 1.0))
    return _unwrap(low), _unwrap(high)


def clopper_pearson_interval(
    successes: object, trials: object, confidence: float = 0.95
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """Exact (Clopper–Pearson) interval: beta quantiles, 0 and 1 at the boundaries (vectorised)."""
    k, n = _check_counts(successes, trials)
    alpha = 1 - _check_confidence(confidence)
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, special.betaincinv(np.maximum(k, 1), n - k + 1, alpha / 2), 0.0)
        high = np.where(k < n, special.betaincinv(k + 1, np.maximum(n - k, 1), 1 - alpha / 2), 1.0)
    return _unwrap(low), _unwrap(high)


def fpr_interval(
    id_scores: object, ood_scores: object, *, tpr: float = 0.95, confidence: float = 0.95, method: str = "wilson"
) -> Interval:
    """FPR@95 with a binomial interval over the OOD set, the threshold held fixed at its full-ID-set value."""
    threshold = metrics.threshold_at_tpr(id_scores, tpr)
    ood = metrics.as_scores("ood_scores", ood_scores)
    accepted = int(np.count_nonzero(ood >= threshold))
    if method == "wilson":
        low, high = wilson_interval(accepted, ood.shape[0], confidence)
    elif method in ("clopper-pearson", "clopper_pearson", "exact"):
        low, high = clopper_pearson_interval(accepted, ood.shape[0], confidence)
        method = "clopper-pearson"
    else:
        raise AnalysisError(f"unknown binomial interval {method!r}; use 'wilson' or 'clopper-pearson'")
    return Interval(accepted / ood.shape[0], float(low), float(high), method, float(confidence))


def required_count(tpr: float, n: int) -> int:
    """How many of n ID scores the FPR@95 threshold must accept: the smallest k with k / n >= tpr (as `metrics`)."""
    if not 0.0 < float(tpr) <= 1.0:
        raise AnalysisError(f"tpr must lie in (0, 1]; got {tpr}")
    # The metric's own rule (with its float-noise rounding), so bootstrap and jackknife thresholds match FPR@95's.
    return metrics.required_count(float(tpr), n)


def _stream(seed: int, side: str, size: int) -> np.random.Generator:
    """The resampling stream of one side ("id" or "ood") of `size` scores.

    Every pair whose side has this size draws the same counts, so a run's pairs share their draws (and a pair's
    replicates never depend on which other pairs are resampled with it).
    """
    return np.random.default_rng([int(seed), zlib.crc32(b"stratified-bootstrap"), zlib.crc32(side.encode()), size])


def _draw_counts(rng: np.random.Generator, rows: int, size: int) -> np.ndarray:
    """(rows, size) multiplicity counts of `rows` with-replacement resamples of `size` items, as int32."""
    counts = np.empty((rows, size), dtype=np.int32)
    for row in range(rows):  # one call per resample: the stream is the same whatever the block size
        counts[row] = np.bincount(rng.integers(0, size, size), minlength=size)
    return counts


def _cumulative(counts: np.ndarray) -> np.ndarray:
    """(rows, size + 1) running totals with a leading 0: column j is the weight of the first j items."""
    total = np.zeros((counts.shape[0], counts.shape[1] + 1), dtype=np.int32 if counts.shape[1] < 2**31 else np.int64)
    np.cumsum(counts, axis=1, out=total[:, 1:])
    return total


@dataclass(frozen=True)
class _Ranks:
    """One pair's rank structure: all a replicate needs besides the resample's counts.

    ID scores are indexed in descending order, OOD scores in ascending order, so each side's counts are indexed
    by rank and the two sides' running totals answer "how much resampled weight lies above / below a score".
    """

    n: int
    m: int
    below: np.ndarray  # (n,) int32: how many OOD scores lie strictly below each ID score
    gather_ood: bool  # AUROC sums over the OOD side (m <= n) or over the ID side
    strict: np.ndarray  # indices into the other side's running totals: "strictly beyond" each score
    loose: np.ndarray | None  # "beyond or equal"; None where no ID score equals an OOD score


def _ranks(ids: np.ndarray, ood: np.ndarray) -> _Ranks:
    """The rank structure of one (ID, OOD) pair of score arrays."""
    ids_asc, ood_asc = np.sort(ids), np.sort(ood)
    ids_desc = ids_asc[::-1]
    n, m = ids.shape[0], ood.shape[0]
    below = np.searchsorted(ood_asc, ids_desc, side="left")
    if m <= n:
        # Weight of the resampled ID scores above (and at or above) each OOD score: the ID running totals at the
        # count of ID scores above it, since ID counts are in descending order.
        strict = n - np.searchsorted(ids_asc, ood_asc, side="right")
        loose = n - np.searchsorted(ids_asc, ood_asc, side="left")
    else:
        strict, loose = below, np.searchsorted(ood_asc, ids_desc, side="right")
    tied = not np.array_equal(strict, loose)
    return _Ranks(n, m, below.astype(np.int32), m <= n, strict.astype(np.intp), loose.astype(np.intp) if tied else None)


def _replicates_from_counts(
    ranks: _Ranks,
    id_counts: np.ndarray,
    ood_counts: np.ndarray,
    id_totals: np.ndarray,
    ood_totals: np.ndarray,
    positions: np.ndarray | None,
    metric_names: Sequence[str],
) -> dict[str, np.ndarray]:
    """One pair's replicates for a block of resamples given as counts (ID descending, OOD ascending) and their
    running totals; `positions` are the ranks of each resample's threshold (the k-th largest resampled ID score)."""
    n, m = ranks.n, ranks.m
    out: dict[str, np.ndarray] = {}
    if "fpr95" in metric_names:
        assert positions is not None
        rows = np.arange(id_counts.shape[0])
        # OOD weight strictly below the threshold is rejected; the rest of the m resampled OOD scores is accepted.
        rejected = ood_totals[rows, ranks.below[positions]]
        out["fpr95"] = (m - rejected) / m
    if "auroc" in metric_names:
        weights, totals = (ood_counts, id_totals) if ranks.gather_ood else (id_counts, ood_totals)
        beyond = totals[:, ranks.strict]
        if ranks.loose is None:
            scale = 2
        else:
            beyond += totals[:, ranks.loose]
            scale = 1
        # Exact integers: wins count twice and ties once. int32 products suffice while they cannot overflow.
        largest = int(weights.max(initial=0)) * 2 * (n if ranks.gather_ood else m)
        if largest > INT32_PRODUCT_LIMIT:
            weights = weights.astype(np.int64)
        wins_twice = (weights * beyond).sum(axis=1, dtype=np.int64) * scale
        out["auroc"] = wins_twice / (2.0 * n * m)
    return out


def _positions(id_totals: np.ndarray, k: int) -> np.ndarray:
    """Rank (0-based, descending) of each resample's k-th largest ID score: the first rank whose total reaches k."""
    return np.count_nonzero(id_totals[:, 1:] < k, axis=1)


def _block_rows(n: int, m: int, resamples: int, budget_bytes: int, workers: int = 1) -> int:
    """Resamples per block: counts and running totals of both sides and each worker's AUROC gather fit the budget."""
    per_row = 8 * (n + 1) + 8 * (m + 1) + workers * 16 * min(n, m)
    return max(1, min(resamples, budget_bytes // per_row))


def bootstrap_replicates_many(
    pairs: Sequence[tuple[object, object]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    tpr: float = 0.95,
    metric_names: Sequence[str] = BOOTSTRAP_METRICS,
    budget_bytes: int = DEFAULT_CHUNK_BYTES,
    advance: Callable[[float], None] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Replicates of many (ID scores, OOD scores) pairs, each exactly as `bootstrap_replicates` gives it alone.

    Pairs that share an ID (or OOD) size share that side's draws, so a run's detectors and OOD sets cost one
    draw per side and size, and each pair only its gathers. `advance(share)` reports progress in pairs.
    """
    checked = [(metrics.as_scores("id_scores", ids), metrics.as_scores("ood_scores", ood)) for ids, ood in pairs]
    return _replicates_many(checked, resamples, seed, tpr, metric_names, budget_bytes, advance)


def _replicates_many(
    checked: Sequence[tuple[np.ndarray, np.ndarray]],
    resamples: int,
    seed: int,
    tpr: float,
    metric_names: Sequence[str],
    budget_bytes: int = DEFAULT_CHUNK_BYTES,
    advance: Callable[[float], None] | None = None,
) -> list[dict[str, np.ndarray]]:
    """`bootstrap_replicates_many` on score arrays already checked by `metrics.as_scores`."""
    unknown = sorted(set(metric_names) - set(BOOTSTRAP_METRICS))
    if unknown:
        raise AnalysisError(f"cannot bootstrap {unknown}; available: {', '.join(BOOTSTRAP_METRICS)}")
    resamples = int(resamples)
    if resamples < 2:
        raise AnalysisError(f"resamples must be at least 2; got {resamples}")
    out: list[dict[str, np.ndarray]] = [{name: np.empty(resamples) for name in metric_names} for _ in checked]
    by_n: dict[int, list[int]] = {}
    for index, (ids, _) in enumerate(checked):
        by_n.setdefault(ids.shape[0], []).append(index)
    for n, members in by_n.items():
        members.sort(key=lambda i: checked[i][1].shape[0])  # a chunk then holds few OOD sizes, each drawn once
        for chunk in _pair_chunks(members, checked, budget_bytes):
            ranks = {i: _ranks(*checked[i]) for i in chunk}
            _fill_chunk(n, chunk, ranks, out, resamples, seed, tpr, metric_names, budget_bytes, advance)
    return out


def _pair_chunks(
    members: list[int], checked: Sequence[tuple[np.ndarray, np.ndarray]], budget_bytes: int
) -> list[list[int]]:
    """Consecutive groups of pairs whose rank structures fit the budget (at least one pair each)."""
    chunks: list[list[int]] = [[]]
    used = 0
    for index in members:
        n, m = checked[index][0].shape[0], checked[index][1].shape[0]
        size = 4 * n + 16 * min(n, m)
        if chunks[-1] and used + size > budget_bytes:
            chunks.append([])
            used = 0
        chunks[-1].append(index)
        used += size
    return chunks


def _fill_chunk(
    n: int,
    chunk: list[int],
    ranks: dict[int, _Ranks],
    out: list[dict[str, np.ndarray]],
    resamples: int,
    seed: int,
    tpr: float,
    metric_names: Sequence[str],
    budget_bytes: int,
    advance: Callable[[float], None] | None,
) -> None:
    """Replicates of one chunk of pairs with ID size n, block by block of resamples."""
    by_m: dict[int, list[int]] = {}
    for index in chunk:
        by_m.setdefault(ranks[index].m, []).append(index)
    k = required_count(tpr, n)
    id_stream = _stream(seed, "id", n)
    ood_streams = {m: _stream(seed, "ood", m) for m in by_m}
    # Pairs are independent and their replicates exact integers over n·m: threads give the same values, and
    # numpy releases the GIL in the gathers and sums that dominate.
    workers = max(1, min(available_cores(), max(len(v) for v in by_m.values())))
    rows = _block_rows(n, max(by_m), resamples, budget_bytes, workers)
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, resamples, rows):
            stop = min(resamples, start + rows)
            id_counts = _draw_counts(id_stream, stop - start, n)
            id_totals = _cumulative(id_counts)
            positions = _positions(id_totals, k) if "fpr95" in metric_names else None
            for m, indices in by_m.items():
                ood_counts = _draw_counts(ood_streams[m], stop - start, m)
                ood_totals = _cumulative(ood_counts)

                block = (id_counts, ood_counts, id_totals, ood_totals, positions)
                fill = partial(
                    _fill_pair, ranks=ranks, block=block, out=out, span=slice(start, stop), names=metric_names
                )
                list(pool.map(fill, indices))
                if advance is not None:
                    advance(len(indices) * (stop - start) / resamples)


def _fill_pair(
    index: int,
    *,
    ranks: dict[int, _Ranks],
    block: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
    out: list[dict[str, np.ndarray]],
    span: slice,
    names: Sequence[str],
) -> None:
    """Write one pair's replicates of one block of resamples into its output arrays."""
    for name, values in _replicates_from_counts(ranks[index], *block, names).items():
        out[index][name][span] = values


def bootstrap_replicates(
    id_scores: object,
    ood_scores: object,
    *,
    resamples: int = 2000,
    seed: int = 0,
    tpr: float = 0.95,
    metric_names: Sequence[str] = BOOTSTRAP_METRICS,
    budget_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, np.ndarray]:
    """{metric: (resamples,) values} of FPR@95 and/or AUROC on stratified bootstrap resamples of ID and OOD."""
    return bootstrap_replicates_many(
        [(id_scores, ood_scores)],
        resamples=resamples,
        seed=seed,
        tpr=tpr,
        metric_names=metric_names,
        budget_bytes=budget_bytes,
    )[0]


def jackknife_values(
    id_scores: object, ood_scores: object, metric: str, *, tpr: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Leave-one-out values of the metric: (leaving out each ID score, leaving out each OOD score), closed-form."""
    ids = metrics.as_scores("id_scores", id_scores)
    ood = metrics.as_scores("ood_scores", ood_scores)
    n, m = ids.shape[0], ood.shape[0]
    if n < 2 or m < 2:
        raise AnalysisError("the jackknife needs at least 2 ID and 2 OOD scores")
    if metric == "fpr95":
        ids_desc = np.sort(ids)[::-1]
        ood_asc = np.sort(ood)

        def fpr(threshold: float) -> float:
            return (m - np.searchsorted(ood_asc, threshold, side="left")) / m

        # With one ID score removed the threshold is the k'-th largest of the rest (k' for n - 1 scores):
        # removing one of the top k' moves it one place down, removing any other leaves it.
        k_rest = required_count(tpr, n - 1)
        upper, lower = ids_desc[k_rest - 1], ids_desc[min(k_rest, n - 1)]
        by_id = np.where(np.arange(n) < k_rest, fpr(lower), fpr(upper))
        # by_id is in descending-score order; the jackknife moments do not depend on the order.
        threshold = metrics.threshold_at_tpr(ids, tpr)
        accepted = ood >= threshold
        by_ood = (accepted.sum() - accepted) / (m - 1)
        return by_id.astype(np.float64), by_ood.astype(np.float64)
    if metric == "auroc":
        ood_asc = np.sort(ood)
        ids_asc = np.sort(ids)
        id_wins = (np.searchsorted(ood_asc, ids, "left") + np.searchsorted(ood_asc, ids, "right")) / 2.0
        ood_losses = (n - np.searchsorted(ids_asc, ood, "right") + n - np.searchsorted(ids_asc, ood, "left")) / 2.0
        total = id_wins.sum()
        return (total - id_wins) / ((n - 1) * m), (total - ood_losses) / (n * (m - 1))
    raise AnalysisError(f"no jackknife for metric {metric!r}; available: {', '.join(BOOTSTRAP_METRICS)}")


def percentile_interval(replicates: np.ndarray, estimate: float, confidence: float = 0.95) -> Interval:
    """Percentile bootstrap interval."""
    alpha = 1 - _check_confidence(confidence)
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return Interval(float(estimate), float(low), float(high), "percentile", float(confidence))


def acceleration(jackknife: Sequence[np.ndarray]) -> float:
    """BCa acceleration from per-sample jackknife values (Efron & Tibshirani eq. 14.15, summed over samples)."""
    numerator = 0.0
    denominator = 0.0
    for values in jackknife:
        size = values.shape[0]
        u = (size - 1) * (values.mean() - values)
        numerator += float(np.sum(u**3)) / size**3
        denominator += float(np.sum(u**2)) / size**2
    if denominator <= 0:
        return 0.0
    return numerator / (6.0 * denominator**1.5)


def bca_interval(
    replicates: np.ndarray, estimate: float, jackknife: Sequence[np.ndarray], confidence: float = 0.95
) -> tuple[Interval, float, float]:
    """BCa interval, with its bias correction z0 and acceleration a."""
    alpha = 1 - _check_confidence(confidence)
    count = replicates.shape[0]
    # Mid-rank proportion below the estimate: FPR replicates are discrete and often equal the estimate.
    share = (np.count_nonzero(replicates < estimate) + 0.5 * np.count_nonzero(replicates == estimate)) / count
    share = min(max(share, 0.5 / count), 1 - 0.5 / count)
    z0 = float(stats.norm.ppf(share))
    a = acceleration(jackknife)
    levels = []
    for z_alpha in stats.norm.ppf([alpha / 2, 1 - alpha / 2]):
        shifted = z0 + z_alpha
        levels.append(float(stats.norm.cdf(z0 + shifted / (1 - a * shifted))))
    low, high = np.quantile(replicates, levels)
    return Interval(float(estimate), float(low), float(high), "bca", float(confidence)), z0, a


@dataclass(frozen=True)
class BootstrapResult:
    """Bootstrap distribution of one metric and its percentile and BCa intervals."""

    metric: str
    estimate: float
    replicates: np.ndarray
    percentile: Interval
    bca: Interval
    bias_correction: float
    acceleration: float

    @property
    def std(self) -> float:
        return float(self.replicates.std(ddof=1))

    def as_dict(self) -> dict[str, object]:
        """Summary without the replicates (for JSON)."""
        return {
            "metric": self.metric,
            "estimate": self.estimate,
            "std": self.std,
            "resamples": int(self.replicates.shape[0]),
            "percentile": self.percentile.as_dict(),
            "bca": self.bca.as_dict(),
            "bias_correction": self.bias_correction,
            "acceleration": self.acceleration,
        }


def bootstrap_many(
    pairs: Sequence[tuple[object, object]],
    *,
    metric_names: Sequence[str] = BOOTSTRAP_METRICS,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    tpr: float = 0.95,
    advance: Callable[[float], None] | None = None,
) -> list[dict[str, BootstrapResult]]:
    """`bootstrap` of many (ID scores, OOD scores) pairs, sharing each side's draws (see `bootstrap_replicates_many`)."""
    _check_confidence(confidence)
    checked = [(metrics.as_scores("id_scores", ids), metrics.as_scores("ood_scores", ood)) for ids, ood in pairs]
    all_replicates = _replicates_many(checked, resamples, seed, tpr, metric_names, advance=advance)
    found = []
    for (ids, ood), replicates in zip(checked, all_replicates, strict=True):
        results = {}
        for name in metric_names:
            estimate = metrics.fpr_at_tpr(ids, ood, tpr) if name == "fpr95" else metrics.auroc(ids, ood)
            jack = jackknife_values(ids, ood, name, tpr=tpr)
            bca, z0, a = bca_interval(replicates[name], estimate, jack, confidence)
            percentile = percentile_interval(replicates[name], estimate, confidence)
            results[name] = BootstrapResult(name, estimate, replicates[name], percentile, bca, z0, a)
        found.append(results)
    return found


def bootstrap(
    id_scores: object,
    ood_scores: object,
    *,
    metric_names: Sequence[str] = BOOTSTRAP_METRICS,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    tpr: float = 0.95,
) -> dict[str, BootstrapResult]:
    """Stratified bootstrap (ID and OOD resampled separately) of FPR@95 and AUROC with percentile and BCa intervals."""
    return bootstrap_many(
        [(id_scores, ood_scores)],
        metric_names=metric_names,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        tpr=tpr,
    )[0]


def normal_interval(
    estimate: float,
    se: float,
    confidence: float = 0.95,
    method: str = "normal",
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Interval:
    """estimate ± z·se, clipped to `bounds`."""
    z = float(stats.norm.ppf(0.5 + _check_confidence(confidence) / 2))
    return Interval(
        float(estimate),
        float(max(bounds[0], estimate - z * se)),
        float(min(bounds[1], estimate + z * se)),
        method,
        float(confidence),
    )
