"""The one fit-and-score engine: a model's inputs loaded once, (model, detector) units, their keys, the run writer.

`oodbench evaluate` (`evaluate_store`), `evaluate_outputs`, `oodbench evaluate-model` and every fit unit of
`oodbench run` go through here:

- `ModelInputs`: one model's store entries and head, each entry's meta.json parsed once and its arrays opened
  (sizes, headers, shapes checked), NaN-checked and checked against the head once, then shared by every detector
  (and by every runner unit of the model that this process runs);
- `fit_and_score`: one detector fitted on the fit set and scored on each test set; `evaluate_inputs` runs it for
  every detector of an `EvaluationSpec` (one shared pass over the fit set for their statistics);
- `score_key`: the content key of a detector's saved scores: its resolved parameters, its code version and the
  inputs' checksums;
- `result_tables`: the tidy rows and the table of the finished detectors (the FPR named by its rate: `fpr95` at
  the default 0.95, `fpr80` at 0.8);
- `RunWriter`: the one writer of an evaluation's run directory (scores as each detector finishes, then rows,
  table and run.json, which records the FPR's rate as ``tpr``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .. import detectors as detector_registry
from ..core.errors import DetectorError, OodbenchError, StoreError
from ..core.grouped import run_tables_markdown
from ..core.metrics import CONVENTIONS, DEFAULT_TPR, fpr_metric, stated_tpr
from ..core.outputs import Head, Outputs
from ..core.results import ResultRow, metric_rows
from ..core.rundir import RunDir
from ..core.store import Store
from ..detectors.shared import FitStatistics, gram_key
from ..util.progress import note_work, progress_bar
from .spec import EvaluationSpec

__all__ = [
    "ModelInputs",
    "RunWriter",
    "detector_code_version",
    "evaluate_inputs",
    "fit_and_score",
    "result_tables",
    "rows_at_tpr",
    "score_key",
]

log = logging.getLogger(__name__)

Scores = dict[str, dict[str, np.ndarray]]  # dataset -> detector -> per-image scores


class ModelInputs:
    """One model's inputs, each loaded once: store entries (or given `Outputs`), the head, shared fit statistics."""

    def __init__(
        self,
        store: Store | None,
        model_id: str,
        *,
        sets: Mapping[str, Outputs] | None = None,
        head: Head | None = None,
        verify: bool = False,
    ) -> None:
        self.store, self.model_id, self.verify = store, model_id, verify
        self._outputs: dict[str, Outputs] = dict(sets or {})
        self._meta: dict[str, dict[str, Any]] = {}
        self._head: tuple[Head | None] | None = (head,) if store is None else None
        self._head_checked: set[str] = set()
        self._stats: tuple[tuple[str, str], FitStatistics] | None = None

    @classmethod
    def from_outputs(cls, sets: Mapping[str, Outputs], head: Head | None, model_id: str = "model") -> ModelInputs:
        """Inputs held in memory (`evaluate_outputs`): nothing is read; the head is checked against each set once."""
        return cls(None, model_id, sets=sets, head=head)

    # ------------------------------------------------------------------ what is there
    def meta(self, dataset: str) -> dict[str, Any]:
        """The store entry's meta.json, parsed once."""
        if dataset not in self._meta:
            assert self.store is not None, "inputs given in memory have no store metadata"
            self._meta[dataset] = self.store.meta(self.model_id, dataset)
        return self._meta[dataset]

    @property
    def has_head(self) -> bool:
        """Whether the model has a head (stored, or given)."""
        if self._head is not None:
            return self._head[0] is not None
        assert self.store is not None
        return self.store.has_head(self.model_id)

    @property
    def head(self) -> Head | None:
        """The model's head, read once (every byte checked with `verify`)."""
        if self._head is None:
            assert self.store is not None
            has = self.store.has_head(self.model_id)
            self._head = (self.store.read_head(self.model_id, verify=self.verify) if has else None,)
        return self._head[0]

    def arrays(self, dataset: str) -> set[str]:
        """The names of a dataset's arrays (features, logits, labels, extra.*) without reading them."""
        if dataset in self._outputs:
            return self._outputs[dataset].array_names()
        return set(self.meta(dataset).get("arrays", {})) - {"index"}

    def outputs(self, dataset: str) -> Outputs:
        """A dataset's arrays: opened, checked finite and checked against the head once, then shared."""
        if dataset not in self._outputs:
            assert self.store is not None
            self.meta(dataset)  # parsed once, and a clear error for a missing entry
            self._outputs[dataset] = self.store.read(self.model_id, dataset, verify=self.verify)
        if dataset not in self._head_checked:
            head = self.head
            if head is not None:
                try:
                    head.check_outputs(self._outputs[dataset])
                except ValueError as exc:
                    raise StoreError(f"{self.model_id}/{dataset}: {exc}") from exc
            self._head_checked.add(dataset)
        return self._outputs[dataset]

    def check_compatible(self, datasets: Sequence[str]) -> None:
        """The entries come from one checkpoint and preprocessing (`Store.check_compatible`)."""
        if self.store is not None:
            self.store.check_compatible(*[(self.model_id, name) for name in dict.fromkeys(datasets)])

    def fit_statistics(
        self, fit: str, detectors: Sequence[detector_registry.Detector], gram_dtype: str = "float64"
    ) -> FitStatistics:
        """One provider of the statistics `detectors` share on the fit set (`detectors.shared`), made once."""
        if self._stats is None or self._stats[0] != (fit, gram_dtype):
            self._stats = None  # the previous provider's statistics go before these are computed
            provider = FitStatistics.for_detectors(self.outputs(fit), detectors, self.head, gram_dtype=gram_dtype)
            self._stats = ((fit, gram_dtype), provider)
        return self._stats[1]

    def identity(self, dataset: str) -> list[Any]:
        """What identifies an entry's content in a key: rows, items, provenance, array checksums, when written."""
        meta = self.meta(dataset)
        checksums = {name: spec.get("sha256") for name, spec in sorted(meta.get("arrays", {}).items())}
        return [
            dataset,
            meta.get("finished"),
            meta.get("num_rows"),
            meta.get("provenance"),
            meta.get("item_hash"),
            checksums,
        ]


# ----------------------------------------------------------------------------------------------- keys
@functools.cache
def _source_hash(cls: type) -> str:
    """SHA-256 of the file defining a detector class (its code), or of its qualified name when there is none."""
    try:
        source = inspect.getsourcefile(cls)
        data = Path(source).read_bytes() if source else cls.__qualname__.encode()
    except (OSError, TypeError):
        data = cls.__qualname__.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def detector_code_version(name: str) -> str:
    """The version of a detector's code a key includes: a plugin's distribution, version and source hash; for a
    built-in, oodbench's version and the hash of the module that defines it (an edited detector recomputes)."""
    plugin = detector_registry.detector_fingerprint(name)
    if plugin is not None:
        return plugin
    return f"oodbench=={__version__}+{_source_hash(detector_registry.get_class(name))}"


def score_key(
    inputs: ModelInputs, datasets: Sequence[str], name: str, resolved: Mapping[str, Any], gram_dtype: str = "float64"
) -> str:
    """Content key of one detector's saved scores: the inputs' checksums, the head, the detector's resolved
    parameters (defaults filled in) and code version, and a float32 Gram where it changes the fit."""
    digest = hashlib.sha256()
    for dataset in datasets:
        digest.update(json.dumps(inputs.identity(dataset), sort_keys=True, default=str).encode())
    if inputs.store is not None and inputs.store.has_head(inputs.model_id):
        head = inputs.store.head_meta(inputs.model_id)
        digest.update(json.dumps([head.get("written"), head.get("arrays")], sort_keys=True, default=str).encode())
    digest.update(json.dumps([name, dict(resolved)], sort_keys=True, default=str).encode())
    digest.update(detector_code_version(name).encode())
    precision = gram_key(detector_registry.get_class(name), gram_dtype)
    if precision is not None:
        digest.update(precision.encode())
    return digest.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- fit and score
def fit_and_score(
    detector: detector_registry.Detector,
    inputs: ModelInputs,
    fit: str,
    datasets: Sequence[str],
    *,
    stats: FitStatistics | None = None,
    on_fitted: Callable[[detector_registry.Detector], None] | None = None,
) -> dict[str, np.ndarray]:
    """Fit `detector` on the fit set `fit` (never a test set) and score each of `datasets`: {dataset: scores}."""
    if fit in datasets:
        raise OodbenchError(f"the fit set {fit!r} is also a test set: a detector is never scored on what it fitted")
    fitted = detector.fit(inputs.outputs(fit), inputs.head, stats=stats)
    if on_fitted is not None:
        on_fitted(fitted)
    return {dataset: fitted.score(inputs.outputs(dataset)) for dataset in datasets}


def _failure(exc: Exception) -> str:
    """One line for a detector's failure: the message of an expected error, else the type and the message."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, OodbenchError) else f"{type(exc).__name__}: {text}"


def unmet_reasons(inputs: ModelInputs, spec: EvaluationSpec) -> dict[str, str]:
    """{detector: why its requirements are not met by the arrays ('' when they are)}, read from the metadata."""
    tests = {dataset: inputs.arrays(dataset) for dataset in spec.scored}
    fit = inputs.arrays(spec.fit)
    return {
        name: "; ".join(detector_registry.create(name, **params).unmet(fit, tests, has_head=inputs.has_head))
        for name, params in spec.detectors.items()
    }


def evaluate_inputs(
    inputs: ModelInputs,
    spec: EvaluationSpec,
    *,
    model: str,
    progress: bool = True,
    cached: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    on_detector_done: Callable[[str, Mapping[str, np.ndarray]], None] | None = None,
    on_detector_fitted: Callable[[str, detector_registry.Detector], None] | None = None,
) -> tuple[Scores, dict[str, str], dict[str, str], list[str]]:
    """Every detector of `spec` fitted once and scored on every test set; (scores, skipped, failed, ran).

    Detectors whose requirements the arrays cannot meet are skipped (raise with ``spec.strict``); a detector whose
    fit or scoring raises is recorded as failed while the others go on. ``cached`` maps dataset -> detector ->
    scores to reuse. When no detector runs, `NothingEvaluated` lists every reason.
    """
    from .evaluate import nothing_evaluated  # the error's home is the public module

    plan = spec.detectors
    datasets = spec.scored
    instances = {name: detector_registry.create(name, **params) for name, params in plan.items()}
    scores: Scores = {name: {} for name in datasets}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    cached = cached or {}
    lengths = {ds: len(inputs.outputs(ds)) for ds in datasets}
    reuse = {n: all(n in cached.get(ds, {}) and len(cached[ds][n]) == lengths[ds] for ds in datasets) for n in plan}
    unmet = unmet_reasons(inputs, spec)
    for name, reason in unmet.items():
        if reason and spec.strict:
            raise DetectorError(f"{name} cannot run: {reason}")
    if all(unmet.values()):
        raise nothing_evaluated(unmet, {})  # before any fit
    to_fit = [instances[n] for n in plan if not reuse[n] and not unmet[n]]
    # The detectors to fit share one pass over the fit set for their sufficient statistics (detectors.shared).
    shared = inputs.fit_statistics(spec.fit, to_fit, spec.gram_dtype) if to_fit else None
    del to_fit  # it would keep every fitted detector alive to the end of the loop
    with progress_bar(progress) as bar:
        task = bar.add_task("detectors", total=len(plan))
        for name in plan:
            bar.update(task, description=f"{name}")
            # Taken out of the dict: a fitted detector is freed once it has scored (knn's index is the fit set).
            instance = instances.pop(name)
            if unmet[name]:
                skipped[name] = unmet[name]
            elif reuse[name]:
                for ds in datasets:
                    scores[ds][name] = np.asarray(cached[ds][name])
            else:
                fitted_hook = None
                if on_detector_fitted is not None:
                    fitted_hook = functools.partial(on_detector_fitted, name)
                try:
                    per_dataset = fit_and_score(
                        instance, inputs, spec.fit, datasets, stats=shared, on_fitted=fitted_hook
                    )
                except Exception as exc:
                    # One detector's failure keeps none of its scores and stops none of the others.
                    if spec.strict:
                        raise
                    log.debug("detector %s failed", name, exc_info=True)
                    failed[name] = _failure(exc)
                    bar.advance(task)
                    continue
                for ds, values in per_dataset.items():
                    scores[ds][name] = values
                if on_detector_done is not None:
                    on_detector_done(name, per_dataset)
            del instance  # before the next fit, not after it
            bar.advance(task)
    ran = [name for name in plan if name not in skipped and name not in failed]
    if not ran:
        raise nothing_evaluated(skipped, failed)
    return scores, skipped, failed, ran


def result_tables(
    model: str, spec: EvaluationSpec, ran: Sequence[str], scores: Mapping[str, Mapping[str, np.ndarray]]
) -> tuple[list[ResultRow], str]:
    """The tidy rows (oodbench's convention and the spec's, the FPR named by `spec.tpr`: `rows_at_tpr`) and the
    table.md text of the detectors that ran."""
    rows = metric_rows(model, spec.id, list(spec.ood), list(ran), scores, spec.tpr, spec.conventions)
    table = run_tables_markdown(
        rows,
        list(ran),
        list(spec.ood),
        convention=spec.convention,
        aupr=spec.aupr,
        groups=spec.groups,
        csid_datasets=list(spec.csid),
        scores=scores,
        tpr=spec.tpr,
    )
    return rows_at_tpr(rows, spec.tpr), table


def _fpr_names(tpr: float) -> dict[str, str]:
    # The FPR in each convention: its name in a computation (fpr95) -> its stored name at `tpr`.
    plain, stored = "fpr95", fpr_metric(tpr)
    return {plain: stored, **{f"{c}.{plain}": f"{c}.{stored}" for c in CONVENTIONS[1:]}}


def rows_at_tpr(rows: Iterable[ResultRow], tpr: float) -> list[ResultRow]:
    """Rows with the FPR renamed to state the rate it was taken at (``fpr95`` -> ``fpr80`` at 0.8; the same rows
    at 0.95), so that a result file never calls an FPR at another rate FPR@95."""
    names = _fpr_names(tpr)
    return [replace(r, metric=names[r.metric]) if r.metric in names else r for r in rows]


# ----------------------------------------------------------------------------------------------- run directory
class RunWriter:
    """The one writer of an evaluation's run directory: each detector's scores as it finishes (with its key in
    run.json, so an interrupted run resumes), then every score, the rows, the table and the final run.json.

    run.json records ``tpr``, the ID acceptance rate of the FPR threshold: `tpr` when given, else (at `finish`) the
    rate the rows' FPR names state (`result_tables` names them so)."""

    def __init__(
        self,
        run_dir: RunDir,
        model: str,
        describe: Callable[..., dict[str, Any]],
        *,
        topic: str = "detectors",
        tpr: float | None = None,
    ) -> None:
        self.run_dir, self.model, self.describe, self.topic, self.tpr = run_dir, model, describe, topic, tpr
        self.done: dict[str, str] = {}

    def _info(self, score_keys: Mapping[str, str], **status: Any) -> dict[str, Any]:
        info = dict(self.describe(score_keys, **status))
        if self.tpr is not None:
            info["tpr"] = float(self.tpr)  # what the report reads to label the FPR (and its tables agree on)
        return info

    def resume(self, datasets: Sequence[str], keys: Mapping[str, str]) -> Scores:
        """The saved scores whose recorded key still matches (`RunDir.resume`)."""
        cached, self.done = self.run_dir.resume(self.model, datasets, keys)
        return cached

    def detector_done(self, name: str, per_dataset: Mapping[str, np.ndarray], key: str) -> None:
        """Save one detector's scores and record its key (run.json, ``complete: false``)."""
        for dataset, values in per_dataset.items():
            self.run_dir.save_scores(self.model, dataset, {name: values})
        self.done[name] = key
        self.run_dir.write_info(self._info(self.done, complete=False))
        note_work(self.topic, finished=f"detectors {', '.join(self.done)}", kept=f"their scores in {self.run_dir.path}")

    def finish(
        self,
        rows: Sequence[ResultRow],
        scores: Mapping[str, Mapping[str, np.ndarray]],
        table: str,
        score_keys: Mapping[str, str],
        **status: Any,
    ) -> None:
        """Every dataset's scores, the rows and the table, then run.json with the finished detectors' keys."""
        if self.tpr is None:
            # Front ends that do not pass the rate: the rows' FPR names state it (the default when they hold none).
            self.tpr = stated_tpr(r.metric for r in rows) or DEFAULT_TPR
        self.run_dir.write_results(self.model, rows, scores, table)
        self.run_dir.write_info(self._info(score_keys, **status))
