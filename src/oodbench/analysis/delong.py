"""DeLong's test for AUROC (DeLong, DeLong & Clarke-Pearson 1988), paired over detectors scored on the same images.

The AUROC is a two-sample U-statistic. Its structural components are, per ID image, the share of OOD images it
beats (ties ½) and, per OOD image, the share of ID images that beat it. Their sample covariances across
detectors give the covariance of the AUROCs: Var = S_id / n_id + S_ood / n_ood. Components come from sorted
searches (O(N log N), after Sun & Xu 2014), never from the n_id × n_ood comparison matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..core import metrics
from ..core.errors import AnalysisError
from .intervals import Interval, normal_interval
from .records import plain_dict

__all__ = ["structural_components", "delong_covariance", "delong_interval", "DeLongResult", "delong_test"]


def _twice_wins(id_scores: object, ood_scores: object) -> tuple[np.ndarray, np.ndarray]:
    """Integer 2·(wins + ties/2) per ID score (over OOD) and per OOD score (over ID): exact components × 2m, × 2n."""
    ids = metrics.as_scores("id_scores", id_scores)
    ood = metrics.as_scores("ood_scores", ood_scores)
    ood_sorted = np.sort(ood)
    ids_sorted = np.sort(ids)
    id_twice = np.searchsorted(ood_sorted, ids, "left") + np.searchsorted(ood_sorted, ids, "right")
    n = ids.shape[0]
    ood_twice = (n - np.searchsorted(ids_sorted, ood, "right")) + (n - np.searchsorted(ids_sorted, ood, "left"))
    return id_twice.astype(np.int64), ood_twice.astype(np.int64)


def structural_components(id_scores: object, ood_scores: object) -> tuple[np.ndarray, np.ndarray]:
    """(V_id (n_id,), V_ood (n_ood,)): share of OOD each ID score beats; share of ID that beats each OOD score (ties ½)."""
    id_twice, ood_twice = _twice_wins(id_scores, ood_scores)
    return id_twice / (2.0 * ood_twice.shape[0]), ood_twice / (2.0 * id_twice.shape[0])


def delong_covariance(id_scores: Sequence[object], ood_scores: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """AUROCs (K,) and their DeLong covariance (K, K) for K detectors scored on the same ID and OOD images."""
    if len(id_scores) != len(ood_scores) or not id_scores:
        raise AnalysisError("give one ID and one OOD score array per detector")
    components = [_twice_wins(i, o) for i, o in zip(id_scores, ood_scores, strict=False)]
    n_id = {c[0].shape[0] for c in components}
    n_ood = {c[1].shape[0] for c in components}
    if len(n_id) != 1 or len(n_ood) != 1:
        raise AnalysisError(
            f"paired detectors must score the same images; got ID sizes {sorted(n_id)} and OOD sizes {sorted(n_ood)}"
        )
    n, m = n_id.pop(), n_ood.pop()
    if n < 2 or m < 2:
        raise AnalysisError("DeLong's variance needs at least 2 ID and 2 OOD scores")
    # The AUROC itself from exact integer sums (identical to metrics.auroc); covariances from the components.
    aurocs = np.array([int(c[0].sum()) for c in components]) / (2.0 * n * m)
    v_id = np.stack([c[0] for c in components]) / (2.0 * m)  # (K, n)
    v_ood = np.stack([c[1] for c in components]) / (2.0 * n)  # (K, m)
    cov = np.atleast_2d(np.cov(v_id, ddof=1)) / n + np.atleast_2d(np.cov(v_ood, ddof=1)) / m
    return aurocs, cov


def delong_interval(id_scores: object, ood_scores: object, confidence: float = 0.95) -> Interval:
    """AUROC with DeLong's normal-approximation interval, clipped to [0, 1]."""
    aurocs, cov = delong_covariance([id_scores], [ood_scores])
    return normal_interval(float(aurocs[0]), math.sqrt(max(float(cov[0, 0]), 0.0)), confidence, "delong", (0.0, 1.0))


@dataclass(frozen=True)
class DeLongResult:
    """Paired comparison of two detectors' AUROC on the same images."""

    detector_a: str
    detector_b: str
    auroc_a: float
    auroc_b: float
    difference: float  # auroc_a - auroc_b
    se: float
    z: float
    p_value: float
    low: float
    high: float
    confidence: float
    correlation: float
    n_id: int
    n_ood: int

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON (z may be ±inf and the correlation NaN: they become null)."""
        return plain_dict(self)


def delong_test(
    id_a: object,
    ood_a: object,
    id_b: object,
    ood_b: object,
    *,
    confidence: float = 0.95,
    names: tuple[str, str] = ("a", "b"),
) -> DeLongResult:
    """Two-sided DeLong test of AUROC(a) = AUROC(b) for two detectors scored on the same ID and OOD images."""
    aurocs, cov = delong_covariance([id_a, id_b], [ood_a, ood_b])
    difference = float(aurocs[0] - aurocs[1])
    variance = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    se = math.sqrt(max(variance, 0.0))
    # Rounding can leave a tiny positive variance for identical detectors; treat it as zero relative to the terms.
    if se <= 1e-12 * max(1.0, math.sqrt(abs(cov[0, 0]) + abs(cov[1, 1]))):
        se = 0.0
    if se == 0.0 and difference == 0 and cov[0, 0] <= 0 and cov[1, 1] <= 0:
        # Neither AUROC varies over the images (both separate perfectly, e.g. two AUROCs of 1.0): the test has no
        # variance to compare the difference with, so z and p are undefined (NaN), not "no difference" (p = 1).
        z = p_value = math.nan
    elif se == 0.0:
        # Variable AUROCs whose difference never varies: identical up to a constant, so exactly zero (p = 1) or
        # certain (p = 0).
        z = 0.0 if difference == 0 else math.copysign(math.inf, difference)
        p_value = 1.0 if difference == 0 else 0.0
    else:
        z = difference / se
        p_value = float(2 * stats.norm.sf(abs(z)))
    interval = normal_interval(difference, se, confidence, "delong", (-1.0, 1.0))
    scale = math.sqrt(max(cov[0, 0], 0.0) * max(cov[1, 1], 0.0))
    correlation = float(cov[0, 1] / scale) if scale > 0 else float("nan")
    # delong_covariance has validated the arrays and checked that both detectors score the same images.
    return DeLongResult(
        names[0],
        names[1],
        float(aurocs[0]),
        float(aurocs[1]),
        difference,
        se,
        z,
        p_value,
        interval.low,
        interval.high,
        float(confidence),
        correlation,
        int(np.shape(id_a)[0]),
        int(np.shape(ood_a)[0]),
    )
