"""Controlled battery: splits with a known answer (leaked or clean) built from a labelled dataset with cached features,
audited one by one, summarised as the sensitivity and specificity of the firing rule and of the adjudication.

Families of splits (each class gives one leaked and one clean split):

- ``trained-class``: a class of the fit set (and head) is designated OOD; ID test = the other classes' test rows.
  Leaked: its training rows stay in the fit set and the original head is used. Clean: its rows are removed from
  the fit set and a head is retrained without it on cached features (the backbone still saw it; see README).
- ``fit-only-class``: a class outside the model's label space (``extra_train``/``extra_test``) is designated OOD.
  Leaked: its training rows are added to the fit set (the head is unchanged). Clean: the fit set is left as is.
- ``near``: near-OOD sets known to be clean (none of their classes is in the fit set) but close to a fit class:
  intrinsically hard clean pairs, the rule's documented false-fire mode. Clean only.
- ``far``: whole OOD sets (e.g. faces, noise) against the untouched fit set; clean only.

Every split is audited twice where the rule fires: with suspects found automatically (as an auditor who does not
know the answer would) and with the class the benchmark designates (the OOD class itself; for near and far sets,
a class that is not in the fit set). Both paths' sensitivity and specificity are reported.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import AuditError
from ..core.outputs import Head, Outputs
from ..core.store import Store
from ..util.progress import progress_bar
from ._rows import select_rows
from .adjudicate import CLEAN, HARD_CLEAN, INCONCLUSIVE, LEAK, VERDICTS, Verdict, adjudicate
from .config import AuditConfig
from .contrast import ContrastResult, exclusion_contrast
from .fingerprint import PoolState, prepare_pool, rescore_pool
from .leave_class_out import head_without
from .split import SplitAudit, audit_split

__all__ = [
    "BatterySplit",
    "SplitData",
    "make_battery",
    "BatteryResult",
    "run_battery",
    "battery_from_store",
    "LEAKED",
    "CLEAN_KIND",
]

LEAKED, CLEAN_KIND = "leaked", "clean"
# The designated class of a near or far split: no fit-set class carries it (labels are non-negative).
NOT_IN_FIT = -1


@dataclass(frozen=True)
class SplitData:
    """The arrays of one materialised battery split."""

    fit: Outputs
    head: Head | None
    id_test: Outputs
    ood: Outputs


@dataclass
class BatterySplit:
    """A split whose answer is known by construction; its arrays are built on demand (one split in memory at a
    time), and splits with the same `pool_key` share their fit set and head (the pool is fitted once)."""

    name: str
    kind: str
    family: str
    ood_class: int | None
    build: Callable[[Path | None], SplitData] = field(repr=False)
    pool_key: tuple[Any, ...] | None = None

    @property
    def designated(self) -> int:
        """The fit-set class the benchmark designates as OOD (NOT_IN_FIT for near and far sets)."""
        return NOT_IN_FIT if self.ood_class is None else self.ood_class

    def materialize(self, scratch: Path | None = None) -> SplitData:
        """Build the split's arrays (large selections go to memory maps under `scratch`)."""
        return self.build(scratch)


def _merge(a: Outputs, b: Outputs) -> Outputs:
    """Rows of `a` then `b` (features, labels; logits when both have them with the same width)."""
    logits = None
    if a.logits is not None and b.logits is not None and a.num_classes == b.num_classes:
        logits = np.concatenate([np.asarray(a.logits), np.asarray(b.logits)])
    labels = None if a.labels is None or b.labels is None else np.concatenate([a.labels, b.labels])
    return Outputs(np.concatenate([np.asarray(a.features), np.asarray(b.features)]), logits, labels, check_finite=False)


def _without_logits(outputs: Outputs) -> Outputs:
    """The same rows without stored logits, so that logit detectors read the split's own (retrained) head."""
    return Outputs(outputs.features, None, outputs.labels, check_finite=False)


def make_battery(
    train: Outputs,
    test: Outputs,
    head: Head | None = None,
    *,
    classes: Sequence[int] | None = None,
    extra_train: Outputs | None = None,
    extra_test: Outputs | None = None,
    far: Mapping[str, Outputs] | None = None,
    near: Mapping[str, Outputs] | None = None,
    config: AuditConfig | None = None,
) -> list[BatterySplit]:
    """Leaked and clean splits from labelled train/test outputs (see module docstring); arrays are built lazily."""
    config = config or AuditConfig()
    if train.labels is None or test.labels is None:
        raise AuditError("the battery needs labelled train and test outputs")
    train_classes = np.unique(train.labels)
    chosen = train_classes if classes is None else np.asarray(sorted(set(int(c) for c in classes)))
    missing = np.setdiff1d(chosen, train_classes)
    if missing.size:
        raise AuditError(f"classes {missing.tolist()} are not in the training labels {train_classes.tolist()}")
    if train_classes.shape[0] < 3 and chosen.size:
        raise AuditError("trained-class splits need at least 3 training classes (2 must remain for a clean head)")
    test_counts = dict(zip(*np.unique(test.labels, return_counts=True), strict=True))
    empty = [int(c) for c in chosen if test_counts.get(c, 0) == 0]
    if empty:
        raise AuditError(f"classes {empty} have no test rows to designate as OOD")
    if (extra_train is None) != (extra_test is None):
        raise AuditError(
            "give both extra_train and extra_test (the train and test rows of classes outside the model's labels)"
        )
    extra_classes = np.array([], dtype=np.int64)
    if extra_train is not None and extra_test is not None:
        if extra_train.labels is None or extra_test.labels is None:
            raise AuditError("extra_train and extra_test need labels to add and designate one class at a time")
        overlap = np.intersect1d(np.unique(extra_train.labels), train_classes)
        if overlap.size:
            raise AuditError(f"extra_train shares classes {overlap.tolist()} with train; extra classes must be new")
        extra_classes = np.unique(extra_train.labels)
        absent = np.setdiff1d(extra_classes, np.unique(extra_test.labels))
        if absent.size:
            raise AuditError(f"extra classes {absent.tolist()} have no test rows")

    def trained_split(c: int, leaked: bool) -> Callable[[Path | None], SplitData]:
        def build(scratch: Path | None) -> SplitData:
            id_test = select_rows(test, test.labels != c, scratch=scratch)
            ood = select_rows(test, test.labels == c, scratch=scratch)
            if leaked:
                return SplitData(train, head, id_test, ood)
            fit = select_rows(train, train.labels != c, scratch=scratch, logits=False)
            return SplitData(fit, head_without(train, (c,), config)[0], _without_logits(id_test), _without_logits(ood))

        return build

    def extra_split(e: int, leaked: bool) -> Callable[[Path | None], SplitData]:
        def build(scratch: Path | None) -> SplitData:
            ood = select_rows(extra_test, extra_test.labels == e, scratch=scratch)
            fit = _merge(train, select_rows(extra_train, extra_train.labels == e)) if leaked else train
            return SplitData(fit, head, test, ood)

        return build

    def far_split(outputs: Outputs) -> Callable[[Path | None], SplitData]:
        return lambda scratch: SplitData(train, head, test, outputs)

    untouched = ("train", "head")  # splits that read the train set and the model's head as they are
    splits: list[BatterySplit] = []
    for c in map(int, chosen):
        splits.append(
            BatterySplit(
                f"leaked/trained-class-{c}", LEAKED, "trained-class", c, trained_split(c, True), pool_key=untouched
            )
        )
        splits.append(BatterySplit(f"clean/trained-class-{c}", CLEAN_KIND, "trained-class", c, trained_split(c, False)))
    for e in map(int, extra_classes):
        splits.append(BatterySplit(f"leaked/fit-only-class-{e}", LEAKED, "fit-only-class", e, extra_split(e, True)))
        splits.append(
            BatterySplit(
                f"clean/fit-only-class-{e}", CLEAN_KIND, "fit-only-class", e, extra_split(e, False), pool_key=untouched
            )
        )
    for family, sets in (("near", near), ("far", far)):
        for name, outputs in (sets or {}).items():
            splits.append(
                BatterySplit(f"clean/{family}-{name}", CLEAN_KIND, family, None, far_split(outputs), pool_key=untouched)
            )
    if not splits:
        raise AuditError("the battery is empty: give classes, extra sets, near or far OOD sets")
    return splits


@dataclass
class BatteryResult:
    """Audits of every battery split and the rule's and adjudication's sensitivity/specificity."""

    audits: list[SplitAudit]
    config: AuditConfig
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    designated: dict[str, DesignatedReading] = field(default_factory=dict)

    def _of(self, kind: str) -> list[SplitAudit]:
        return [a for a in self.audits if a.meta.get("kind") == kind]

    @staticmethod
    def _rate(hits: int, total: int) -> float:
        return hits / total if total else float("nan")

    @property
    def rule_sensitivity(self) -> float:
        """Share of leaked splits on which the firing rule fires."""
        leaked = self._of(LEAKED)
        return self._rate(sum(a.fingerprint.fires for a in leaked), len(leaked))

    @property
    def rule_specificity(self) -> float:
        """Share of clean splits on which the firing rule stays silent."""
        clean = self._of(CLEAN_KIND)
        return self._rate(sum(not a.fingerprint.fires for a in clean), len(clean))

    @property
    def sensitivity(self) -> float:
        """Share of leaked splits adjudicated 'leak' (inconclusive counts as a miss)."""
        leaked = self._of(LEAKED)
        return self._rate(sum(a.verdict.label == LEAK for a in leaked), len(leaked))

    @property
    def specificity(self) -> float:
        """Share of clean splits not adjudicated 'leak' (clean, hard-clean or inconclusive)."""
        clean = self._of(CLEAN_KIND)
        return self._rate(sum(a.verdict.label != LEAK for a in clean), len(clean))

    def designated_label(self, audit: SplitAudit) -> str:
        """The split's verdict with the designated class as suspect (the automatic one where the rule is silent)."""
        reading = self.designated.get(audit.name)
        return audit.verdict.label if reading is None else reading.verdict.label

    @property
    def designated_sensitivity(self) -> float:
        """Share of leaked splits adjudicated 'leak' when the contrast excludes the designated class."""
        leaked = self._of(LEAKED)
        return self._rate(sum(self.designated_label(a) == LEAK for a in leaked), len(leaked))

    @property
    def designated_specificity(self) -> float:
        """Share of clean splits not adjudicated 'leak' when the contrast excludes the designated class."""
        clean = self._of(CLEAN_KIND)
        return self._rate(sum(self.designated_label(a) != LEAK for a in clean), len(clean))

    def misses(self) -> list[tuple[SplitAudit, str]]:
        """Splits where the rule or the adjudication disagreed with the truth, with a one-line reason."""
        out = []
        for audit in self.audits:
            fp = audit.fingerprint
            if audit.meta.get("kind") == LEAKED and not fp.fires:
                why = []
                if fp.oracle.auroc < fp.oracle_threshold:
                    why.append(
                        f"OracleLDA {fp.oracle.auroc:.3f} < {fp.oracle_threshold:.2f} (pair not linearly separable in this embedding)"
                    )
                if fp.best_auroc >= fp.collapse_threshold:
                    why.append(
                        f"pool still detects it ({fp.best_detector} {fp.best_auroc:.3f} >= {fp.collapse_threshold:.2f})"
                    )
                out.append((audit, "rule silent on a leak: " + "; ".join(why)))
            elif audit.meta.get("kind") == LEAKED and audit.verdict.label != LEAK:
                out.append((audit, f"rule fired but adjudicated {audit.verdict.label}: {audit.verdict.reasons[-1]}"))
            elif audit.meta.get("kind") == CLEAN_KIND and fp.fires:
                out.append(
                    (
                        audit,
                        f"rule fired on a clean split, adjudicated {audit.verdict.label}: {audit.verdict.reasons[-1]}",
                    )
                )
        return out

    def scope_statement(self) -> str:
        """Where the single-threshold rule held on this battery and where it did not, in plain words."""
        leaked, clean = self._of(LEAKED), self._of(CLEAN_KIND)
        fired = sum(a.fingerprint.fires for a in leaked)
        silent = sum(not a.fingerprint.fires for a in clean)
        lines = [
            f"On this battery ({len(leaked)} leaked / {len(clean)} clean splits) the single-threshold rule "
            f"(OracleLDA >= {self.config.oracle_threshold:.2f} and best unsupervised AUROC < {self.config.collapse_threshold:.2f}) "
            f"fired on {fired}/{len(leaked)} leaked splits and stayed silent on {silent}/{len(clean)} clean splits; "
            f"with the automatic exclusion contrast (suspects found by proximity), "
            f"{sum(a.verdict.label == LEAK for a in leaked)}/{len(leaked)} leaks were confirmed "
            f"and {sum(a.verdict.label == LEAK for a in clean)}/{len(clean)} clean splits were wrongly called leaks; "
            f"excluding the designated class instead, {sum(self.designated_label(a) == LEAK for a in leaked)}/{len(leaked)} "
            f"and {sum(self.designated_label(a) == LEAK for a in clean)}/{len(clean)}."
        ]
        families = sorted({a.meta.get("family", "") for a in self.audits})
        for family in families:
            members = [a for a in self.audits if a.meta.get("family") == family]
            right = sum((a.meta["kind"] == LEAKED) == a.fingerprint.fires for a in members)
            lines.append(f"- {family}: the rule was right on {right}/{len(members)} splits.")
        misses = self.misses()
        if misses:
            lines.append("Where it did not hold:")
            lines += [f"- {audit.name}: {reason}" for audit, reason in misses]
        else:
            lines.append(
                "It held on every split of this battery; this says nothing about embeddings or pairs unlike these."
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (JSON-ready)."""
        rate = lambda value: None if value != value else value  # noqa: E731 (NaN, no splits of a kind -> null)
        return {
            "config": self.config.to_dict(),
            "rule_sensitivity": rate(self.rule_sensitivity),
            "rule_specificity": rate(self.rule_specificity),
            "sensitivity": rate(self.sensitivity),
            "specificity": rate(self.specificity),
            "designated_sensitivity": rate(self.designated_sensitivity),
            "designated_specificity": rate(self.designated_specificity),
            "counts": self.counts,
            "scope": self.scope_statement(),
            "splits": [
                {**a.to_dict(), "designated": self.designated[a.name].to_dict() if a.name in self.designated else None}
                for a in self.audits
            ],
        }


@dataclass
class DesignatedReading:
    """A split's contrast and verdict with the designated class as the suspect."""

    suspect: int
    contrast: ContrastResult
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return {"suspect": self.suspect, "contrast": self.contrast.to_dict(), "verdict": self.verdict.to_dict()}


def run_battery(
    splits: Sequence[BatterySplit],
    config: AuditConfig | None = None,
    *,
    contrast: str = "always",
    progress: bool = False,
) -> BatteryResult:
    """Audit every battery split, one materialised at a time (splits with a `pool_key` share one fitted pool)."""
    config = config or AuditConfig()
    shared: dict[tuple[Any, ...], PoolState] = {}
    audits = []
    designated: dict[str, DesignatedReading] = {}
    with progress_bar(progress) as bar, tempfile.TemporaryDirectory(prefix="oodbench-battery-") as scratch:
        task = bar.add_task("battery splits", total=len(splits))
        for split in splits:
            data = split.materialize(Path(scratch))
            cached = shared.get(split.pool_key) if split.pool_key is not None else None
            if cached is None:
                state = prepare_pool(data.fit, data.id_test, data.head, config)
                if split.pool_key is not None:
                    shared[split.pool_key] = state
            else:
                state = rescore_pool(cached, data.id_test)
            # Suspects are found automatically, as an auditor who does not know the answer would.
            audit = audit_split(
                data.fit,
                data.id_test,
                data.ood,
                data.head,
                name=split.name,
                config=config,
                state=state,
                contrast=contrast,
                meta={"kind": split.kind, "family": split.family, "ood_class": split.ood_class},
            )
            audits.append(audit)
            if audit.fingerprint.fires and data.fit.labels is not None:
                # The same split with the benchmark's designated class as the suspect (the rule's other input).
                result = exclusion_contrast(
                    data.fit,
                    data.id_test,
                    data.ood,
                    data.head,
                    suspects=(split.designated,),
                    config=config,
                    state=state,
                )
                designated[split.name] = DesignatedReading(
                    split.designated, result, adjudicate(audit.fingerprint, result, config)
                )
            del data
            bar.advance(task)
    counts = {
        kind: {v: sum(a.verdict.label == v for a in audits if a.meta["kind"] == kind) for v in VERDICTS}
        for kind in (LEAKED, CLEAN_KIND)
    }
    return BatteryResult(audits, config, counts, designated)


def battery_from_store(
    store: Store | str | os.PathLike[str],
    model_id: str,
    train_dataset: str,
    test_dataset: str,
    *,
    extra_train: str | None = None,
    extra_test: str | None = None,
    far: Sequence[str] = (),
    near: Sequence[str] = (),
    classes: Sequence[int] | None = None,
    config: AuditConfig | None = None,
) -> list[BatterySplit]:
    """Battery splits from stored entries of one model (provenance checked); the stored head is used when present."""
    store = store if isinstance(store, Store) else Store(store)
    names = [train_dataset, test_dataset, *(d for d in (extra_train, extra_test) if d), *near, *far]
    store.check_compatible(*[(model_id, n) for n in names])
    read = lambda name: store.read(model_id, name)  # noqa: E731
    head = store.read_head(model_id) if store.has_head(model_id) else None
    return make_battery(
        read(train_dataset),
        read(test_dataset),
        head,
        classes=classes,
        extra_train=read(extra_train) if extra_train else None,
        extra_test=read(extra_test) if extra_test else None,
        far={name: read(name) for name in far},
        near={name: read(name) for name in near},
        config=config,
    )


# Verdict names re-exported for report code that groups battery rows.
__all__ += ["CLEAN", "HARD_CLEAN", "INCONCLUSIVE", "LEAK", "DesignatedReading", "NOT_IN_FIT"]
