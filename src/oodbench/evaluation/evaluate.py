"""Evaluate detectors on cached outputs: fit once on the fit set, score ID test and every OOD set, write tidy rows.

An evaluation run directory holds ``results.parquet`` (tidy rows), ``scores/<model>/<dataset>.npz`` (per-image
scores of every detector), ``table.md`` and ``run.json`` (what was evaluated, with the store entries' provenance).
A rerun with the same inputs and parameters reuses the saved scores of each finished detector.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import detectors as detector_registry
from ..core.errors import DetectorError, OodbenchError, StoreError
from ..core.grouped import run_tables_markdown
from ..core.metrics import check_convention
from ..core.oodgroups import OodGroups
from ..core.outputs import Head, Outputs
from ..core.results import ResultRow, metric_rows
from ..core.rundir import RunDir
from ..core.store import Store
from ..detectors.fitsize import SMALL_FIT_SET, FitSize, adapt_plan, plan_size_problems
from ..detectors.shared import FitStatistics, check_gram_dtype, gram_key
from ..util.progress import note_work, progress_bar

__all__ = [
    "EvaluationResult",
    "FitSetTooSmall",
    "NothingEvaluated",
    "check_fit_size",
    "evaluate_store",
    "evaluate_outputs",
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
    accuracy: list[Any] = field(default_factory=list)  # accuracy.AccuracyRow of the ID test set (run directory only)
    verification: str | None = None  # what checking the store entries against their checksums found, and its time


class NothingEvaluated(DetectorError):
    """No detector of a run could be evaluated: each was skipped or failed (the message lists why)."""


def nothing_evaluated(skipped: Mapping[str, str], failed: Mapping[str, str]) -> NothingEvaluated:
    """The error of a run in which no detector ran, naming each detector and its reason."""
    reasons = [f"{name} skipped: {why}" for name, why in skipped.items()]
    reasons += [f"{name} failed: {why}" for name, why in failed.items()]
    return NothingEvaluated("no detector could be evaluated: " + "; ".join(reasons))


def _failure(exc: Exception) -> str:
    """One line for a detector's failure: the message of an expected error, else the type and the message."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, OodbenchError) else f"{type(exc).__name__}: {text}"


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
    check_convention(convention)
    if not ood_sets:
        raise OodbenchError("no OOD datasets given: pass at least one")
    for name, outputs in ood_sets.items():
        if len(outputs) == 0:
            raise OodbenchError(f"OOD dataset {name!r} is empty")
    if len(id_test) == 0:
        raise OodbenchError(f"ID test dataset {id_dataset!r} is empty")
    plan = normalize_detectors(detectors)
    # Unknown names and invalid parameters fail here, before any work.
    instances = {name: detector_registry.create(name, **params) for name, params in plan.items()}
    datasets = {id_dataset: id_test, **(csid_sets or {}), **ood_sets}
    scores: dict[str, dict[str, np.ndarray]] = {name: {} for name in datasets}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    cached = cached or {}
    reuse = {
        n: all(n in cached.get(ds, {}) and len(cached[ds][n]) == len(out) for ds, out in datasets.items()) for n in plan
    }
    unmet = {name: "; ".join(instances[name].unmet(fit_set, datasets, has_head=head is not None)) for name in plan}
    for name, reason in unmet.items():
        if reason and strict:
            raise DetectorError(f"{name} cannot run: {reason}")
    if all(unmet.values()):
        raise nothing_evaluated(unmet, {})  # before any fit
    # The detectors to fit share one pass over the fit set for their sufficient statistics (detectors.shared).
    shared = FitStatistics.for_detectors(
        fit_set, [instances[n] for n in plan if not reuse[n] and not unmet[n]], head, gram_dtype=gram_dtype
    )
    with progress_bar(progress) as bar:
        task = bar.add_task("detectors", total=len(plan))
        for name in plan:
            bar.update(task, description=f"{name}")
            # Taken out of the dict: a fitted detector is freed once it has scored (knn's index is the fit set).
            instance = instances.pop(name)
            if unmet[name]:
                skipped[name] = unmet[name]
                bar.advance(task)
                continue
            if reuse[name]:
                for ds in datasets:
                    scores[ds][name] = np.asarray(cached[ds][name])
            else:
                try:
                    detector = instance.fit(fit_set, head, stats=shared)
                    if on_detector_fitted is not None:
                        on_detector_fitted(name, detector)
                    per_dataset = {ds: detector.score(outputs) for ds, outputs in datasets.items()}
                except Exception as exc:
                    # One detector's failure keeps none of its scores and stops none of the others.
                    if strict:
                        raise
                    log.debug("detector %s failed", name, exc_info=True)
                    failed[name] = _failure(exc)
                    bar.advance(task)
                    continue
                for ds, values in per_dataset.items():
                    scores[ds][name] = values
                if on_detector_done is not None:
                    on_detector_done(name, per_dataset)
                del detector, instance  # before the next fit, not after it
            bar.advance(task)
    ran = [name for name in plan if name not in skipped and name not in failed]
    if not ran:
        raise nothing_evaluated(skipped, failed)
    conventions = list(dict.fromkeys(["oodbench", convention]))
    rows = metric_rows(model, id_dataset, list(ood_sets), ran, scores, tpr, conventions)
    table = run_tables_markdown(
        rows,
        ran,
        list(ood_sets),
        convention=convention,
        aupr=aupr,
        groups=groups,
        csid_datasets=list(csid_sets or {}),
        scores=scores,
        tpr=tpr,
    )
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


def _fingerprint(
    store: Store,
    model_id: str,
    datasets: Sequence[str],
    name: str,
    params: Mapping[str, Any],
    gram_dtype: str = "float64",
) -> str:
    """Content key of one detector's scores: inputs' store metadata + detector parameters (+ a float32 Gram)."""
    digest = hashlib.sha256()
    for dataset in datasets:
        meta = store.meta(model_id, dataset)
        digest.update(
            json.dumps(
                [dataset, meta.get("finished"), meta.get("num_rows"), meta.get("provenance")],
                sort_keys=True,
                default=str,
            ).encode()
        )
    if store.has_head(model_id):
        digest.update(json.dumps(store.head_meta(model_id).get("written")).encode())
    digest.update(json.dumps([name, dict(params)], sort_keys=True, default=str).encode())
    plugin = detector_registry.detector_fingerprint(name)  # None for built-ins: their keys stay as they were
    if plugin is not None:
        digest.update(plugin.encode())
    precision = gram_key(detector_registry.get_class(name), gram_dtype)
    if precision is not None:
        digest.update(precision.encode())
    return digest.hexdigest()[:16]


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
    store = store if isinstance(store, Store) else Store(store)
    check_gram_dtype(gram_dtype)  # before any work
    if not 0.0 < float(tpr) <= 1.0:  # before run.json or any score file is written (NaN fails this too)
        raise OodbenchError(f"tpr must lie in (0, 1], e.g. 0.95; got {tpr}")
    check_convention(convention)
    if small_fit_set not in SMALL_FIT_SET:
        raise DetectorError(f"small_fit_set must be one of {', '.join(SMALL_FIT_SET)}; got {small_fit_set!r}")
    if not ood_datasets:
        raise OodbenchError("no OOD datasets given: pass at least one --ood")
    run_dir = RunDir(out_dir) if out_dir is not None else None
    if run_dir is not None:
        run_dir.check_writable("out_dir")  # before any work, not after the detectors ran
    names = [fit_dataset, id_dataset, *csid_datasets, *ood_datasets]
    if len(set(names)) != len(names):
        raise OodbenchError(f"dataset names must be distinct; got {names}")
    store.check_compatible(*[(model_id, name) for name in names])
    verification = None
    if run_dir is not None:
        verification = run_dir.verify_store(store, model_id, names, force=verify, progress=progress)
    elif verify:
        for name in names:
            store.read(model_id, name, verify=True)
    fit_set = store.read(model_id, fit_dataset)
    id_test = store.read(model_id, id_dataset)
    oods = {name: store.read(model_id, name) for name in ood_datasets}
    csids = {name: store.read(model_id, name) for name in csid_datasets}
    head = store.read_head(model_id, verify=verify and run_dir is None) if store.has_head(model_id) else None
    if head is not None:
        for name, outputs in [(fit_dataset, fit_set), (id_dataset, id_test), *csids.items(), *oods.items()]:
            try:
                head.check_outputs(outputs)
            except ValueError as exc:
                raise StoreError(f"{model_id}/{name}: {exc}") from exc
    if len(fit_set) == 0:  # before the parameters are checked against its size
        raise OodbenchError(f"fit dataset {fit_dataset!r} is empty")
    plan = normalize_detectors(detectors)
    tests = {id_dataset: id_test, **oods}
    will_skip = {
        name
        for name, params in plan.items()
        if detector_registry.create(name, **params).unmet(fit_set, tests, has_head=head is not None)
    }
    plan, adapted = check_fit_size(plan, FitSize.of(fit_set), small_fit_set, ignore=will_skip)
    keys = {name: _fingerprint(store, model_id, names, name, params, gram_dtype) for name, params in plan.items()}

    scored = [id_dataset, *csid_datasets, *ood_datasets]
    cached, done = run_dir.resume(model_id, scored, keys) if run_dir is not None else ({}, {})

    keep = Path(save_detectors) if save_detectors is not None else None
    if keep is not None:
        # Cached scores skip the fit; reuse them only where the detector fitted for that key is already saved.
        saved_keys = {name: detector_registry.saved_score_key(keep / name) for name in plan}
        cached = {ds: {d: s for d, s in per.items() if saved_keys.get(d) == keys.get(d)} for ds, per in cached.items()}

    def keep_fitted(name: str, detector: detector_registry.Detector) -> None:
        provenance = {**detector_registry.fit_provenance(store, model_id, fit_dataset), "score_key": keys[name]}
        detector_registry.save(detector, keep / name, provenance=provenance)

    def describe(score_keys: Mapping[str, str], **status: Any) -> dict[str, Any]:
        info = run_description(
            store,
            model_id,
            fit_dataset,
            id_dataset,
            ood_datasets,
            plan,
            score_keys,
            gram_dtype=gram_dtype,
            csid_datasets=csid_datasets,
            adapted=adapted,
            **status,
        )
        info["convention"] = convention
        return info

    def persist(name: str, per_dataset: Mapping[str, np.ndarray]) -> None:
        # Saved as soon as a detector finishes, so an interrupted run resumes from the next detector.
        if run_dir is None:
            return
        for dataset, values in per_dataset.items():
            run_dir.save_scores(model_id, dataset, {name: values})
        done[name] = keys[name]
        run_dir.write_info(describe(done, complete=False))
        note_work("detectors", finished=f"detectors {', '.join(done)}", kept=f"their scores in {run_dir.path}")

    result = evaluate_outputs(
        fit_set,
        head,
        id_test,
        oods,
        plan,
        model=model_id,
        id_dataset=id_dataset,
        tpr=tpr,
        strict=strict,
        progress=progress,
        cached=cached,
        on_detector_done=persist,
        on_detector_fitted=keep_fitted if keep is not None else None,
        gram_dtype=gram_dtype,
        csid_sets=csids,
        convention=convention,
        aupr=aupr,
        groups=groups,
    )
    if run_dir is not None:
        run_dir.write_results(model_id, result.rows, result.scores, result.table_markdown)
        if id_test.labels is not None and id_test.logits is not None:
            from .accuracy import record_accuracy  # Top-1 (original, ReaL) beside the OOD metrics: accuracy.json

            result.accuracy = record_accuracy(run_dir.path, store, model_id, id_dataset, outputs=id_test)
        ran = [name for name in plan if name not in result.skipped and name not in result.failed]
        # A run with failed detectors is not complete: a rerun fits only those (the others' score keys match).
        info = describe(
            {name: keys[name] for name in ran},
            complete=not result.failed,
            skipped=result.skipped,
            failed=result.failed,
        )
        run_dir.write_info(info)
        result.run_dir = run_dir.path
    result.adapted = adapted
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
) -> dict[str, Any]:
    """The content of a run directory's run.json: inputs, parameters and the store entries' provenance."""
    entries = {}
    for name in [fit_dataset, id_dataset, *csid_datasets, *ood_datasets]:
        meta = store.meta(model_id, name)
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
