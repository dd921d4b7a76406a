"""Leave-class-out retraining of the linear head on cached features: the cheap analogue of retraining without a class.

The backbone is left as it is (it still saw the class during training); only the head is refitted as a
multinomial logistic-regression probe on the fit set minus the suspect class(es), and the logit-based detectors
are re-scored with the new head's logits.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from ..core.errors import AuditError
from ..core.outputs import Head, Outputs
from ._rows import relabel, with_head
from .config import AuditConfig
from .pool import fit_logit_detectors, pool_aurocs

__all__ = ["logistic_regression_head", "head_without", "LeaveClassOutResult", "leave_class_out", "balanced_rows"]


def balanced_rows(labels: np.ndarray, max_per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted row indices with at most `max_per_class` rows of each label (uniformly drawn)."""
    labels = np.asarray(labels)
    order = rng.permutation(labels.shape[0])
    shuffled = labels[order]
    # Rank of each row within its class in the shuffled order, computed without a Python loop over rows.
    by_class = np.argsort(shuffled, kind="stable")
    sorted_labels = shuffled[by_class]
    starts = np.r_[0, np.flatnonzero(sorted_labels[1:] != sorted_labels[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, sorted_labels.shape[0]]))
    rank = np.empty_like(by_class)
    rank[by_class] = np.arange(by_class.shape[0]) - run_start
    return np.sort(order[rank < max_per_class])


def logistic_regression_head(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    c: float = 1.0,
    max_per_class: int | None = 500,
    max_iter: int = 1000,
    seed: int = 0,
) -> Head:
    """A scikit-learn multinomial logistic-regression head (C = number of distinct labels, in sorted label order).

    Not the torch linear probe of `oodbench.extract.probe.train_probe` (the classifier head of a frozen backbone):
    this one is the audit's small class-balanced head for leave-class-out retraining.

    Features are standardised for the solver and the scaling is folded back into the returned weights, so the
    head applies to raw features: logits = features @ W.T + b.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if classes.shape[0] < 2:
        raise AuditError(f"a probe needs at least 2 classes; the labels hold {classes.shape[0]}")
    rng = np.random.default_rng(seed)
    rows = balanced_rows(labels, max_per_class, rng) if max_per_class else np.arange(labels.shape[0])
    x = np.asarray(features[rows], dtype=np.float64)
    y = np.searchsorted(classes, labels[rows])
    scaler = StandardScaler().fit(x)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    model = LogisticRegression(C=c, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit((x - scaler.mean_) / scale, y)
    coef, intercept = model.coef_, model.intercept_
    if classes.shape[0] == 2:
        # scikit-learn stores one row for binary problems: logit(class 1) - logit(class 0).
        coef = np.vstack([-coef / 2, coef / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    weight = coef / scale
    bias = intercept - weight @ scaler.mean_
    return Head(weight.astype(np.float64), bias.astype(np.float64))


def head_without(fit_set: Outputs, exclude: Sequence[int], config: AuditConfig) -> tuple[Head, np.ndarray, np.ndarray]:
    """A probe head trained on a class-balanced sample of the fit rows outside `exclude`: (head, sampled rows, kept classes).

    Only the sampled rows' features are read, so a memory-mapped ImageNet-size fit set is never loaded whole.
    """
    labels = np.asarray(fit_set.labels)
    keep = ~np.isin(labels, exclude)
    if not keep.any():
        raise AuditError("excluding these classes leaves no fit rows to train a probe on")
    kept_labels, kept_classes = relabel(labels[keep])
    if kept_classes.shape[0] < 2:
        raise AuditError(
            f"after excluding {tuple(exclude)} only class {kept_classes.tolist()} is left; a head needs two"
        )
    rng = np.random.default_rng(config.seed)
    picked = np.flatnonzero(keep)[balanced_rows(kept_labels, config.probe_max_per_class, rng)]
    probe = logistic_regression_head(
        np.asarray(fit_set.features[picked]), labels[picked], c=config.probe_c, max_per_class=None, seed=config.seed
    )
    return probe, picked, kept_classes


@dataclass
class LeaveClassOutResult:
    """Logit-detector AUROCs with the original head and with a head retrained without the excluded classes."""

    excluded: tuple[int, ...]
    kept_classes: tuple[int, ...]
    before: dict[str, float]
    after: dict[str, float]
    probe_accuracy: float | None
    probe_rows: int
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return asdict(self)


def leave_class_out(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    head: Head | None,
    exclude: Sequence[int],
    *,
    config: AuditConfig | None = None,
) -> LeaveClassOutResult:
    """Retrain the head without `exclude` on cached fit features and re-score the logit detectors on ID test and OOD."""
    config = config or AuditConfig()
    if fit_set.labels is None:
        raise AuditError("leave-class-out needs fit-set labels")
    exclude = tuple(int(c) for c in exclude)
    names = config.logit_detectors
    before: dict[str, float] = {}
    skipped: dict[str, str] = {}
    if head is not None or fit_set.logits is not None:
        original = fit_logit_detectors(names, fit_set, head)
        skipped.update({f"{k} (original head)": v for k, v in original.skipped.items()})
        if original.detectors and (id_test.logits is not None or head is not None):
            before = pool_aurocs(original.score(id_test), original.score(ood))
    probe, picked, kept_classes = head_without(fit_set, exclude, config)
    fit_view = Outputs(
        features=fit_set.features[picked],
        labels=np.searchsorted(kept_classes, fit_set.labels[picked]),
        check_finite=False,
    )
    retrained = fit_logit_detectors(names, fit_view, probe, recompute=True)
    skipped.update({f"{k} (retrained head)": v for k, v in retrained.skipped.items()})
    after = pool_aurocs(retrained.score(id_test), retrained.score(ood)) if retrained.detectors else {}
    accuracy = None
    if id_test.labels is not None:
        in_kept = np.isin(id_test.labels, kept_classes)
        if in_kept.any():
            predicted = with_head(id_test.subset(np.flatnonzero(in_kept)), probe).logits.argmax(axis=1)
            accuracy = float(np.mean(kept_classes[predicted] == id_test.labels[in_kept]))
    return LeaveClassOutResult(
        exclude, tuple(int(c) for c in kept_classes), before, after, accuracy, int(len(picked)), skipped
    )
