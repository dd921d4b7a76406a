"""The leak fingerprint of one split: an out-of-fold supervised linear reader against the best unsupervised detector.

A split is (model, fit set, ID test set, designated OOD set) in the penultimate-embedding space. If a supervised
linear reader separates ID test from OOD almost perfectly (OracleLDA high) while every detector fitted on the fit
set fails (best unsupervised AUROC low), the OOD images look in-distribution *to the fit set* although they are
separable: the signature of an OOD class whose training data sits inside the fit set.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.model_selection import StratifiedKFold

from ..core.errors import AuditError
from ..core.metrics import auroc
from ..core.outputs import Head, Outputs
from ._rows import sample_index
from .config import AuditConfig
from .pool import FittedPool, LogitScores, best_of, fit_logit_detectors, fit_pool, pool_aurocs, resolve_pool

__all__ = [
    "OracleLDA",
    "oracle_lda",
    "oracle_lda_null",
    "Fingerprint",
    "fingerprint",
    "PoolState",
    "prepare_pool",
    "rescore_pool",
    "check_split",
]


@dataclass(frozen=True)
class OracleLDA:
    """Out-of-fold AUROC of a shrinkage-LDA reader separating ID test (positive) from OOD, per fold and summarised."""

    auroc: float
    fold_aurocs: tuple[float, ...]
    n_id: int
    n_ood: int

    @property
    def std(self) -> float:
        """Standard deviation of the fold AUROCs (population)."""
        return float(np.std(self.fold_aurocs))

    @property
    def low(self) -> float:
        """Lowest fold AUROC."""
        return float(min(self.fold_aurocs))

    @property
    def high(self) -> float:
        """Highest fold AUROC."""
        return float(max(self.fold_aurocs))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return {
            "auroc": self.auroc,
            "fold_aurocs": list(self.fold_aurocs),
            "std": self.std,
            "low": self.low,
            "high": self.high,
            "n_id": self.n_id,
            "n_ood": self.n_ood,
        }


def oracle_lda(
    id_features: np.ndarray,
    ood_features: np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
    max_rows_per_side: int | None = 20_000,
) -> OracleLDA:
    """Out-of-fold AUROC of LDA (lsqr, Ledoit-Wolf shrinkage) reading ID (positive) vs OOD; mean over stratified folds.

    Every AUROC is computed on rows the reader never saw: with n ≲ D an in-sample linear reader separates
    almost any two sets, so an in-sample number would say nothing about the embedding.
    """
    rng = np.random.default_rng(seed)
    id_rows = sample_index(len(id_features), max_rows_per_side, rng)
    ood_rows = sample_index(len(ood_features), max_rows_per_side, rng)
    x_id, x_ood = (
        np.asarray(id_features[id_rows], dtype=np.float64),
        np.asarray(ood_features[ood_rows], dtype=np.float64),
    )
    if x_id.ndim != 2 or x_ood.ndim != 2 or x_id.shape[1] != x_ood.shape[1]:
        raise AuditError(f"ID and OOD features must be 2-D with the same width; got {x_id.shape} and {x_ood.shape}")
    smaller = min(len(x_id), len(x_ood))
    if smaller < folds:
        raise AuditError(
            f"out-of-fold reading with {folds} folds needs at least {folds} rows per side; the smaller side has {smaller}"
        )
    x = np.concatenate([x_id, x_ood])
    y = np.concatenate([np.ones(len(x_id), dtype=np.int64), np.zeros(len(x_ood), dtype=np.int64)])
    fold_aurocs = _out_of_fold_aurocs(x, y, folds, seed)
    return OracleLDA(float(np.mean(fold_aurocs)), tuple(float(a) for a in fold_aurocs), len(x_id), len(x_ood))


def oracle_lda_null(
    a_features: np.ndarray,
    b_features: np.ndarray,
    *,
    permutations: int = 19,
    folds: int = 5,
    seed: int = 0,
    max_rows_per_side: int | None = 20_000,
) -> np.ndarray:
    """OracleLDA of `a` vs `b` with the side labels permuted (sizes kept): its distribution when both sets are drawn
    from one distribution, on these very rows (the out-of-fold reader's small negative bias included)."""
    rng = np.random.default_rng(seed)
    a_rows = sample_index(len(a_features), max_rows_per_side, rng)
    b_rows = sample_index(len(b_features), max_rows_per_side, rng)
    x = np.concatenate([np.asarray(a_features[a_rows], np.float64), np.asarray(b_features[b_rows], np.float64)])
    y = np.concatenate([np.ones(len(a_rows), dtype=np.int64), np.zeros(len(b_rows), dtype=np.int64)])
    if min(len(a_rows), len(b_rows)) < folds:
        raise AuditError(f"a permutation null with {folds} folds needs at least {folds} rows per side")
    return np.array(
        [float(np.mean(_out_of_fold_aurocs(x, rng.permutation(y), folds, seed + 1 + i))) for i in range(permutations)]
    )


def _out_of_fold_aurocs(x: np.ndarray, y: np.ndarray, folds: int, seed: int) -> list[float]:
    """Per-fold AUROC (class 1 positive) of a shrinkage-LDA reader trained on the other folds."""
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    fold_aurocs = []
    for train, held_out in splitter.split(x, y):
        reader = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")
        with warnings.catch_warnings():
            # Constant feature columns (dead ReLUs) make the standardisation inside Ledoit-Wolf warn; harmless.
            warnings.simplefilter("ignore", RuntimeWarning)
            reader.fit(x[train], y[train])
            margin = reader.decision_function(x[held_out])  # > 0 leans to class 1 = ID
        if not np.isfinite(margin).all():
            raise AuditError("the LDA reader produced non-finite scores; check the features for degenerate columns")
        held_y = y[held_out]
        fold_aurocs.append(auroc(margin[held_y == 1], margin[held_y == 0]))
    return fold_aurocs


@dataclass
class PoolState:
    """The pool and logit detectors fitted once on a fit set, with their ID-test scores (reused across OOD sets)."""

    pool: FittedPool
    logits: LogitScores
    id_pool_scores: dict[str, np.ndarray]
    id_logit_scores: dict[str, np.ndarray]
    missing_defaults: dict[str, str]


def prepare_pool(
    fit_set: Outputs, id_test: Outputs, head: Head | None, config: AuditConfig, *, recompute_logits: bool = False
) -> PoolState:
    """Fit the unsupervised pool and the logit detectors on the fit set and score the ID test set once."""
    members, missing = resolve_pool(config)
    pool = fit_pool(fit_set, members, strict=config.pool is not None)
    logits = fit_logit_detectors(config.logit_detectors, fit_set, head, recompute=recompute_logits)
    id_logit = logits.score(id_test) if logits.detectors else {}
    return PoolState(pool, logits, pool.score(id_test), id_logit, missing)


def rescore_pool(state: PoolState, id_test: Outputs) -> PoolState:
    """The same fitted pool and logit detectors with the ID-test scores of another ID test set."""
    id_logit = state.logits.score(id_test) if state.logits.detectors else {}
    return PoolState(state.pool, state.logits, state.pool.score(id_test), id_logit, dict(state.missing_defaults))


@dataclass
class Fingerprint:
    """The fingerprint numbers of one split and whether the firing rule fires."""

    oracle: OracleLDA
    pool_aurocs: dict[str, float]
    logit_aurocs: dict[str, float]
    best_detector: str
    best_auroc: float
    fires: bool
    oracle_threshold: float
    collapse_threshold: float
    n_fit: int
    n_id: int
    n_ood: int
    num_features: int
    pool_skipped: dict[str, str] = field(default_factory=dict)
    logit_skipped: dict[str, str] = field(default_factory=dict)

    @property
    def oracle_straddles(self) -> bool:
        """True when the fold range of OracleLDA contains the oracle threshold (the rule hinges on fold noise)."""
        return self.oracle.low < self.oracle_threshold <= self.oracle.high

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        data = asdict(self)
        data["oracle"] = self.oracle.to_dict()
        data["oracle_straddles"] = self.oracle_straddles
        return data


def check_split(fit_set: Outputs, id_test: Outputs, ood: Outputs) -> None:
    """Raise AuditError unless the three sets are non-empty and share one feature width."""
    for name, outputs in (("fit set", fit_set), ("ID test set", id_test), ("OOD set", ood)):
        if len(outputs) == 0:
            raise AuditError(f"the {name} is empty")
    if not fit_set.num_features == id_test.num_features == ood.num_features:
        raise AuditError(
            f"feature widths differ: fit D={fit_set.num_features}, ID test D={id_test.num_features}, OOD D={ood.num_features}; "
            "all three must come from the same model"
        )


def fingerprint(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    head: Head | None = None,
    *,
    config: AuditConfig | None = None,
    state: PoolState | None = None,
    ood_pool_scores: Mapping[str, np.ndarray] | None = None,
) -> Fingerprint:
    """OracleLDA (out-of-fold), the best unsupervised pool AUROC, flagged logit AUROCs, and the firing rule.

    ``ood_pool_scores``: the scores ``state.pool.score(ood)``, when the caller has them already.
    """
    config = config or AuditConfig()
    check_split(fit_set, id_test, ood)
    state = state or prepare_pool(fit_set, id_test, head, config)
    if any(len(scores) != len(id_test) for scores in state.id_pool_scores.values()):
        raise AuditError(
            "the pool state was prepared for another ID test set (row counts differ); use prepare_pool or rescore_pool"
        )
    oracle = oracle_lda(
        id_test.features, ood.features, folds=config.folds, seed=config.seed, max_rows_per_side=config.max_rows_per_side
    )
    pool = pool_aurocs(state.id_pool_scores, state.pool.score(ood) if ood_pool_scores is None else ood_pool_scores)
    logit = pool_aurocs(state.id_logit_scores, state.logits.score(ood)) if state.logits.detectors else {}
    best_detector, best = best_of(pool)
    fires = oracle.auroc >= config.oracle_threshold and best < config.collapse_threshold
    skipped = {**state.missing_defaults, **state.pool.skipped}
    return Fingerprint(
        oracle,
        pool,
        logit,
        best_detector,
        best,
        bool(fires),
        config.oracle_threshold,
        config.collapse_threshold,
        len(fit_set),
        len(id_test),
        len(ood),
        fit_set.num_features,
        skipped,
        dict(state.logits.skipped),
    )
