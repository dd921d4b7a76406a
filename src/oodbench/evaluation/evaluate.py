"""Evaluate detectors on cached outputs: fit once on the fit set, score ID test and every OOD set, write tidy rows.

An evaluation run directory holds ``results.parquet`` (tidy rows), ``scores/<model>/<dataset>.npz`` (per-image
scores of every detector), ``table.md`` and ``run.json`` (what was evaluated, with the store entries' provenance).
A rerun with the same inputs and parameters reuses the saved scores of each finished detector.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import detectors as detector_registry
from ..core.errors import DetectorError, OodbenchError
from ..core.oodgroups import OodGroups
from ..core.outputs import Head, Outputs
from ..core.results import ResultRow
from ..core.rundir import RunDir
from ..core.store import Store
from ..detectors.fitsize import SMALL_FIT_SET, FitSize, adapt_plan, plan_size_problems
from .engine import ModelInputs, RunWriter, evaluate_inputs, result_tables, score_key, unmet_reasons
from .spec import EvaluationSpec

__all__ = [
    "EvaluationResult",
    "FitSetTooSmall",
    "NothingEvaluated",
    "check_fit_size",
    "evaluate_store",
    "evaluate_outputs",
    "evaluate_spec",
    "fit_size_plan",
    "normalize_detectors",
    "run_description",
]

log = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    """Rows, per-image scores and the rendered table of one evaluation."""

    rows: list[ResultRow]
    scores: dict[str, dict[str, np.ndarray]]  # dataset -> detector -> scores
    table_markdown: str
    skipped: dict[str, str] = field(default_factory=dict)  # detector -> why its requirements are not met
    run_dir: Path | None = None
    failed: dict[str, str] = field(default_factory=dict)  # detector -> the error that stopped its fit or scoring
    adapted: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # detector -> param -> from/to
    accuracy: list[Any] = field(default_factory=list)  # accuracy.AccuracyRow of the ID test set (labels and logits)
    verification: str | None = None  # what checking the store entries against their checksums found, and its time


class NothingEvaluated(DetectorError):
    """No detector of a run could be evaluated: each was skipped or failed (the message lists why)."""


def nothing_evaluated(skipped: Mapping[str, str], failed: Mapping[str, str]) -> NothingEvaluated:
    """The error of a run in which no detector ran, naming each detector and its reason."""
    reasons = [f"{name} skipped: {why}" for name, why in skipped.items()]
    reasons += [f"{name} failed: {why}" for name, why in failed.items()]
    return NothingEvaluated("no detector could be evaluated: " + "; ".join(reasons))


def normalize_detectors(detectors: Sequence[str] | Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """{name: params}; None means every registered detector with default parameters."""
    if detectors is None:
        return {name: {} for name in detector_registry.available()}
    if isinstance(detectors, Mapping):
        return {name: dict(params or {}) for name, params in detectors.items()}
    return {name: {} for name in detectors}


def evaluate_outputs(
    fit_set: Outputs,
    head: Head | None,
    id_test: Outputs,
    ood_sets: Mapping[str, Outputs],
    detectors: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
    *,
    model: str = "model",
    id_dataset: str = "id",
    tpr: float = 0.95,
    strict: bool = False,
    progress: bool = True,
    cached: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    on_detector_done: Any = None,
    on_detector_fitted: Any = None,
    gram_dtype: str = "float64",
    csid_sets: Mapping[str, Outputs] | None = None,
    convention: str = "oodbench",
    aupr: bool = False,
    groups: OodGroups | None = None,
) -> EvaluationResult:
    """Fit each detector once, score the ID test set and every OOD set, and compute all metrics.

    With ``strict=False`` detectors whose requirements the arrays cannot meet are skipped and reported, and a
    detector whose fit or scoring raises is recorded in ``failed`` while the others go on; with ``strict=True``
    both raise. When no detector runs at all, `NothingEvaluated` lists every reason. ``cached`` maps dataset ->
    detector -> scores to reuse. ``gram_dtype`` is the precision of the shared Gram matrices (``"float32"``: about
    twice the speed, within the bound of docs/detectors.md). ``csid_sets`` are covariate-shifted ID sets, scored
    too and counted as ID in the table's full-spectrum setting; ``convention`` is the table's metric convention
    (``openood`` also adds its ``openood.*`` rows), ``aupr`` adds AUPR columns and ``groups`` the grouped table
    (`oodbench.core.grouped`).
    """
    spec = EvaluationSpec.build(
        detectors,
        id=id_dataset,
        ood=list(ood_sets),
        csid=list(csid_sets or {}),
        fit=_free_name("fit", [id_dataset, *(csid_sets or {}), *ood_sets]),
        tpr=tpr,
        convention=convention,
        aupr=aupr,
        groups=groups,
        gram_dtype=gram_dtype,
        strict=strict,
        default_groups=False,
    )
    for name, outputs in ood_sets.items():
        if len(outputs) == 0:
            raise OodbenchError(f"OOD dataset {name!r} is empty")
    if len(id_test) == 0:
        raise OodbenchError(f"ID test dataset {id_dataset!r} is empty")
    sets = {spec.fit: fit_set, id_dataset: id_test, **(csid_sets or {}), **ood_sets}
    inputs = ModelInputs.from_outputs(sets, head, model)
    return _evaluate(
        inputs,
        spec,
        model=model,
        progress=progress,
        cached=cached,
        on_detector_done=on_detector_done,
        on_detector_fitted=on_detector_fitted,
    )


def _free_name(base: str, taken: Sequence[str]) -> str:
    """`base`, or `base` with a suffix, so that the in-memory fit set's name is none of the test sets'."""
    name, number = base, 1
    while name in taken:
        name, number = f"{base}-{number}", number + 1
    return name


def _evaluate(
    inputs: ModelInputs,
    spec: EvaluationSpec,
    *,
    model: str,
    progress: bool,
    cached: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    on_detector_done: Any = None,
    on_detector_fitted: Any = None,
) -> EvaluationResult:
    """The engine's detectors, rows and table as an `EvaluationResult`."""
    scores, skipped, failed, ran = evaluate_inputs(
        inputs,
        spec,
        model=model,
        progress=progress,
        cached=cached,
        on_detector_done=on_detector_done,
        on_detector_fitted=on_detector_fitted,
    )
    rows, table = result_tables(model, spec, ran, scores)
    return EvaluationResult(rows=rows, scores=scores, table_markdown=table, skipped=skipped, failed=failed)


def check_fit_size(
    plan: Mapping[str, Mapping[str, Any]],
    size: FitSize,
    small_fit_set: str = "fail",
    *,
    ignore: Collection[str] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """The plan's parameters checked against the fit set: (plan, {}) when it supports them all, the adapted plan
    and what changed with ``small_fit_set="adapt"``, else one `FitSetTooSmall` naming every parameter to change.

    Detectors in `ignore` (those that will be skipped) are not checked.
    """
    if small_fit_set not in SMALL_FIT_SET:
        raise DetectorError(f"small_fit_set must be one of {', '.join(SMALL_FIT_SET)}; got {small_fit_set!r}")
    checked = {name: dict(params) for name, params in plan.items() if name not in ignore}
    instances = {name: detector_registry.create(name, **params) for name, params in checked.items()}
    problems = plan_size_problems(instances, size)
    if not problems:
        return {name: dict(params) for name, params in plan.items()}, {}
    if small_fit_set == "adapt":
        adapted, changed, refused = adapt_plan(checked, instances, size)
        remaining = plan_size_problems({n: detector_registry.create(n, **p) for n, p in adapted.items()}, size)
        if not refused and not remaining:
            return {name: adapted.get(name, dict(params)) for name, params in plan.items()}, changed
        problems = refused + [p for p in remaining if p.split(":")[0] not in {r.split(":")[0] for r in refused}]
        advice = "Change them with -p DETECTOR.PARAM=VALUE (explicit values are never adapted)"
    else:
        advice = (
            "Change them with -p DETECTOR.PARAM=VALUE, or let the defaults scale to the fit set with "
            "--small-fit-set adapt (small_fit_set='adapt' in Python)"
        )
    from ..detectors.fitsize import unsupported_line

    raise FitSetTooSmall(f"{unsupported_line(size, problems, instances)}. {advice}")


class FitSetTooSmall(DetectorError):
    """Detector parameters the fit set cannot support (the message names each one)."""


def fit_set_size(fit_set: Outputs, *, count_classes: bool) -> FitSize:
    """The fit set's size; with `count_classes` its distinct labels too (one pass over the labels), so that adapt
    can tell per-class detectors (she, openmax) that lack rows of some head class."""
    size = FitSize.of(fit_set)
    if count_classes and fit_set.labels is not None:
        size = dataclasses.replace(size, classes=int(np.unique(np.asarray(fit_set.labels)).size))
    return size


def fit_size_plan(
    plan: Mapping[str, Mapping[str, Any]],
    size: FitSize,
    small_fit_set: str = "fail",
    *,
    ignore: Collection[str] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
    """`check_fit_size`, except that with ``small_fit_set="adapt"`` a detector the fit set cannot support even with
    adapted defaults is left out: (plan without it, what changed, {detector: why it was left out, in one line})."""
    try:
        plan, changed = check_fit_size(plan, size, small_fit_set, ignore=ignore)
        return plan, changed, {}
    except FitSetTooSmall:
        if small_fit_set != "adapt":
            raise
    checked = {name: dict(params) for name, params in plan.items() if name not in ignore}
    instances = {name: detector_registry.create(name, **params) for name, params in checked.items()}
    adapted, changed, refused = adapt_plan(checked, instances, size)
    remaining = plan_size_problems({n: detector_registry.create(n, **p) for n, p in adapted.items()}, size)
    reasons: dict[str, list[str]] = {}
    for problem in [*refused, *remaining]:
        name, _, why = problem.partition(": ")
        if why not in reasons.setdefault(name, []):
            reasons[name].append(why)
    left_out = {name: f"left out by --small-fit-set adapt: {'; '.join(why)}" for name, why in reasons.items()}
    kept = {name: adapted.get(name, dict(params)) for name, params in plan.items() if name not in left_out}
    return kept, {name: c for name, c in changed.items() if name not in left_out}, left_out


def evaluate_store(
    store: Store | str | os.PathLike[str],
    model_id: str,
    fit_dataset: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    detectors: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
    *,
    out_dir: str | os.PathLike[str] | None = None,
    tpr: float = 0.95,
    strict: bool = False,
    progress: bool = True,
    save_detectors: str | os.PathLike[str] | None = None,
    gram_dtype: str = "float64",
    csid_datasets: Sequence[str] = (),
    convention: str = "oodbench",
    aupr: bool = False,
    groups: OodGroups | None = None,
    small_fit_set: str = "fail",
    verify: bool = False,
) -> EvaluationResult:
    """Evaluate detectors on store entries of one model and (optionally) write a run directory.

    With `save_detectors`, each fitted detector is saved to ``save_detectors/<name>`` with its fit provenance.
    `gram_dtype` as in `evaluate_outputs`; it enters the score keys of the detectors whose fit it changes.
    `csid_datasets` (covariate-shifted ID sets), `convention`, `aupr` and `groups` as in `evaluate_outputs`.
    Every detector's parameters are checked against the fit set before any fit (`check_fit_size`):
    ``small_fit_set="adapt"`` scales the defaults a small fit set cannot support and records them in run.json.
    The entries read are checked against their checksums once per run directory (every time with `verify`).
    """
    spec = EvaluationSpec.build(
        detectors,
        fit=fit_dataset,
        id=id_dataset,
        ood=ood_datasets,
        csid=csid_datasets,
        tpr=tpr,
        convention=convention,
        aupr=aupr,
        groups=groups,
        small_fit_set=small_fit_set,
        gram_dtype=gram_dtype,
        strict=strict,
        verify=verify,
        default_groups=False,
    )
    return evaluate_spec(store, model_id, spec, out_dir=out_dir, progress=progress, save_detectors=save_detectors)


def evaluate_spec(
    store: Store | str | os.PathLike[str],
    model_id: str,
    spec: EvaluationSpec,
    *,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    save_detectors: str | os.PathLike[str] | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> EvaluationResult:
    """`evaluate_store` for a built `EvaluationSpec` (what every front end calls); `run_info` joins run.json."""
    store = store if isinstance(store, Store) else Store(store)
    run_dir = RunDir(out_dir) if out_dir is not None else None
    if run_dir is not None:
        run_dir.check_writable("out_dir")  # before any work, not after the detectors ran
    names = spec.datasets
    inputs = ModelInputs(store, model_id, verify=spec.verify and run_dir is None)
    inputs.check_compatible(names)
    verification = None
    if run_dir is not None:
        verification = run_dir.verify_store(store, model_id, names, force=spec.verify, progress=progress)
    fit_set = inputs.outputs(spec.fit)
    for name in spec.scored:
        inputs.outputs(name)  # each opened, checked finite and against the head once, before any fit
    if len(fit_set) == 0:  # before the parameters are checked against its size
        raise OodbenchError(f"fit dataset {spec.fit!r} is empty")
    for name in spec.ood:  # a metric of an empty set is no number: refused before any fit
        if len(inputs.outputs(name)) == 0:
            raise OodbenchError(f"OOD dataset {name!r} is empty")
    if len(inputs.outputs(spec.id)) == 0:
        raise OodbenchError(f"ID test dataset {spec.id!r} is empty")
    will_skip = {name for name, reason in unmet_reasons(inputs, spec).items() if reason}
    size = fit_set_size(fit_set, count_classes=spec.small_fit_set == "adapt")
    plan, adapted, left_out = fit_size_plan(spec.detectors, size, spec.small_fit_set, ignore=will_skip)
    if left_out and len(left_out) == len(spec.detectors):
        raise nothing_evaluated(left_out, {})
    if adapted or left_out:
        spec = spec.with_plan(plan, adapted)
    keys = {name: score_key(inputs, names, name, spec.resolved[name], spec.gram_dtype) for name in spec.detectors}

    def describe(score_keys: Mapping[str, str], **status: Any) -> dict[str, Any]:
        info = run_description(
            store,
            model_id,
            spec.fit,
            spec.id,
            spec.ood,
            spec.resolved,
            score_keys,
            gram_dtype=spec.gram_dtype,
            csid_datasets=spec.csid,
            adapted=spec.adapted,
            metas=inputs.meta,
            **status,
        )
        info["convention"] = spec.convention
        info.update(run_info or {})
        return info

    writer = RunWriter(run_dir, model_id, describe, tpr=spec.tpr) if run_dir is not None else None
    cached = writer.resume(spec.scored, keys) if writer is not None else {}

    keep = Path(save_detectors) if save_detectors is not None else None
    if keep is not None:
        # Cached scores skip the fit; reuse them only where the detector fitted for that key is already saved.
        saved_keys = {name: detector_registry.saved_score_key(keep / name) for name in spec.detectors}
        cached = {ds: {d: s for d, s in per.items() if saved_keys.get(d) == keys.get(d)} for ds, per in cached.items()}

    def keep_fitted(name: str, detector: detector_registry.Detector) -> None:
        provenance = {**detector_registry.fit_provenance(store, model_id, spec.fit), "score_key": keys[name]}
        detector_registry.save(detector, keep / name, provenance=provenance)

    def persist(name: str, per_dataset: Mapping[str, np.ndarray]) -> None:
        # Saved as soon as a detector finishes, so an interrupted run resumes from the next detector.
        if writer is not None:
            writer.detector_done(name, per_dataset, keys[name])

    result = _evaluate(
        inputs,
        spec,
        model=model_id,
        progress=progress,
        cached=cached,
        on_detector_done=persist,
        on_detector_fitted=keep_fitted if keep is not None else None,
    )
    result.skipped = {**left_out, **result.skipped}  # what adapt left out, with why (run.json's skipped_detectors)
    id_test = inputs.outputs(spec.id)
    if id_test.labels is not None and id_test.logits is not None:
        from .accuracy import record_accuracy  # Top-1 (original, ReaL) beside the OOD metrics: accuracy.json

        where = run_dir.path if run_dir is not None else None  # without a run directory: returned, not written
        result.accuracy = record_accuracy(where, store, model_id, spec.id, outputs=id_test)
    if writer is not None and run_dir is not None:
        ran = [name for name in spec.detectors if name not in result.skipped and name not in result.failed]
        # A run with failed detectors is not complete: a rerun fits only those (the others' score keys match).
        writer.finish(
            result.rows,
            result.scores,
            result.table_markdown,
            {name: keys[name] for name in ran},
            complete=not result.failed,
            skipped=result.skipped,
            failed=result.failed,
        )
        result.run_dir = run_dir.path
    result.adapted = dict(spec.adapted)
    result.verification = verification
    return result


def run_description(
    store: Store,
    model_id: str,
    fit_dataset: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    plan: Mapping[str, Mapping[str, Any]],
    score_keys: Mapping[str, str],
    *,
    complete: bool,
    skipped: Mapping[str, str] | None = None,
    gram_dtype: str = "float64",
    csid_datasets: Sequence[str] = (),
    failed: Mapping[str, str] | None = None,
    adapted: Mapping[str, Any] | None = None,
    metas: Callable[[str], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The content of a run directory's run.json: inputs, parameters and the store entries' provenance.

    `metas` reads an entry's meta.json (`ModelInputs.meta`, parsed once per evaluation); default: the store's.
    """
    entries = {}
    for name in [fit_dataset, id_dataset, *csid_datasets, *ood_datasets]:
        meta = metas(name) if metas is not None else store.meta(model_id, name)
        entries[name] = {
            k: meta.get(k) for k in ("provenance", "item_hash", "num_rows", "finished", "skipped", "versions")
        }
    return {
        "model": model_id,
        "store": str(store.root.resolve()),
        "fit_dataset": fit_dataset,
        "id_dataset": id_dataset,
        **({"csid_datasets": list(csid_datasets)} if csid_datasets else {}),  # full spectrum: read by the report
        "ood_datasets": list(ood_datasets),
        "detectors": {name: dict(params) for name, params in plan.items()},
        "gram_dtype": gram_dtype,
        "skipped_detectors": dict(skipped or {}),
        "failed_detectors": dict(failed or {}),
        "adapted_parameters": dict(adapted or {}),
        "score_keys": dict(score_keys),
        "head": store.head_meta(model_id) if store.has_head(model_id) else None,
        "entries": entries,
        "complete": complete,
    }
