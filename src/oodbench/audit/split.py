"""One split's full audit (fingerprint, contrast, leave-class-out, overlap, verdict), from arrays or from a store."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..core.errors import AuditError
from ..core.outputs import Head, Outputs
from ..core.store import Store
from ..util.progress import progress_bar
from .adjudicate import Verdict, adjudicate
from .config import AuditConfig
from .contrast import ContrastResult, exclusion_contrast
from .fingerprint import Fingerprint, PoolState, check_split, fingerprint, prepare_pool
from .leave_class_out import LeaveClassOutResult, leave_class_out
from .overlap import OverlapIndex, pair_overlap

__all__ = ["SplitAudit", "audit_split", "audit_store", "ContrastWhen"]

ContrastWhen = Literal["fired", "always", "never"]


@dataclass
class SplitAudit:
    """Everything the audit found for one (fit set, ID test, OOD set) split."""

    name: str
    fingerprint: Fingerprint
    contrast: ContrastResult | None
    leave_class_out: LeaveClassOutResult | None
    overlap: OverlapIndex | None
    verdict: Verdict
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (JSON-ready)."""
        return {
            "name": self.name,
            "meta": dict(self.meta),
            "fingerprint": self.fingerprint.to_dict(),
            "contrast": None if self.contrast is None else self.contrast.to_dict(),
            "leave_class_out": None if self.leave_class_out is None else self.leave_class_out.to_dict(),
            "overlap": None if self.overlap is None else self.overlap.to_dict(),
            "verdict": self.verdict.to_dict(),
        }


def audit_split(
    fit_set: Outputs,
    id_test: Outputs,
    ood: Outputs,
    head: Head | None = None,
    *,
    name: str = "split",
    suspects: Sequence[int] | None = None,
    mode: Literal["label", "nearest"] | None = None,
    config: AuditConfig | None = None,
    state: PoolState | None = None,
    contrast: ContrastWhen = "fired",
    run_leave_class_out: bool = True,
    run_overlap: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> SplitAudit:
    """Fingerprint the split, run the exclusion contrast (when the rule fires, or always), retrain the head
    without the suspect classes, compute L_k, and adjudicate. ``mode=None`` picks 'label' when the fit set is labelled."""
    config = config or AuditConfig()
    if contrast not in ("fired", "always", "never"):
        raise AuditError(f"contrast must be 'fired', 'always' or 'never'; got {contrast!r}")
    if mode not in (None, "label", "nearest"):
        raise AuditError(f"unknown contrast mode {mode!r}; use 'label' or 'nearest'")
    check_split(fit_set, id_test, ood)
    state = state or prepare_pool(fit_set, id_test, head, config)
    ood_scores = state.pool.score(ood)  # read by the fingerprint and the contrast alike
    fp = fingerprint(fit_set, id_test, ood, head, config=config, state=state, ood_pool_scores=ood_scores)
    mode = mode or ("label" if fit_set.labels is not None else "nearest")
    result = None
    if contrast == "always" or (contrast == "fired" and fp.fires):
        result = exclusion_contrast(
            fit_set,
            id_test,
            ood,
            head,
            mode=mode,
            suspects=suspects,
            config=config,
            state=state,
            ood_pool_scores=ood_scores,
        )
    lco = None
    if (
        run_leave_class_out
        and result is not None
        and result.mode == "label"
        and result.removed_rows > 0
        and config.logit_detectors
    ):
        kept_classes = np.setdiff1d(np.unique(fit_set.labels), np.asarray(result.suspects)).shape[0]
        if kept_classes >= 2:
            lco = leave_class_out(fit_set, id_test, ood, head, result.suspects, config=config)
    overlap = None
    if run_overlap and len(id_test) + len(ood) > config.overlap_k:
        overlap = pair_overlap(
            id_test, ood, k=config.overlap_k, max_rows_per_side=config.max_rows_per_side, seed=config.seed
        )
    return SplitAudit(name, fp, result, lco, overlap, adjudicate(fp, result, config), dict(meta or {}))


def audit_store(
    store: Store | str | os.PathLike[str],
    model_id: str,
    fit_dataset: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    *,
    suspects: Mapping[str, Sequence[int]] | None = None,
    mode: Literal["label", "nearest"] | None = None,
    config: AuditConfig | None = None,
    contrast: ContrastWhen = "fired",
    progress: bool = False,
) -> list[SplitAudit]:
    """Audit each OOD set of a stored evaluation (same model, fit set and ID test set); the pool is fitted once."""
    config = config or AuditConfig()
    store = store if isinstance(store, Store) else Store(store)
    if mode not in (None, "label", "nearest"):
        raise AuditError(f"unknown contrast mode {mode!r}; use 'label' or 'nearest'")
    if not ood_datasets:
        raise AuditError("name at least one OOD dataset to audit")
    unknown = sorted(set(suspects or {}) - set(ood_datasets))
    if unknown:
        raise AuditError(f"suspects are given for datasets that are not audited: {', '.join(unknown)}")
    entries = [(model_id, d) for d in (fit_dataset, id_dataset, *ood_datasets)]
    store.check_compatible(*entries)
    fit_set = store.read(model_id, fit_dataset)
    if suspects and fit_set.labels is not None:
        present = set(np.unique(fit_set.labels).tolist())
        for dataset, classes in suspects.items():
            absent = sorted(set(int(c) for c in classes) - present)
            if absent:  # excluding them would remove no fit row: the contrast would test nothing
                raise AuditError(
                    f"suspects for {dataset}: classes {', '.join(map(str, absent))} have no row in the fit set "
                    f"{fit_dataset} (its classes: {min(present)}-{max(present)})"
                )
    id_test = store.read(model_id, id_dataset)
    head = store.read_head(model_id) if store.has_head(model_id) else None
    state = prepare_pool(fit_set, id_test, head, config)
    audits = []
    with progress_bar(progress) as bar:
        task = bar.add_task("auditing OOD sets", total=len(ood_datasets))
        for dataset in ood_datasets:
            ood = store.read(model_id, dataset)
            audits.append(
                audit_split(
                    fit_set,
                    id_test,
                    ood,
                    head,
                    name=dataset,
                    suspects=(suspects or {}).get(dataset),
                    mode=mode,
                    config=config,
                    state=state,
                    contrast=contrast,
                    meta={"model": model_id, "fit": fit_dataset, "id": id_dataset, "ood": dataset},
                )
            )
            bar.advance(task)
    return audits
