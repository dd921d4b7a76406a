"""ROC curve points under the metrics convention (ID positive, higher score = more ID, ties accepted)."""

from __future__ import annotations

import numpy as np

from ..core import metrics

__all__ = ["roc_curve"]


def roc_curve(id_scores: object, ood_scores: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds): at each distinct score t (descending) the shares of OOD and ID scores >= t, from (0, 0)."""
    ids = metrics.as_scores("id_scores", id_scores)
    ood = metrics.as_scores("ood_scores", ood_scores)
    thresholds = np.unique(np.concatenate([ids, ood]))[::-1]
    ids_sorted = np.sort(ids)
    ood_sorted = np.sort(ood)
    tpr = (ids.shape[0] - np.searchsorted(ids_sorted, thresholds, "left")) / ids.shape[0]
    fpr = (ood.shape[0] - np.searchsorted(ood_sorted, thresholds, "left")) / ood.shape[0]
    return np.r_[0.0, fpr], np.r_[0.0, tpr], np.r_[np.inf, thresholds]
