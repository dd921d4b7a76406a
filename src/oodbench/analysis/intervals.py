"""Confidence intervals for FPR@95 and AUROC.

- FPR@95 at a **fixed** threshold (the one the full ID set gives) is a binomial proportion of the OOD set:
  Wilson's score interval and the exact Clopper–Pearson interval.
- The stratified bootstrap resamples ID and OOD independently (with replacement), so the threshold moves too.
  A resample is represented by its multiplicity counts over the sorted scores: a replicate of FPR@95 or AUROC is
  then a cumulative sum and a gather, vectorised over blocks of replicates, never a sort per replicate.
  Intervals: percentile, and BCa (bias-corrected and accelerated) with the two-sample jackknife acceleration
  of Efron & Tibshirani (1993, §14.3), which for these statistics is itself closed-form.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from ..core import metrics
from ..core.errors import AnalysisError
from ..util.chunking import DEFAULT_CHUNK_BYTES
from .records import plain_dict

__all__ = [
    "Interval",
    "BootstrapResult",
    "wilson_interval",
    "clopper_pearson_interval",
    "fpr_interval",
    "bootstrap_replicates",
    "jackknife_values",
    "percentile_interval",
    "bca_interval",
    "bootstrap",
    "BOOTSTRAP_METRICS",
]

BOOTSTRAP_METRICS = ("fpr95", "auroc")


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


def _multiplicities(rng: np.random.Generator, rows: int, size: int) -> np.ndarray:
    """(rows, size) counts of a with-replacement resample of `size` items, one resample per row."""
    picks = rng.integers(0, size, size=(rows, size)) + (np.arange(rows) * size)[:, None]
    return np.bincount(picks.ravel(), minlength=rows * size).reshape(rows, size)


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
    unknown = sorted(set(metric_names) - set(BOOTSTRAP_METRICS))
    if unknown:
        raise AnalysisError(f"cannot bootstrap {unknown}; available: {', '.join(BOOTSTRAP_METRICS)}")
    if int(resamples) < 2:
        raise AnalysisError(f"resamples must be at least 2; got {resamples}")
    ids_desc = np.sort(metrics.as_scores("id_scores", id_scores))[::-1]
    ood_asc = np.sort(metrics.as_scores("ood_scores", ood_scores))
    rng = np.random.default_rng([int(seed), zlib.crc32(b"stratified-bootstrap")])
    return _replicates_from_counts(ids_desc, ood_asc, tpr, metric_names, int(resamples), rng, budget_bytes)


def _replicates_from_counts(
    ids_desc: np.ndarray,
    ood_asc: np.ndarray,
    tpr: float,
    metric_names: Sequence[str],
    resamples: int,
    rng: np.random.Generator | None,
    budget_bytes: int = DEFAULT_CHUNK_BYTES,
    id_counts: np.ndarray | None = None,
    ood_counts: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Replicates for resamples given as multiplicity counts (drawn here unless passed, for testing)."""
    n, m = ids_desc.shape[0], ood_asc.shape[0]
    k = required_count(tpr, n)
    # Position in the ascending OOD order of each ID value: #OOD < x and #OOD <= x.
    below = np.searchsorted(ood_asc, ids_desc, side="left")
    not_above = np.searchsorted(ood_asc, ids_desc, side="right")
    out = {name: np.empty(resamples) for name in metric_names}
    rows = max(1, min(resamples, budget_bytes // (8 * 3 * (n + m + 1))))
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        w = id_counts[start:stop] if id_counts is not None else _multiplicities(rng, stop - start, n)
        v = ood_counts[start:stop] if ood_counts is not None else _multiplicities(rng, stop - start, m)
        # cum_ood[b, j] = weighted count of the j smallest OOD scores in resample b.
        cum_ood = np.zeros((stop - start, m + 1), dtype=np.int64)
        np.cumsum(v, axis=1, out=cum_ood[:, 1:])
        if "fpr95" in out:
            # The k-th largest resampled ID score is the first (descending) position where the count reaches k.
            position = np.argmax(np.cumsum(w, axis=1) >= k, axis=1)
            rejected = np.take_along_axis(cum_ood, below[position][:, None], axis=1)[:, 0]
            out["fpr95"][start:stop] = (m - rejected) / m
        if "auroc" in out:
            wins_twice = (w * (cum_ood[:, below] + cum_ood[:, not_above])).sum(axis=1)
            out["auroc"][start:stop] = wins_twice / (2.0 * n * m)
    return out


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
    _check_confidence(confidence)
    ids = metrics.as_scores("id_scores", id_scores)
    ood = metrics.as_scores("ood_scores", ood_scores)
    replicates = bootstrap_replicates(ids, ood, resamples=resamples, seed=seed, tpr=tpr, metric_names=metric_names)
    results = {}
    for name in metric_names:
        estimate = metrics.fpr_at_tpr(ids, ood, tpr) if name == "fpr95" else metrics.auroc(ids, ood)
        jack = jackknife_values(ids, ood, name, tpr=tpr)
        bca, z0, a = bca_interval(replicates[name], estimate, jack, confidence)
        results[name] = BootstrapResult(
            name, estimate, replicates[name], percentile_interval(replicates[name], estimate, confidence), bca, z0, a
        )
    return results


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
