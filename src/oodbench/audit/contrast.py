"""Fit-set-exclusion contrast: refit the unsupervised pool without the suspect data and see whether detection recovers.

Two ways to choose what to exclude:

- ``label``: the suspect class(es) of the fit set, given or found automatically as the fit classes whose
  (cosine) class means are nearest to most OOD images. ID test is unchanged, so excluding a class the ID test
  also contains costs the refit pool on those ID images.
- ``nearest``: for label-noise cases (an OOD set drawn from inside the ID data) the fit rows nearest (cosine, as
  k-NN detection and the suspect search read features) to the OOD images. This is cross-fitted: the OOD set is split in two halves, the neighbours of one half are excluded and
  the other half is scored (and vice versa), so a recovery cannot come from removing each scored image's own
  neighbours.

A leak is confirmed when the pool had collapsed (best AUROC below ``collapse_threshold``) and the best refit-pool
AUROC reaches ``collapse_threshold + recovery_margin``; a pool that had not collapsed cannot "recover".
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.errors import AuditError
from ..core.metrics import auroc
from ..core.outputs import Head, Outputs
from ._rows import sample_index, select_rows
from .config import AuditConfig
from .fingerprint import OracleLDA, PoolState, oracle_lda, oracle_lda_null, prepare_pool
from .neighbours import class_means, nearest_class_mean, nearest_rows
from .pool import FittedPool, PoolMember, best_of, fit_pool, pool_aurocs

__all__ = ["ContrastResult", "exclusion_contrast", "find_suspects"]

Mode = Literal["label", "nearest"]


@dataclass
class ContrastResult:
    """What was excluded, the pool AUROCs before and after refitting, and whether detection recovered."""

    mode: str
    suspects: tuple[int, ...]
    suspect_shares: dict[int, float]
    suspects_auto: bool
    removed_rows: int
    remaining_rows: int
    before: dict[str, float]
    after: dict[str, float]
    best_before: float
    best_after: float
    best_after_detector: str
    recovery_threshold: float
    recovered: bool
    partial: bool
    identity: OracleLDA | None = None
    note: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    identity_class: int | None = None
    identity_null: tuple[float, ...] = ()
    identity_limit: float | None = None

    @property
    def identity_distinct(self) -> bool:
        """True when the identity reading exceeds its permutation null's limit: the OOD images are not the excluded
        class (computed on the automatic contrast only, where the excluded class was chosen by proximity)."""
        return (
            self.identity is not None and self.identity_limit is not None and self.identity.auroc > self.identity_limit
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        data = asdict(self)
        data["identity_distinct"] = self.identity_distinct
        data["identity"] = None if self.identity is None else self.identity.to_dict()
        data["suspect_shares"] = {str(k): v for k, v in self.suspect_shares.items()}
        return data


def find_suspects(
    fit_set: Outputs, ood: Outputs, *, mass: float = 0.5, max_suspects: int = 3
) -> tuple[tuple[int, ...], dict[int, float]]:
    """Fit classes nearest (cosine to class means) to most OOD images: top shares until `mass` is covered."""
    if fit_set.labels is None:
        raise AuditError("finding suspect classes needs fit-set labels; give suspects explicitly or use mode='nearest'")
    means, classes = class_means(fit_set.features, fit_set.labels)
    nearest = nearest_class_mean(ood.features, means)
    shares = np.bincount(nearest, minlength=classes.shape[0]) / len(ood)
    order = np.argsort(-shares, kind="stable")
    chosen: list[int] = []
    covered = 0.0
    for position in order[:max_suspects]:
        if shares[position] <= 0:
            break
        chosen.append(int(classes[position]))
        covered += float(shares[position])
        if covered >= mass:
            break
    share_map = {int(classes[p]): float(shares[p]) for p in order if shares[p] > 0}
    return tuple(chosen), share_map


def _members(pool: FittedPool) -> list[PoolMember]:
    """The fitted pool's members with the exact parameters they were fitted with."""
    return [PoolMember(name, det.get_params()) for name, det in pool.detectors.items()]


def _refit(fit_set: Outputs, keep: np.ndarray, members: list[PoolMember], scratch: Path) -> FittedPool:
    """The pool refitted on the kept fit rows."""
    return fit_pool(select_rows(fit_set, keep, scratch=scratch, logits=False), members)


def _recovery(before: float, after: float, config: AuditConfig) -> tuple[bool, bool]:
    """(recovered, partial): only a collapsed pool (before < collapse threshold) can recover."""
    if before >= config.collapse_threshold:
        return False, False
    recovered = after >= config.recovery_threshold
    return recovered, not recovered and after >= config.collapse_threshold


def exclusion_contrast(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    head: Head | None = None,
    *,
    mode: Mode = "label",
    suspects: Sequence[int] | None = None,
    config: AuditConfig | None = None,
    state: PoolState | None = None,
    ood_pool_scores: Mapping[str, np.ndarray] | None = None,
) -> ContrastResult:
    """Refit the pool on the fit set minus the suspect data and re-score ID test and OOD (see module docstring).

    ``ood_pool_scores``: the scores ``state.pool.score(ood)``, when the caller has them already.
    """
    config = config or AuditConfig()
    if mode not in ("label", "nearest"):
        raise AuditError(f"unknown contrast mode {mode!r}; use 'label' or 'nearest'")
    state = state or prepare_pool(fit_set, id_test, head, config)
    members = _members(state.pool)
    ood_scores = state.pool.score(ood) if ood_pool_scores is None else ood_pool_scores
    if mode == "label":
        return _by_label(fit_set, id_test, ood, suspects, config, state, members, ood_scores)
    return _by_nearest(fit_set, id_test, ood, config, state, members, ood_scores)


def _by_label(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    suspects: Sequence[int] | None,
    config: AuditConfig,
    state: PoolState,
    members: list[PoolMember],
    ood_scores: Mapping[str, np.ndarray],
) -> ContrastResult:
    if fit_set.labels is None:
        raise AuditError("the label contrast needs fit-set labels; use mode='nearest' for an unlabelled fit set")
    before = pool_aurocs(state.id_pool_scores, ood_scores)
    auto = suspects is None
    if auto:
        chosen, shares = find_suspects(fit_set, ood, mass=config.suspect_mass, max_suspects=config.max_suspects)
    else:
        chosen, shares = tuple(int(s) for s in suspects), {}
        if not chosen:
            raise AuditError("suspects is empty: name at least one fit-set class (or pass None to find them)")
    labels = np.asarray(fit_set.labels)
    drop = np.isin(labels, chosen)
    removed = int(drop.sum())
    before_name, best_before = best_of(before)
    if removed == 0:
        return ContrastResult(
            "label",
            chosen,
            shares,
            auto,
            0,
            len(fit_set),
            before,
            dict(before),
            best_before,
            best_before,
            before_name,
            config.recovery_threshold,
            False,
            False,
            None,
            note="the suspect classes are absent from the fit set: nothing to exclude, the pool is unchanged",
        )
    if removed == len(fit_set):
        raise AuditError("excluding the suspect classes would empty the fit set")
    with tempfile.TemporaryDirectory(prefix="oodbench-contrast-") as scratch:
        refit = _refit(fit_set, ~drop, members, Path(scratch))
        after = pool_aurocs(refit.score(id_test), refit.score(ood))
    name, best_after = best_of(after)
    recovered, partial = _recovery(best_before, best_after, config)
    identity, identity_class, null, limit = _identity(fit_set, ood, labels, chosen, auto and recovered, config)
    return ContrastResult(
        "label",
        chosen,
        shares,
        auto,
        removed,
        len(fit_set) - removed,
        before,
        after,
        best_before,
        best_after,
        name,
        config.recovery_threshold,
        bool(recovered),
        bool(partial),
        identity,
        skipped=dict(refit.skipped),
        identity_class=identity_class,
        identity_null=null,
        identity_limit=limit,
    )


def _identity(
    fit_set: Outputs, ood: Outputs, labels: np.ndarray, chosen: Sequence[int], with_null: bool, config: AuditConfig
) -> tuple[OracleLDA | None, int | None, tuple[float, ...], float | None]:
    """The identity reading: out-of-fold OracleLDA of the OOD images against each excluded class's own fit rows,
    the lowest one (≈ 0.5: the OOD set *is* that class), and, when asked, its permutation null and limit
    (mean + `identity_null_z` standard deviations of `identity_permutations` label permutations)."""
    rng = np.random.default_rng(config.seed)
    if len(ood) < config.folds:
        return None, None, (), None
    readings: dict[int, tuple[OracleLDA, np.ndarray]] = {}
    for c in chosen:
        rows = np.flatnonzero(labels == c)
        if len(rows) < config.folds:
            continue
        picked = rows[sample_index(len(rows), config.max_rows_per_side, rng)]
        reading = oracle_lda(
            np.asarray(fit_set.features[picked]),
            ood.features,
            folds=config.folds,
            seed=config.seed,
            max_rows_per_side=config.max_rows_per_side,
        )
        readings[int(c)] = (reading, picked)
    if not readings:
        return None, None, (), None
    closest = min(readings, key=lambda c: readings[c][0].auroc)
    identity, picked = readings[closest]
    if not with_null:
        return identity, closest, (), None
    null = oracle_lda_null(
        np.asarray(fit_set.features[picked]),
        ood.features,
        permutations=config.identity_permutations,
        folds=config.folds,
        seed=config.seed,
        max_rows_per_side=config.max_rows_per_side,
    )
    spread = float(np.std(null, ddof=1)) if len(null) > 1 else 0.0
    return identity, closest, tuple(float(v) for v in null), float(np.mean(null) + config.identity_null_z * spread)


def _by_nearest(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    config: AuditConfig,
    state: PoolState,
    members: list[PoolMember],
    ood_scores: Mapping[str, np.ndarray],
) -> ContrastResult:
    if len(ood) < 4:
        raise AuditError(f"the cross-fitted nearest contrast needs at least 4 OOD images; got {len(ood)}")
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(ood))
    halves = (np.sort(order[: len(ood) // 2]), np.sort(order[len(ood) // 2 :]))
    before_by_half, after_by_half, removed_by_half, skipped = [], [], [], {}
    with tempfile.TemporaryDirectory(prefix="oodbench-contrast-") as scratch:
        for excluded_half, scored_half in (halves, halves[::-1]):
            neighbours = nearest_rows(
                fit_set.features,
                np.asarray(ood.features[excluded_half]),
                min(config.nearest_per_ood, len(fit_set)),
                cosine=True,
            )
            drop = np.zeros(len(fit_set), dtype=bool)
            drop[np.unique(neighbours)] = True
            if drop.all():
                raise AuditError("the OOD images' nearest fit rows cover the whole fit set; lower nearest_per_ood")
            removed_by_half.append(int(drop.sum()))
            refit = _refit(fit_set, ~drop, members, Path(scratch))
            skipped.update(refit.skipped)
            scored = ood.subset(scored_half)
            after_by_half.append(pool_aurocs(refit.score(id_test), refit.score(scored)))
            before_by_half.append({k: auroc(state.id_pool_scores[k], v[scored_half]) for k, v in ood_scores.items()})
    before = {k: float(np.mean([half[k] for half in before_by_half])) for k in before_by_half[0]}
    common = set(after_by_half[0]) & set(after_by_half[1])
    after = {k: float(np.mean([half[k] for half in after_by_half])) for k in sorted(common)}
    if not after:
        raise AuditError("no pool detector could be refitted on both halves of the nearest contrast")
    name, best_after = best_of(after)
    best_before = best_of(before)[1]
    recovered, partial = _recovery(best_before, best_after, config)
    removed = int(round(float(np.mean(removed_by_half))))
    return ContrastResult(
        "nearest",
        (),
        {},
        False,
        removed,
        len(fit_set) - removed,
        before,
        after,
        best_before,
        best_after,
        name,
        config.recovery_threshold,
        bool(recovered),
        bool(partial),
        None,
        note=f"cross-fitted over two OOD halves; fit rows removed per half: {removed_by_half}",
        skipped=skipped,
    )
