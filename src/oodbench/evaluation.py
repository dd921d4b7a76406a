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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import detectors as detector_registry
from .detectors.shared import FitStatistics, check_gram_dtype, gram_key
from .errors import DetectorError, OodbenchError, StoreError
from .outputs import Head, Outputs
from .progress import progress_bar
from .results import ResultRow, metric_rows
from .rundir import RunDir
from .store import Store
from .tabular import detector_table_markdown

__all__ = ["EvaluationResult", "evaluate_store", "evaluate_outputs", "normalize_detectors", "run_description"]

log = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    """Rows, per-image scores and the rendered table of one evaluation."""

    rows: list[ResultRow]
    scores: dict[str, dict[str, np.ndarray]]  # dataset -> detector -> scores
    table_markdown: str
    skipped: dict[str, str] = field(default_factory=dict)  # detector -> reason
    run_dir: Path | None = None


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
) -> EvaluationResult:
    """Fit each detector once, score the ID test set and every OOD set, and compute all metrics.

    With ``strict=False`` detectors whose requirements the arrays cannot meet are skipped and reported;
    with ``strict=True`` they raise. ``cached`` maps dataset -> detector -> scores to reuse. ``gram_dtype``
    is the precision of the shared Gram matrices (``"float32"``: about twice the speed, within the bound of
    docs/detectors.md).
    """
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
    datasets = {id_dataset: id_test, **ood_sets}
    scores: dict[str, dict[str, np.ndarray]] = {name: {} for name in datasets}
    skipped: dict[str, str] = {}
    cached = cached or {}
    reuse = {
        n: all(n in cached.get(ds, {}) and len(cached[ds][n]) == len(out) for ds, out in datasets.items()) for n in plan
    }
    # The detectors to fit share one pass over the fit set for their sufficient statistics (detectors.shared).
    shared = FitStatistics.for_detectors(
        fit_set, [instances[n] for n in plan if not reuse[n]], head, gram_dtype=gram_dtype
    )
    with progress_bar(progress) as bar:
        task = bar.add_task("detectors", total=len(plan))
        for name in plan:
            bar.update(task, description=f"{name}")
            # Taken out of the dict: a fitted detector is freed once it has scored (knn's index is the fit set).
            instance = instances.pop(name)
            reason = "; ".join(instance.unmet(fit_set, datasets, has_head=head is not None)) or None
            if reason is not None:
                if strict:
                    raise DetectorError(f"{name} cannot run: {reason}")
                skipped[name] = reason
                bar.advance(task)
                continue
            if reuse[name]:
                for ds in datasets:
                    scores[ds][name] = np.asarray(cached[ds][name])
            else:
                detector = instance.fit(fit_set, head, stats=shared)
                if on_detector_fitted is not None:
                    on_detector_fitted(name, detector)
                for ds, outputs in datasets.items():
                    scores[ds][name] = detector.score(outputs)
                if on_detector_done is not None:
                    on_detector_done(name, {ds: scores[ds][name] for ds in datasets})
                del detector, instance  # before the next fit, not after it
            bar.advance(task)
    ran = [name for name in plan if name not in skipped]
    rows = metric_rows(model, id_dataset, list(ood_sets), ran, scores, tpr)
    table = detector_table_markdown(rows, ran, list(ood_sets))
    return EvaluationResult(rows=rows, scores=scores, table_markdown=table, skipped=skipped)


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
) -> EvaluationResult:
    """Evaluate detectors on store entries of one model and (optionally) write a run directory.

    With `save_detectors`, each fitted detector is saved to ``save_detectors/<name>`` with its fit provenance.
    `gram_dtype` as in `evaluate_outputs`; it enters the score keys of the detectors whose fit it changes.
    """
    store = store if isinstance(store, Store) else Store(store)
    check_gram_dtype(gram_dtype)  # before any work
    if not 0.0 < float(tpr) <= 1.0:  # before run.json or any score file is written (NaN fails this too)
        raise OodbenchError(f"tpr must lie in (0, 1], e.g. 0.95; got {tpr}")
    if not ood_datasets:
        raise OodbenchError("no OOD datasets given: pass at least one --ood")
    run_dir = RunDir(out_dir) if out_dir is not None else None
    if run_dir is not None:
        run_dir.check_writable("out_dir")  # before any work, not after the detectors ran
    names = [fit_dataset, id_dataset, *ood_datasets]
    if len(set(names)) != len(names):
        raise OodbenchError(f"dataset names must be distinct; got {names}")
    store.check_compatible(*[(model_id, name) for name in names])
    fit_set = store.read(model_id, fit_dataset)
    id_test = store.read(model_id, id_dataset)
    oods = {name: store.read(model_id, name) for name in ood_datasets}
    head = store.read_head(model_id) if store.has_head(model_id) else None
    if head is not None:
        for name, outputs in [(fit_dataset, fit_set), (id_dataset, id_test), *oods.items()]:
            try:
                head.check_outputs(outputs)
            except ValueError as exc:
                raise StoreError(f"{model_id}/{name}: {exc}") from exc
    plan = normalize_detectors(detectors)
    keys = {name: _fingerprint(store, model_id, names, name, params, gram_dtype) for name, params in plan.items()}

    cached, done = run_dir.resume(model_id, [id_dataset, *ood_datasets], keys) if run_dir is not None else ({}, {})

    keep = Path(save_detectors) if save_detectors is not None else None
    if keep is not None:
        # Cached scores skip the fit; reuse them only where the detector fitted for that key is already saved.
        saved_keys = {name: detector_registry.saved_score_key(keep / name) for name in plan}
        cached = {ds: {d: s for d, s in per.items() if saved_keys.get(d) == keys.get(d)} for ds, per in cached.items()}

    def keep_fitted(name: str, detector: detector_registry.Detector) -> None:
        provenance = {**detector_registry.fit_provenance(store, model_id, fit_dataset), "score_key": keys[name]}
        detector.save(keep / name, provenance=provenance)

    def describe(score_keys: Mapping[str, str], **status: Any) -> dict[str, Any]:
        return run_description(
            store, model_id, fit_dataset, id_dataset, ood_datasets, plan, score_keys, gram_dtype=gram_dtype, **status
        )

    def persist(name: str, per_dataset: Mapping[str, np.ndarray]) -> None:
        # Saved as soon as a detector finishes, so an interrupted run resumes from the next detector.
        if run_dir is None:
            return
        for dataset, values in per_dataset.items():
            run_dir.save_scores(model_id, dataset, {name: values})
        done[name] = keys[name]
        run_dir.write_info(describe(done, complete=False))

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
    )
    if run_dir is not None:
        run_dir.write_results(model_id, result.rows, result.scores, result.table_markdown)
        if id_test.labels is not None and id_test.logits is not None:
            from .accuracy import record_accuracy  # Top-1 (original, ReaL) beside the OOD metrics: accuracy.json

            record_accuracy(run_dir.path, store, model_id, id_dataset, outputs=id_test)
        ran_keys = {name: keys[name] for name in plan if name not in result.skipped}
        run_dir.write_info(describe(ran_keys, complete=True, skipped=result.skipped))
        result.run_dir = run_dir.path
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
) -> dict[str, Any]:
    """The content of a run directory's run.json: inputs, parameters and the store entries' provenance."""
    entries = {}
    for name in [fit_dataset, id_dataset, *ood_datasets]:
        meta = store.meta(model_id, name)
        entries[name] = {
            k: meta.get(k) for k in ("provenance", "item_hash", "num_rows", "finished", "skipped", "versions")
        }
    return {
        "model": model_id,
        "store": str(store.root.resolve()),
        "fit_dataset": fit_dataset,
        "id_dataset": id_dataset,
        "ood_datasets": list(ood_datasets),
        "detectors": {name: dict(params) for name, params in plan.items()},
        "gram_dtype": gram_dtype,
        "skipped_detectors": dict(skipped or {}),
        "score_keys": dict(score_keys),
        "head": store.head_meta(model_id) if store.has_head(model_id) else None,
        "entries": entries,
        "complete": complete,
    }
