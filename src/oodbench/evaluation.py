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
from . import metrics
from .atomic import atomic_write_json, atomic_write_text
from .detectors.shared import FitStatistics
from .errors import DetectorError, OodbenchError, StoreError
from .outputs import Head, Outputs
from .progress import progress_bar
from .report.detector_table import detector_table_markdown
from .results import ResultRow, rows_from_metrics, write_rows
from .scores import load_scores, save_scores, score_path
from .store import Store

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


def _unmet_requirements(
    detector: detector_registry.Detector, fit_set: Outputs, head: Head | None, tests: Sequence[Outputs]
) -> str | None:
    """Why a detector cannot run on these arrays, or None."""
    req = detector.requirements()
    missing_fit = sorted(req.fit - fit_set.array_names())
    if missing_fit:
        return f"fit set lacks {', '.join(missing_fit)}"
    if req.head and head is None:
        return "no head stored for the model"
    for test in tests:
        missing = sorted(req.score - test.array_names())
        if missing:
            return f"test set lacks {', '.join(missing)}"
    return None


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
) -> EvaluationResult:
    """Fit each detector once, score the ID test set and every OOD set, and compute all metrics.

    With ``strict=False`` detectors whose requirements the arrays cannot meet are skipped and reported;
    with ``strict=True`` they raise. ``cached`` maps dataset -> detector -> scores to reuse.
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
    shared = FitStatistics.for_detectors(fit_set, [instances[n] for n in plan if not reuse[n]], head)
    with progress_bar(progress) as bar:
        task = bar.add_task("detectors", total=len(plan))
        for name in plan:
            bar.update(task, description=f"{name}")
            reason = _unmet_requirements(instances[name], fit_set, head, list(datasets.values()))
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
                detector = instances[name].fit(fit_set, head, stats=shared)
                for ds, outputs in datasets.items():
                    scores[ds][name] = detector.score(outputs)
                if on_detector_done is not None:
                    on_detector_done(name, {ds: scores[ds][name] for ds in datasets})
            bar.advance(task)
    rows: list[ResultRow] = []
    ran = [name for name in plan if name not in skipped]
    for name in ran:
        for ood_name in ood_sets:
            values = metrics.evaluate(scores[id_dataset][name], scores[ood_name][name], tpr)
            rows.extend(
                rows_from_metrics(model, id_dataset, ood_name, name, values, len(id_test), len(ood_sets[ood_name]))
            )
    table = detector_table_markdown(rows, ran, list(ood_sets))
    return EvaluationResult(rows=rows, scores=scores, table_markdown=table, skipped=skipped)


def _fingerprint(store: Store, model_id: str, datasets: Sequence[str], name: str, params: Mapping[str, Any]) -> str:
    """Content key of one detector's scores: inputs' store metadata + detector parameters."""
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
) -> EvaluationResult:
    """Evaluate detectors on store entries of one model and (optionally) write a run directory."""
    store = store if isinstance(store, Store) else Store(store)
    if not ood_datasets:
        raise OodbenchError("no OOD datasets given: pass at least one --ood")
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
    keys = {name: _fingerprint(store, model_id, names, name, params) for name, params in plan.items()}

    cached: dict[str, dict[str, np.ndarray]] = {}
    run_dir = Path(out_dir) if out_dir is not None else None
    previous_keys: dict[str, str] = {}
    if run_dir is not None and (run_dir / "run.json").is_file():
        previous_keys = json.loads((run_dir / "run.json").read_text()).get("score_keys", {})
        for dataset in [id_dataset, *ood_datasets]:
            if score_path(run_dir, model_id, dataset).is_file():
                saved = load_scores(run_dir, model_id, dataset)
                cached[dataset] = {d: s for d, s in saved.items() if previous_keys.get(d) == keys.get(d)}

    def persist(name: str, per_dataset: Mapping[str, np.ndarray]) -> None:
        # Saved as soon as a detector finishes, so an interrupted run resumes from the next detector.
        if run_dir is None:
            return
        for dataset, values in per_dataset.items():
            save_scores(run_dir, model_id, dataset, {name: values})
        previous_keys[name] = keys[name]
        _write_run_json(
            run_dir, store, model_id, fit_dataset, id_dataset, ood_datasets, plan, previous_keys, complete=False
        )

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
    )
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Rewrite each score file with exactly this run's detectors, so scores of detectors dropped since an
        # earlier run in the same directory cannot leak into analyses that read every saved score.
        for dataset, per_detector in result.scores.items():
            if per_detector:
                save_scores(run_dir, model_id, dataset, per_detector, replace=True)
        write_rows(result.rows, run_dir / "results.parquet")
        atomic_write_text(run_dir / "table.md", result.table_markdown)
        ran_keys = {name: keys[name] for name in plan if name not in result.skipped}
        _write_run_json(
            run_dir,
            store,
            model_id,
            fit_dataset,
            id_dataset,
            ood_datasets,
            plan,
            ran_keys,
            complete=True,
            skipped=result.skipped,
        )
        result.run_dir = run_dir
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
        "skipped_detectors": dict(skipped or {}),
        "score_keys": dict(score_keys),
        "head": store.head_meta(model_id) if store.has_head(model_id) else None,
        "entries": entries,
        "complete": complete,
    }


def _write_run_json(
    run_dir: Path,
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
) -> None:
    atomic_write_json(
        run_dir / "run.json",
        run_description(
            store, model_id, fit_dataset, id_dataset, ood_datasets, plan, score_keys, complete=complete, skipped=skipped
        ),
    )
