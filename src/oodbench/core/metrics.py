"""OOD detection metrics under one documented convention.

Convention (the Fi-ImageNet-1k paper's and most papers'): a score is *higher for more in-distribution* inputs and
ID is the **positive** class.

- ``fpr_at_tpr``: the threshold t is the largest value such that at least ``tpr`` (95%) of the ID scores
  are >= t; FPR is the fraction of OOD scores >= t. Ties at the threshold count as accepted (as ID).
- ``auroc``: probability that a random ID score exceeds a random OOD score, ties counted as one half.
- ``aupr_in``: average precision with ID as positive; ``aupr_out``: with OOD as positive (scores negated).

OpenOOD and pytorch-ood report FPR@95 with **OOD as the positive class** (threshold detects 95% of the
OOD set; FPR is the share of ID flagged as OOD). That is a different number; it is available, explicitly
named, as ``fpr_at_tpr_ood_positive``. All computation is float64.

The ``openood`` convention (``evaluate(..., convention="openood")``) is what OpenOOD v1.5's
``compute_all_metrics`` and pytorch-ood's ``OODMetrics`` report: FPR@95 with OOD positive; AUROC, which is the
same number in both conventions (the area under a ROC curve does not change when the classes swap roles and the
scores change sign); and AUPR-In/Out as the trapezoidal area under the precision-recall curve
(``aupr_trapezoid``), not average precision. Its rows are stored under ``openood.<metric>``
(`convention_metric`), so results of the two conventions never mix.

``fpr95`` names the FPR metric inside a computation whatever its ``tpr`` (the tables read it by that name); a
result file states the rate it used: its rows are named by `fpr_metric` (``fpr95`` at the default 0.95,
``fpr80`` at 0.8) and every label by `fpr_label` (``FPR@80``), so no number at another rate reads as FPR@95.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import numpy as np

from .errors import MetricError

__all__ = [
    "as_scores",
    "required_count",
    "threshold_at_tpr",
    "fpr_at_tpr",
    "fpr_at_tpr_ood_positive",
    "auroc",
    "aupr_in",
    "aupr_out",
    "average_precision",
    "aupr_trapezoid",
    "aupr_in_trapezoid",
    "aupr_out_trapezoid",
    "evaluate",
    "METRIC_NAMES",
    "CONVENTIONS",
    "check_convention",
    "convention_metric",
    "CONVENTION_NOTES",
    "DEFAULT_TPR",
    "tpr_percent",
    "fpr_metric",
    "fpr_label",
    "tpr_of_metric",
    "stated_tpr",
    "relabel_fpr",
    "convention_note",
]

METRIC_NAMES = ("fpr95", "auroc", "aupr_in", "aupr_out")
CONVENTIONS = ("oodbench", "openood")  # the first is the default everywhere
# One line per convention, for the notes of every table that shows its numbers.
CONVENTION_NOTES = {
    "oodbench": "Convention oodbench: ID is the positive class; FPR@95 is the share of OOD accepted at the threshold "
    "that accepts 95% of ID; AUPR is average precision.",
    "openood": "Convention openood (OpenOOD v1.5, pytorch-ood): OOD is the positive class; FPR@95 is the share of ID "
    "flagged as OOD at the threshold that flags 95% of OOD; AUPR is the trapezoidal area under the PR curve.",
}

DEFAULT_TPR = 0.95  # the FPR@95 of the literature; a run at another rate says so in its names and labels
_FPR_METRIC = re.compile(r"fpr(\d+(?:\.\d+)?)")


def tpr_percent(tpr: float) -> str:
    """The rate in percent as labels write it: ``95`` for 0.95, ``80`` for 0.8, ``97.5`` for 0.975."""
    return f"{round(100 * _check_rate(tpr), 6):g}"


def fpr_metric(tpr: float) -> str:
    """The stored name of the FPR metric at `tpr`: ``fpr95`` at 0.95 (the default), ``fpr80`` at 0.8."""
    return f"fpr{tpr_percent(tpr)}"


def fpr_label(tpr: float) -> str:
    """The displayed name of the FPR metric at `tpr`: ``FPR@95``, ``FPR@80``."""
    return f"FPR@{tpr_percent(tpr)}"


def tpr_of_metric(name: str) -> float | None:
    """The rate a stored FPR name states (``fpr80`` -> 0.8, ``openood.fpr80`` too); None for any other metric."""
    prefix = next((f"{c}." for c in CONVENTIONS[1:] if name.startswith(f"{c}.")), "")
    match = _FPR_METRIC.fullmatch(name[len(prefix) :])
    if match is None:
        return None
    rate = float(match.group(1)) / 100
    return rate if 0.0 < rate <= 1.0 else None


def stated_tpr(names: Iterable[str]) -> float | None:
    """The one rate the FPR names among `names` state (`tpr_of_metric`); None without an FPR name.

    Raises MetricError when they state several (results of evaluations at different rates mixed)."""
    rates = {rate for name in names if (rate := tpr_of_metric(name)) is not None}
    if len(rates) > 1:
        raise MetricError(f"FPRs at several rates mixed: {', '.join(fpr_label(r) for r in sorted(rates))}")
    return rates.pop() if rates else None


# The phrases of a label or note that state the FPR's rate: "FPR@95", "95% of (the) ID/OOD", "95% TPR".
_RATE_PHRASES = re.compile(r"FPR@95\b|\b95%(?= of (?:the )?(?:ID|OOD)\b| TPR\b)")


def relabel_fpr(text: str, tpr: float) -> str:
    """`text` written for FPR@95 restated at `tpr` (identity at 0.95); confidence levels ("95% CI") are kept."""
    pct = tpr_percent(tpr)
    if pct == "95":
        return text
    return _RATE_PHRASES.sub(lambda m: f"FPR@{pct}" if m.group(0).startswith("FPR") else f"{pct}%", text)


def convention_note(convention: str, tpr: float = DEFAULT_TPR) -> str:
    """The convention's note for a table of FPR values at `tpr` (`CONVENTION_NOTES` at 0.95)."""
    return relabel_fpr(CONVENTION_NOTES[check_convention(convention)], tpr)


def as_scores(name: str, scores: object) -> np.ndarray:
    """Validate a 1-D, non-empty, finite score array and return it as float64."""
    array = np.asarray(scores)
    if array.ndim != 1:
        raise MetricError(f"{name} must be a 1-D array of scores; got shape {array.shape}")
    if array.shape[0] == 0:
        raise MetricError(f"{name} is empty: a metric needs at least one score")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer) or array.dtype == bool):
        raise MetricError(f"{name} must be numeric; got dtype {array.dtype}")
    # float64 holds every integer of magnitude up to 2**53 exactly; beyond it two distinct scores could compare equal.
    wide_integers = np.issubdtype(array.dtype, np.integer) and array.dtype.itemsize > 4
    if wide_integers and ((array > 2**53) | (array < -(2**53))).any():
        raise MetricError(f"{name} holds integers beyond 2**53, which float64 cannot compare exactly; pass floats")
    array = array.astype(np.float64, copy=False)
    if not np.isfinite(array).all():
        raise MetricError(f"{name} contains NaN or inf ({int((~np.isfinite(array)).sum())} values)")
    return array


def _check_rate(tpr: float) -> float:
    if not (0.0 < float(tpr) <= 1.0):
        raise MetricError(f"tpr must lie in (0, 1]; got {tpr}")
    return float(tpr)


def required_count(tpr: float, n: int) -> int:
    """Smallest k with k / n >= tpr; rounding guards 0.95 * 100 = 95.00000000000001-style float noise."""
    return max(1, math.ceil(round(tpr * n, 9)))


def threshold_at_tpr(id_scores: object, tpr: float = 0.95) -> float:
    """Largest threshold t such that at least `tpr` of the ID scores are >= t (the k-th largest ID score)."""
    ids = as_scores("id_scores", id_scores)
    k = required_count(_check_rate(tpr), ids.shape[0])
    # k-th largest = element n-k of the ascending order; partition is O(n).
    return float(np.partition(ids, ids.shape[0] - k)[ids.shape[0] - k])


def fpr_at_tpr(id_scores: object, ood_scores: object, tpr: float = 0.95) -> float:
    """Fraction of OOD scores >= the threshold that accepts at least `tpr` of ID (ID positive, ties accepted)."""
    threshold = threshold_at_tpr(id_scores, tpr)
    ood = as_scores("ood_scores", ood_scores)
    return float(np.count_nonzero(ood >= threshold)) / ood.shape[0]


def fpr_at_tpr_ood_positive(id_scores: object, ood_scores: object, tpr: float = 0.95) -> float:
    """OpenOOD/pytorch-ood convention: share of ID flagged as OOD when `tpr` of OOD is flagged (OOD positive)."""
    ids = as_scores("id_scores", id_scores)
    ood = as_scores("ood_scores", ood_scores)
    return fpr_at_tpr(-ood, -ids, tpr)


def auroc(id_scores: object, ood_scores: object) -> float:
    """Area under the ROC curve with ID positive; ties between an ID and an OOD score count one half."""
    ids = as_scores("id_scores", id_scores)
    ood = np.sort(as_scores("ood_scores", ood_scores))
    below = np.searchsorted(ood, ids, side="left").astype(np.int64)
    not_above = np.searchsorted(ood, ids, side="right").astype(np.int64)
    # 2 * (#less + #equal / 2) summed in exact integers, halved only at the end.
    twice_wins = int(below.sum()) + int(not_above.sum())
    return twice_wins / (2.0 * ids.shape[0] * ood.shape[0])


def average_precision(positive_scores: np.ndarray, negative_scores: np.ndarray) -> float:
    """Average precision (step-wise, as scikit-learn) for the given positive and negative score sets."""
    scores = np.concatenate([positive_scores, negative_scores])
    is_positive = np.concatenate([np.ones(positive_scores.shape[0], bool), np.zeros(negative_scores.shape[0], bool)])
    order = np.argsort(-scores, kind="stable")
    scores, is_positive = scores[order], is_positive[order]
    true_pos = np.cumsum(is_positive, dtype=np.int64)
    false_pos = np.arange(1, scores.shape[0] + 1, dtype=np.int64) - true_pos
    # Only the last position of each run of tied scores is an operating point.
    last_of_run = np.r_[scores[1:] != scores[:-1], True]
    true_pos, false_pos = true_pos[last_of_run], false_pos[last_of_run]
    precision = true_pos / (true_pos + false_pos)
    recall_steps = np.diff(np.r_[0, true_pos]) / positive_scores.shape[0]
    return float(np.sum(recall_steps * precision))


def aupr_in(id_scores: object, ood_scores: object) -> float:
    """Average precision with ID as the positive class (higher score = more ID)."""
    return average_precision(as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores))


def aupr_out(id_scores: object, ood_scores: object) -> float:
    """Average precision with OOD as the positive class (scores negated)."""
    return average_precision(-as_scores("ood_scores", ood_scores), -as_scores("id_scores", id_scores))


def aupr_trapezoid(positive_scores: np.ndarray, negative_scores: np.ndarray) -> float:
    """Trapezoidal area under the precision-recall curve (higher score = positive), as OpenOOD and pytorch-ood.

    The curve is scikit-learn's ``precision_recall_curve``: one point per distinct score (ties enter together),
    plus the end point (recall 0, precision 1); the area is ``sklearn.metrics.auc(recall, precision)``. Points at
    recall 1 add no area, so the curve's truncation at full recall in old scikit-learn versions does not matter.
    """
    scores = np.concatenate([positive_scores, negative_scores])
    is_positive = np.concatenate([np.ones(positive_scores.shape[0], bool), np.zeros(negative_scores.shape[0], bool)])
    order = np.argsort(-scores, kind="stable")
    scores, is_positive = scores[order], is_positive[order]
    true_pos = np.cumsum(is_positive, dtype=np.int64)
    accepted = np.arange(1, scores.shape[0] + 1, dtype=np.int64)
    last_of_run = np.r_[scores[1:] != scores[:-1], True]
    true_pos, accepted = true_pos[last_of_run], accepted[last_of_run]
    # Start at (recall 0, precision 1); exact integer counts, one division per point.
    recall = np.r_[0.0, true_pos / positive_scores.shape[0]]
    precision = np.r_[1.0, true_pos / accepted]
    return float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1])) / 2.0)


def aupr_in_trapezoid(id_scores: object, ood_scores: object) -> float:
    """Trapezoidal AUPR with ID as the positive class (OpenOOD's AUPR_IN)."""
    return aupr_trapezoid(as_scores("id_scores", id_scores), as_scores("ood_scores", ood_scores))


def aupr_out_trapezoid(id_scores: object, ood_scores: object) -> float:
    """Trapezoidal AUPR with OOD as the positive class, scores negated (OpenOOD's AUPR_OUT)."""
    return aupr_trapezoid(-as_scores("ood_scores", ood_scores), -as_scores("id_scores", id_scores))


def check_convention(convention: str) -> str:
    """The convention's name, or a MetricError naming the known ones."""
    if convention not in CONVENTIONS:
        raise MetricError(f"unknown metric convention {convention!r}; known: {', '.join(CONVENTIONS)}")
    return convention


def convention_metric(metric: str, convention: str) -> str:
    """The name a metric's rows carry under a convention: ``fpr95`` (oodbench), ``openood.fpr95`` (openood)."""
    return metric if check_convention(convention) == CONVENTIONS[0] else f"{convention}.{metric}"


def evaluate(
    id_scores: object, ood_scores: object, tpr: float = 0.95, convention: str = "oodbench"
) -> dict[str, float]:
    """All metrics for one (ID, OOD) pair: fpr95, auroc, aupr_in, aupr_out (fractions, not %) in a convention."""
    ids = as_scores("id_scores", id_scores)
    ood = as_scores("ood_scores", ood_scores)
    if check_convention(convention) == "openood":
        return {
            "fpr95": fpr_at_tpr_ood_positive(ids, ood, tpr),
            "auroc": auroc(ids, ood),
            "aupr_in": aupr_in_trapezoid(ids, ood),
            "aupr_out": aupr_out_trapezoid(ids, ood),
        }
    return {
        "fpr95": fpr_at_tpr(ids, ood, tpr),
        "auroc": auroc(ids, ood),
        "aupr_in": aupr_in(ids, ood),
        "aupr_out": aupr_out(ids, ood),
    }
