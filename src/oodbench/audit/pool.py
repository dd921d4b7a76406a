"""The unsupervised detector pool (fit-set-based, head-free) and the head-dependent logit scores reported beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.ensemble import IsolationForest

from .. import detectors
from ..core.errors import AuditError, DetectorError
from ..core.metrics import auroc
from ..core.outputs import Head, Outputs
from ._rows import features_only, relabel, sample_index, with_head
from .config import DEFAULT_POOL, ISOLATION_FOREST, AuditConfig

__all__ = [
    "IsolationForestScorer",
    "PoolMember",
    "FittedPool",
    "resolve_pool",
    "fit_pool",
    "LogitScores",
    "fit_logit_detectors",
    "pool_aurocs",
    "best_of",
    "knn_k_for",
]


class IsolationForestScorer(detectors.Detector):
    """Isolation Forest on penultimate features; score = scikit-learn's `score_samples` (higher = more normal).

    Not a registry detector: it belongs to the audit pool only, as a fit-set density reader that makes no
    Gaussian or neighbourhood assumption. The forest is grown on at most `max_fit_rows` fit rows (each tree sees
    `max_samples` of them anyway), so fitting on an ImageNet-size memory map stays cheap.
    """

    name = ISOLATION_FOREST
    requires = detectors.Requirements.of(fit=("features",), score=("features",))
    paper = detectors.Paper("Liu, Ting & Zhou, Isolation Forest", "ICDM 2008", "https://doi.org/10.1109/ICDM.2008.17")

    def __init__(
        self, n_estimators: int = 100, max_samples: int = 256, max_fit_rows: int = 20_000, seed: int = 0
    ) -> None:
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.max_fit_rows = max_fit_rows
        self.seed = seed

    def _validate_params(self) -> None:
        self._check_int(n_estimators=self.n_estimators, max_samples=self.max_samples, max_fit_rows=self.max_fit_rows)
        self._check_int(minimum=0, seed=self.seed)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        rng = np.random.default_rng(self.seed)
        rows = sample_index(len(fit_set), self.max_fit_rows, rng)
        features = np.asarray(fit_set.features[rows], dtype=np.float32)
        self.forest_ = IsolationForest(
            n_estimators=self.n_estimators,
            max_samples=min(self.max_samples, len(rows)),
            random_state=self.seed,
            n_jobs=1,
        ).fit(features)
        self.fit_rows_ = int(len(rows))

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return self.forest_.score_samples(np.asarray(chunk.features, dtype=np.float32)).astype(np.float64)


@dataclass(frozen=True)
class PoolMember:
    """One pool detector: registry name (or 'iforest') and its hyper-parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def create(self) -> detectors.Detector:
        """A new, unfitted detector with validated parameters."""
        if self.name == ISOLATION_FOREST:
            scorer = IsolationForestScorer(**dict(self.params))
            scorer.validate_params()
            return scorer
        return detectors.create(self.name, **dict(self.params))


def _check_head_free(name: str) -> None:
    """Pool members must read only the fit set's features/labels: the rule is about the fit set, not the head."""
    if name == ISOLATION_FOREST:
        return
    requires = detectors.get_class(name).requires
    needs = sorted((requires.fit | requires.score) - {"features", "labels"})
    if requires.head or needs:
        what = ", ".join((["head"] if requires.head else []) + needs)
        raise AuditError(
            f"pool detector {name!r} reads {what}; the pool holds fit-set-based feature detectors only "
            "(report head-dependent scores through logit_detectors instead)"
        )


def resolve_pool(config: AuditConfig) -> tuple[list[PoolMember], dict[str, str]]:
    """The pool to use and the default members left out (name -> reason); explicit pools must resolve fully."""
    registered = set(detectors.available()) | {ISOLATION_FOREST}
    members: list[PoolMember] = []
    missing: dict[str, str] = {}
    names = config.pool if config.pool is not None else DEFAULT_POOL
    for name in names:
        if name not in registered:
            if config.pool is not None:
                raise AuditError(
                    f"pool detector {name!r} is not registered; available: {', '.join(sorted(registered))}"
                )
            missing[name] = "not registered in this installation"
            continue
        _check_head_free(name)
        params = dict(config.pool_params.get(name, {}))
        if name == ISOLATION_FOREST:
            # The run's seed drives the forest too (an explicit `iforest.seed` parameter still wins).
            params.setdefault("seed", config.seed)
        members.append(PoolMember(name, params))
    return members, missing


@dataclass
class FittedPool:
    """Pool detectors fitted on one fit set; `skipped` holds members that could not be fitted, with the reason."""

    detectors: dict[str, detectors.Detector]
    skipped: dict[str, str]
    fit_rows: int

    def score(self, outputs: Outputs) -> dict[str, np.ndarray]:
        """Scores of every fitted pool detector (higher = more ID)."""
        view = features_only(outputs, labels=False)
        return {name: det.score(view) for name, det in self.detectors.items()}


def knn_k_for(num_fit_rows: int) -> int:
    """k for the k-NN pool member when none is given: n/1000 within [10, 1000] (the KNN paper's k=1000 for
    ImageNet's 1.28 M and k=50 for CIFAR's 50 k fit images; 10 for small sets such as the digits demo)."""
    return int(min(1000, max(10, num_fit_rows // 1000), max(1, num_fit_rows - 1)))


def _with_defaults(member: PoolMember, num_fit_rows: int) -> PoolMember:
    if member.name == "knn" and "k" not in member.params:
        return PoolMember(member.name, {**dict(member.params), "k": knn_k_for(num_fit_rows)})
    return member


def fit_pool(
    fit_set: Outputs, members: list[PoolMember], *, strict: bool = False, skipped: Mapping[str, str] | None = None
) -> FittedPool:
    """Fit each pool member on the fit set's features (and labels, relabelled 0..C'-1); failures skip unless strict."""
    # Contiguous labels: a fit set with a class removed (or one added) must look like any other labelled fit set.
    view = features_only(fit_set, labels=None if fit_set.labels is None else relabel(fit_set.labels)[0])
    fitted: dict[str, detectors.Detector] = {}
    reasons = dict(skipped or {})
    for member in members:
        member = _with_defaults(member, len(fit_set))
        try:
            fitted[member.name] = member.create().fit(view, None)
        except DetectorError as exc:
            if strict:
                raise AuditError(f"pool detector {member.name!r} cannot be fitted: {exc}") from exc
            reasons[member.name] = str(exc)
    if not fitted:
        detail = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no members"
        raise AuditError(f"no pool detector could be fitted on the fit set ({detail})")
    return FittedPool(fitted, reasons, len(fit_set))


def pool_aurocs(id_scores: Mapping[str, np.ndarray], ood_scores: Mapping[str, np.ndarray]) -> dict[str, float]:
    """AUROC (ID positive) of each scorer present in both mappings."""
    return {name: auroc(id_scores[name], ood_scores[name]) for name in id_scores if name in ood_scores}


def best_of(aurocs: Mapping[str, float]) -> tuple[str, float]:
    """The detector with the highest AUROC and that AUROC (ties: the alphabetically last name, reproducibly)."""
    name = max(aurocs, key=lambda k: (aurocs[k], k))
    return name, aurocs[name]


@dataclass
class LogitScores:
    """Head-dependent detectors fitted on the fit set; they read stored logits, or logits computed from `head`."""

    detectors: dict[str, detectors.Detector]
    skipped: dict[str, str]
    head: Head | None
    recompute: bool = False

    def score(self, outputs: Outputs) -> dict[str, np.ndarray]:
        """Scores of every fitted logit detector (logits from the head when recomputing or when none are stored)."""
        if not self.detectors:
            return {}
        if self.recompute or outputs.logits is None:
            if self.head is None:
                raise AuditError("logit detectors need stored logits or a head; these outputs have neither")
            view = with_head(outputs, self.head, labels=False)
        else:
            view = Outputs(features=outputs.features, logits=outputs.logits, check_finite=False)
        return {name: det.score(view) for name, det in self.detectors.items()}


def fit_logit_detectors(
    names: tuple[str, ...], fit_set: Outputs, head: Head | None, *, recompute: bool = False
) -> LogitScores:
    """Fit the named logit detectors; with `recompute` (or no stored logits) logits are computed from `head`.

    Fit-set logits are materialised only for detectors that read them (e.g. KL matching), so MSP/Energy on an
    ImageNet-size fit set never build a 1.28 M x C logit array.
    """
    if not names:
        return LogitScores({}, {}, head, recompute)
    if head is None and (recompute or fit_set.logits is None):
        return LogitScores({}, {name: "no logits stored and no head given" for name in names}, None, recompute)
    recompute = recompute or fit_set.logits is None
    with_logits: Outputs | None = None
    fitted: dict[str, detectors.Detector] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            detector = detectors.create(name)
            if "logits" in detector.requires.fit:
                if with_logits is None:
                    with_logits = with_head(fit_set, head) if recompute else fit_set
                view = with_logits
            else:
                view = Outputs(fit_set.features, None, fit_set.labels, check_finite=False)
            fitted[name] = detector.fit(view, head)
        except DetectorError as exc:
            skipped[name] = str(exc)
    return LogitScores(fitted, skipped, head, recompute)
