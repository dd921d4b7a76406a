"""The plan of an experiment: every unit of work per stage, its content key, size and whether it is already done.

Stages, in order: ``extract`` (one unit per (model, dataset): a store entry; plus one ``probe`` unit per probed
backbone and derived subsets), ``fit`` (one per (classifier, detector)), ``score`` (one per (classifier, detector,
dataset), and one zero-shot unit per VLM), ``metrics`` (one run directory per model, then the combined results),
``analysis`` (one unit per analysis and model) and ``report``.

Keys are content addresses of a unit's inputs: a unit's key hashes its own parameters and the keys of the units it
reads, so changing a model, a dataset definition or a detector's hyper-parameter changes exactly the keys
downstream of it. A unit is *cached* when the ledger holds a record with its key and its outputs verify.

Fitted detectors are not persisted by default (k-NN keeps the whole fit set; refitting is cheaper than storing
it): a fit unit is cached when every score unit it feeds is, and otherwise runs together with its pending score
units. ``[detectors] save = true`` keeps each fitted detector under ``<workdir>/detectors/<model>/<detector>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.errors import StoreError
from ..core.store import Store
from ..text.templates import SEED_TEMPLATES
from .config import ExperimentConfig, ModelSpec, missing_roots
from .ledger import Ledger, content_key
from .units import (
    DONE,
    STAGES,
    AnalysisUnit,
    CombineUnit,
    ExtractUnit,
    FitUnit,
    HeadUnit,
    MetricsUnit,
    ReportUnit,
    ScoreUnit,
    Unit,
    UnitKeys,
    ZeroShotUnit,
    recorded_status,
)

__all__ = ["STAGES", "Unit", "Plan", "build_plan", "layout", "Layout", "format_plan", "skip_line"]


@dataclass(frozen=True)
class Layout:
    """Where an experiment's outputs live under its work directory."""

    workdir: Path
    store: Path

    @property
    def ledger(self) -> Path:
        return self.workdir / "ledger"

    def score_file(self, model: str, detector: str, dataset: str) -> Path:
        """Per-image scores of one (model, detector, dataset) unit."""
        return self.workdir / "units" / "scores" / model / detector / f"{dataset}.npy"

    def detector_dir(self, model: str, detector: str) -> Path:
        """A fitted detector kept by ``[detectors] save = true`` (load with oodbench.detectors.load)."""
        return self.workdir / "detectors" / model / detector

    def run_dir(self, model: str) -> Path:
        """The evaluation run directory of one model (the layout of `oodbench evaluate --out`)."""
        return self.workdir / "runs" / model

    @property
    def results(self) -> Path:
        """All models' tidy result rows."""
        return self.workdir / "results.parquet"

    @property
    def analysis(self) -> Path:
        return self.workdir / "analysis"

    @property
    def report(self) -> Path:
        return self.workdir / "report"

    @property
    def vocabularies(self) -> Path:
        return self.workdir / "vocab"


REPORT_FORMATS = {"markdown": "md", "latex": "tex", "html": "html"}


def report_files(config: ExperimentConfig) -> list[Path]:
    """The report documents a run writes (one per format)."""
    out = layout(config).report
    return [out / f"report.{REPORT_FORMATS[f]}" for f in config.report["formats"]]


def layout(config: ExperimentConfig) -> Layout:
    """The output layout of a config."""
    return Layout(Path(config.workdir), Path(config.store))


@dataclass
class Plan:
    """All units of an experiment in stage order, with the input problems found while planning."""

    config: ExperimentConfig
    layout: Layout
    units: list[Unit]
    problems: dict[str, str] = field(default_factory=dict)  # config key -> problem (missing roots …)
    _by_id: dict[str, Unit] = field(default_factory=dict, repr=False)

    def stage(self, name: str) -> list[Unit]:
        """Units of one stage, in plan order."""
        return [u for u in self.units if u.stage == name]

    def get(self, unit_id: str) -> Unit:
        """The unit with this id (KeyError if none)."""
        if len(self._by_id) != len(self.units):
            self._by_id = {u.id: u for u in self.units}
        return self._by_id[unit_id]

    def pending(self, stage: str | None = None) -> list[Unit]:
        """Units that must run (optionally of one stage)."""
        return [u for u in self.units if u.todo and (stage is None or u.stage == stage)]

    def summary(self) -> dict[str, dict[str, int]]:
        """{stage: {status: count, 'units': n}}."""
        out: dict[str, dict[str, int]] = {}
        for stage in STAGES:
            counts: dict[str, int] = {"units": 0}
            for unit in self.stage(stage):
                counts["units"] += 1
                counts[unit.status] = counts.get(unit.status, 0) + 1
            out[stage] = counts
        return out


# ----------------------------------------------------------------------------------------------- sizes
def _complete_meta(store: Store, model: str, dataset: str) -> dict[str, Any] | None:
    """The metadata of a complete store entry, else None."""
    try:
        return store.meta(model, dataset) if store.exists(model, dataset) else None
    except StoreError:
        return None


def _entry_size(meta: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, bytes) of a store entry."""
    nbytes = 0
    for spec in meta.get("arrays", {}).values():
        count = 1
        for dim in spec["shape"]:
            count *= int(dim)
        nbytes += count * _itemsize(spec["dtype"])
    return int(meta.get("num_rows", 0)), nbytes


def _itemsize(dtype: str) -> int:
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def fingerprint(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies a store entry's content (stable across re-extraction with identical inputs)."""
    return {
        "item_hash": meta.get("item_hash"),
        "num_rows": meta.get("num_rows"),
        "provenance": {k: meta.get("provenance", {}).get(k) for k in ("model", "checkpoint", "preprocessing")},
    }


# ----------------------------------------------------------------------------------------------- extraction
def _extract_datasets(config: ExperimentConfig, model: ModelSpec) -> list[str]:
    """Datasets a model needs in its store, parents of subsets first."""
    wanted = config.datasets_of(model)
    ordered: list[str] = []
    for name in wanted:
        parent = config.datasets[name].parent
        if parent is not None and parent not in ordered:
            ordered.append(parent)
        if name not in ordered:
            ordered.append(name)
    return ordered


def _plan_extract(config: ExperimentConfig, store: Store, ledger: Ledger, units: list[Unit], keys: UnitKeys) -> None:
    for model in config.models.values():
        identity = model.extract_identity()
        per_row: int | None = None
        model_units: list[ExtractUnit] = []
        for dataset in _extract_datasets(config, model):
            if (model.store_id, dataset) in keys.entries:
                continue  # a backbone shared by several probes is extracted once
            unit, meta = _plan_entry(config, model, identity, dataset, store, ledger, keys)
            if meta is not None and unit.items:  # its size is known: it is the model's bytes per row
                per_row = unit.nbytes // unit.items if unit.nbytes else per_row
            model_units.append(unit)
        for unit in model_units:
            if unit.nbytes is None and per_row and unit.items:
                unit.nbytes = per_row * unit.items
                unit.estimated_bytes = True
        units.extend(model_units)
        if model.kind_of.trains_head:
            units.append(_plan_head(config, model, store, ledger, units, keys))


def _plan_entry(
    config: ExperimentConfig,
    model: ModelSpec,
    identity: Mapping[str, Any],
    dataset: str,
    store: Store,
    ledger: Ledger,
    keys: UnitKeys,
) -> tuple[ExtractUnit, dict[str, Any] | None]:
    """The unit of one store entry (extracted, or derived from its parent's entry), and its metadata when complete."""
    sid = model.store_id
    spec = config.datasets[dataset]
    parent_key = keys.entries.get((sid, spec.parent)) if spec.parent is not None else None
    key = content_key("extract", identity, spec.identity(), parent_key, _list_files_identity(spec.params))
    keys.entries[(sid, dataset)] = key
    unit = ExtractUnit(
        label=f"{sid}/{dataset}",
        key=key,
        model=sid,
        dataset=dataset,
        deps=(f"extract:{sid}/{spec.parent}",) if parent_key else (),
        step="derive" if spec.parent is not None else "extract",
        model_id=model.id,
        model_key=content_key("model", identity),
    )
    meta = _complete_meta(store, sid, dataset)
    rows, nbytes = _entry_size(meta) if meta is not None else (None, None)
    unit.items = rows if rows is not None else spec.kind_of.count(spec, config)
    unit.nbytes = nbytes
    _entry_status(unit, ledger.read("extract", unit.label), meta, model, store)
    return unit, meta


def _entry_status(
    unit: ExtractUnit, record: Mapping[str, Any] | None, meta: Mapping[str, Any] | None, model: ModelSpec, store: Store
) -> None:
    """A store entry's status: its record's key and the entry's fingerprint, or an entry made outside the runner."""
    if meta is not None and record is not None and record.get("key") == unit.key:
        unit.status = "cached" if record.get("fingerprint") == fingerprint(meta) else "stale"
        if unit.status == "stale":
            unit.note = "store entry changed since it was recorded"
    elif meta is not None and record is None and unit.step == "extract" and model.kind_of.adoptable(model, store, meta):
        unit.status, unit.note = "cached", "found in store"
        unit.adopt = fingerprint(meta)
    elif record is not None or meta is not None:
        unit.status = "stale"
        unit.note = "recorded with other inputs" if record is not None else "store entry has other provenance"
        if record is not None and record.get("model_key") != unit.model_key:
            unit.model_changed = True


def _plan_head(
    config: ExperimentConfig, model: ModelSpec, store: Store, ledger: Ledger, units: list[Unit], keys: UnitKeys
) -> HeadUnit:
    """The unit training a probe's head on its backbone's entries; the probe's entries are keyed by it."""
    sid = model.store_id
    datasets = config.datasets_of(model)
    key = content_key("probe", model.identity(), [keys.entries[(sid, d)] for d in datasets])
    for dataset in datasets:
        keys.entries[(model.id, dataset)] = content_key("probe-entry", key, keys.entries[(sid, dataset)])
    unit = HeadUnit(
        label=f"{model.id}/probe",
        key=key,
        model=model.id,
        dataset=config.fit,
        deps=tuple(f"extract:{sid}/{d}" for d in datasets),
        items=next((u.items for u in units if u.id == f"extract:{sid}/{config.fit}"), None),
        model_id=model.id,
    )
    complete = store.has_head(model.id) and all(store.exists(model.id, d) for d in datasets)
    unit.status = recorded_status(ledger, unit, complete)
    return unit


def _list_files_identity(params: Mapping[str, Any]) -> dict[str, list[str | None]]:
    """SHA-256 of each list file's content (None when absent): a subset is addressed by what its lists say."""
    import hashlib

    identity: dict[str, list[str | None]] = {}
    for which in ("include", "exclude"):
        hashes: list[str | None] = []
        for file in params.get(which, []):
            path = Path(file)
            hashes.append(hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
        if hashes:
            identity[which] = hashes
    return identity


# ----------------------------------------------------------------------------------------------- fit and score
def _model_arrays(store: Store, model: str, datasets: Iterable[str]) -> dict[str, set[str]] | None:
    """Array names (features, logits, labels, extra.*) of each entry, when all are extracted."""
    arrays: dict[str, set[str]] = {}
    for dataset in datasets:
        try:
            if not store.exists(model, dataset):
                return None
            arrays[dataset] = set(store.meta(model, dataset).get("arrays", {})) - {"index"}
        except StoreError:
            return None
    return arrays


def skip_reason(
    detector: str, params: Mapping[str, Any], arrays: Mapping[str, set[str]], fit: str, has_head: bool
) -> str | None:
    """Why a detector (with these hyper-parameters) cannot run on a model's arrays (`Detector.unmet`), or None."""
    from .. import detectors as registry

    tests = {dataset: names for dataset, names in arrays.items() if dataset != fit}
    return "; ".join(registry.create(detector, **params).unmet(arrays[fit], tests, has_head=has_head)) or None


@dataclass
class _Classifier:
    """What the fit and score units of one classifier share."""

    model: ModelSpec
    arrays: dict[str, set[str]] | None  # array names per entry, once every entry it reads is extracted
    has_head: bool
    fit_deps: tuple[str, ...]  # its fit set's extraction (and its head's training)
    items: dict[str, int | None]  # images per dataset


def _classifier(config: ExperimentConfig, store: Store, model: ModelSpec, extract: Mapping[str, Unit]) -> _Classifier:
    sid = model.store_id
    datasets = [config.fit, *config.scored]
    probe = (f"extract:{model.id}/probe",) if model.kind_of.trains_head else ()
    extract_ids = {f"extract:{sid}/{d}" for d in datasets} | set(probe)
    extract_done = all(extract[i].status in DONE for i in extract_ids if i in extract)
    arrays = _model_arrays(store, model.id, datasets) if extract_done else None
    return _Classifier(
        model,
        arrays,
        store.has_head(model.id) if arrays is not None else False,
        (f"extract:{sid}/{config.fit}",) + probe,
        {d: extract[f"extract:{sid}/{d}"].items for d in datasets},
    )


def _fit_key(
    config: ExperimentConfig, model: ModelSpec, detector: str, params: Mapping[str, Any], keys: UnitKeys
) -> str:
    from .. import detectors as detector_registry
    from ..detectors.shared import gram_key
    from ..evaluation.engine import detector_code_version

    # Resolved parameters (config.detectors) and the detector's code version: a changed default or an edited
    # detector recomputes (the same parts as `oodbench evaluate`'s score keys, evaluation.engine.score_key).
    fit_key = content_key(
        "fit", keys.entries[(model.id, config.fit)], detector, params, detector_code_version(detector)
    )
    precision = gram_key(detector_registry.get_class(detector), config.gram_dtype)
    if precision is not None:
        fit_key = content_key(fit_key, precision)
    if config.evaluation.small_fit_set != "fail":
        fit_key = content_key(fit_key, "small_fit_set", config.evaluation.small_fit_set)
    keys.fits[(model.id, detector)] = fit_key
    return fit_key


def _plan_fit_score(
    config: ExperimentConfig, lay: Layout, store: Store, ledger: Ledger, units: list[Unit], keys: UnitKeys
) -> None:
    fit_units: list[FitUnit] = []
    score_units: list[ScoreUnit] = []
    extract_units = {u.id: u for u in units if u.stage == "extract"}
    for model in config.classifiers:
        classifier = _classifier(config, store, model, extract_units)
        for detector, params in config.detectors.items():
            fit_unit = FitUnit(
                label=f"{model.id}/{detector}",
                key=_fit_key(config, model, detector, params, keys),
                model=model.id,
                detector=detector,
                items=classifier.items[config.fit],
                deps=classifier.fit_deps,
                params=params,
            )
            fit_units.append(fit_unit)
            score_units += _plan_scores(config, lay, ledger, classifier, fit_unit, keys)
    units.extend(fit_units)
    units.extend(score_units)


def _plan_scores(
    config: ExperimentConfig, lay: Layout, ledger: Ledger, classifier: _Classifier, fit_unit: FitUnit, keys: UnitKeys
) -> list[ScoreUnit]:
    """The score units one fitted detector feeds; the fit unit is done when all of them are."""
    model, detector, arrays = classifier.model, fit_unit.detector or "", classifier.arrays
    reason = (
        skip_reason(detector, fit_unit.params, arrays, config.fit, classifier.has_head) if arrays is not None else None
    )
    mine: list[ScoreUnit] = []
    for dataset in config.scored:
        unit = ScoreUnit(
            label=f"{model.id}/{detector}/{dataset}",
            # Per-image scores do not depend on the threshold's TPR: it enters the metrics' keys, not these.
            key=content_key("score", fit_unit.key, keys.entries[(model.id, dataset)]),
            model=model.id,
            detector=detector,
            dataset=dataset,
            deps=fit_unit.deps + (f"extract:{model.store_id}/{dataset}",),
            items=classifier.items[dataset],
        )
        _score_status(config, lay, unit, ledger.read("score", unit.label))
        if unit.todo and reason is not None:
            unit.note = f"will be skipped: {reason}"
        mine.append(unit)
    if all(u.status == "skipped" for u in mine):
        fit_unit.status, fit_unit.note = "skipped", mine[0].note
    elif all(u.status in DONE for u in mine):
        fit_unit.status = "cached"
    elif reason is not None:
        fit_unit.note = f"will be skipped: {reason}"
    return mine


def _score_status(config: ExperimentConfig, lay: Layout, unit: ScoreUnit, record: Mapping[str, Any] | None) -> None:
    """A score unit's status: its record's key, a recorded skip, or per-image scores that verify."""
    model, detector, dataset = unit.model or "", unit.detector or "", unit.dataset or ""
    if record is not None and record.get("key") != unit.key:
        unit.status = "stale"
    elif record is not None and record.get("skipped"):
        unit.status, unit.note = "skipped", record["skipped"]
    elif record is not None and _scores_verify(lay.score_file(model, detector, dataset), record):
        unit.status = "cached"
        unit.nbytes = lay.score_file(model, detector, dataset).stat().st_size
        if config.save_detectors and not (lay.detector_dir(model, detector) / "detector.json").is_file():
            unit.status = "stale"  # the scores are there, the fitted detector to keep is not


def _scores_verify(path: Path, record: Mapping[str, Any]) -> bool:
    """The recorded per-image scores file exists and has the recorded length."""
    if not path.is_file():
        return False
    try:
        import numpy as np

        return int(np.load(path, mmap_mode="r").shape[0]) == int(record.get("rows", -1))
    except (OSError, ValueError):
        return False


def vocab_store_root(config: ExperimentConfig) -> Path:
    """Where `ref` vocabularies are looked up."""
    spec = config.zeroshot
    return Path(spec.vocab_store) if spec is not None and spec.vocab_store else layout(config).vocabularies


def load_ref_vocabularies(config: ExperimentConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """({name: Vocabulary} for the `ref` vocabularies found, {config key: problem} for those that are not)."""
    spec = config.zeroshot
    found: dict[str, Any] = {}
    problems: dict[str, str] = {}
    if spec is None or not any("ref" in v for v in spec.vocabularies.values()):
        return found, problems
    from ..core.errors import ZeroShotError
    from ..zeroshot.vocab.artefact import VocabStore

    store = VocabStore(vocab_store_root(config))
    for name, vocab in spec.vocabularies.items():
        if "ref" in vocab:
            try:
                found[name] = store.load(vocab["ref"])
            except ZeroShotError as exc:
                problems[f"zeroshot.vocabularies.{name}.ref"] = str(exc)
                continue
            if vocab.get("kind") not in (None, found[name].kind):
                problems[f"zeroshot.vocabularies.{name}.kind"] = (
                    f"declared {vocab['kind']!r} but the stored vocabulary {vocab['ref']!r} is a {found[name].kind!r} list"
                )
    return found, problems


def zeroshot_columns(config: ExperimentConfig, refs: Mapping[str, Any]) -> list[str]:
    """The detector columns a VLM's zero-shot run will have (names as in its result rows)."""
    spec = config.zeroshot
    if spec is None:
        return []
    from ..zeroshot.scores import SCORES

    columns = [name for name in spec.scores if SCORES[name].vocabulary is None]
    for name, vocab in spec.vocabularies.items():
        kind = refs[name].kind if name in refs else vocab.get("build") or vocab.get("kind", "custom")
        vocab_name = refs[name].name if name in refs else name
        score = "eoe" if kind == "eoe" else "neglabel"
        if score not in spec.scores:
            continue
        columns.append(f"{score}@{vocab_name}")
        per_class = kind in ("siblings", "union") if name not in refs else refs[name].per_class is not None
        ranked = kind in ("wordnet", "union") if name not in refs else refs[name].ranked is not None
        if per_class:
            columns.extend(f"{score}@{vocab_name}[k={k}]" for k in spec.sweep_k)
        if ranked:
            columns.extend(f"{score}@{vocab_name}[m={m}]" for m in spec.sweep_m)
    return columns


def vlm_columns(config: ExperimentConfig, refs: Mapping[str, Any]) -> dict[str, tuple[list[str], str]]:
    """Per VLM: (its zero-shot columns, how its GL-MCM patch embeddings are made or why it has none)."""
    columns = zeroshot_columns(config, refs)
    out: dict[str, tuple[list[str], str]] = {}
    for model_id in config.zeroshot.models if config.zeroshot else ():
        spec = config.models[model_id]
        route, description = spec.kind_of.patch_route(spec)
        if route is None:
            out[model_id] = ([c for c in columns if c != "glmcm"], f"no GL-MCM: {description}")
        else:
            out[model_id] = (list(columns), f"GL-MCM patches ({route}): {description}")
    return out


def _plan_zeroshot(
    config: ExperimentConfig,
    lay: Layout,
    ledger: Ledger,
    units: list[Unit],
    keys: UnitKeys,
    problems: dict[str, str],
) -> None:
    spec = config.zeroshot
    if spec is None:
        return
    refs, missing = load_ref_vocabularies(config)
    problems.update(missing)
    ref_hashes = {name: vocab.hash for name, vocab in refs.items()}
    per_model = vlm_columns(config, refs)
    datasets = [config.id_test, *config.ood]
    for model_id in spec.models:
        columns, patches = per_model[model_id]
        sid = config.models[model_id].store_id
        key = content_key(
            "zeroshot",
            [keys.entries[(sid, d)] for d in datasets],
            spec.classes,
            _list_files_identity({"include": [spec.classes]}),
            spec.scores,
            spec.params,
            spec.vocabularies,
            ref_hashes,
            list(SEED_TEMPLATES),  # the strings, not the setting's name: other templates make other scores
            spec.sweep_k,
            spec.sweep_m,
            config.tpr,
            __version__,
        )
        keys.zeroshot[model_id] = key
        unit = ZeroShotUnit(
            label=f"{model_id}/zeroshot",
            key=key,
            model=model_id,
            deps=tuple(f"extract:{sid}/{d}" for d in datasets),
            items=sum(u.items or 0 for u in units if u.stage == "extract" and u.model == sid and u.dataset in datasets)
            or None,
            columns=columns,
            datasets=datasets,
            patches=patches,
        )
        unit.status = recorded_status(ledger, unit, (lay.run_dir(model_id) / "results.parquet").exists())
        units.append(unit)


# ----------------------------------------------------------------------------------------------- metrics, analysis, report
def _plan_metrics(config: ExperimentConfig, lay: Layout, ledger: Ledger, units: list[Unit], keys: UnitKeys) -> None:
    metric_keys: list[str] = []
    for model in config.classifiers:
        score_units = [u for u in units if u.stage == "score" and u.model == model.id]
        spec = config.evaluation
        table = [spec.convention, spec.aupr, spec.groups, list(spec.csid)]  # what the table shows beyond the rows
        key = content_key(
            "metrics",
            sorted(u.key for u in score_units),
            config.tpr,
            *([table] if table != ["oodbench", False, None, []] else []),  # default: the keys as they were
        )
        keys.metrics[model.id] = key
        metric_keys.append(key)
        unit = MetricsUnit(label=model.id, key=key, model=model.id, deps=tuple(u.id for u in score_units))
        unit.status = recorded_status(ledger, unit, (lay.run_dir(model.id) / "results.parquet").exists())
        units.append(unit)
    for model_id in config.zeroshot.models if config.zeroshot else ():
        metric_keys.append(keys.zeroshot[model_id])
        keys.metrics[model_id] = keys.zeroshot[model_id]
    keys.results = content_key("results", metric_keys)
    unit = CombineUnit(
        label="all",
        key=keys.results,
        deps=tuple(u.id for u in units if u.stage == "metrics")
        + tuple(f"score:{m}/zeroshot" for m in (config.zeroshot.models if config.zeroshot else ())),
    )
    unit.status = recorded_status(ledger, unit, lay.results.exists())
    units.append(unit)


def _plan_analysis(config: ExperimentConfig, lay: Layout, ledger: Ledger, units: list[Unit], keys: UnitKeys) -> None:
    model_ids = [m.id for m in config.classifiers] + list(config.zeroshot.models if config.zeroshot else ())
    for analysis, params in config.analysis.items():
        for model_id in model_ids:
            key = content_key("analysis", analysis, params, keys.metrics[model_id], config.seed)
            keys.analyses[(analysis, model_id)] = key
            unit = AnalysisUnit(
                label=f"{analysis}/{model_id}",
                key=key,
                model=model_id,
                analysis=analysis,
                params=params,
                deps=(
                    f"metrics:{model_id}"
                    if model_id in config.models and config.models[model_id].is_classifier
                    else f"score:{model_id}/zeroshot",
                ),
            )
            unit.status = recorded_status(ledger, unit, (lay.analysis / analysis / f"{model_id}.json").exists())
            units.append(unit)


def _plan_report(config: ExperimentConfig, ledger: Ledger, units: list[Unit], keys: UnitKeys) -> None:
    key = content_key("report", keys.report_inputs(), config.report, config.name, __version__)
    unit = ReportUnit(label="report", key=key, deps=tuple(u.id for u in units if u.stage in ("metrics", "analysis")))
    unit.status = recorded_status(ledger, unit, all(f.is_file() for f in report_files(config)))
    units.append(unit)


# ----------------------------------------------------------------------------------------------- the plan
def build_plan(config: ExperimentConfig) -> Plan:
    """Plan every unit of the experiment and mark what is cached (reads the store and ledger, writes nothing)."""
    lay = layout(config)
    store = Store(lay.store)
    ledger = Ledger(lay.ledger)
    units: list[Unit] = []
    keys = UnitKeys()
    _plan_extract(config, store, ledger, units, keys)
    _plan_fit_score(config, lay, store, ledger, units, keys)
    problems: dict[str, str] = {}
    _plan_zeroshot(config, lay, ledger, units, keys, problems)
    _plan_metrics(config, lay, ledger, units, keys)
    _plan_analysis(config, lay, ledger, units, keys)
    _plan_report(config, ledger, units, keys)
    _propagate(units)
    pending_extract = {u.dataset for u in units if isinstance(u, ExtractUnit) and u.todo}
    problems.update(missing_roots(config, sorted(d for d in pending_extract if d is not None)))
    return Plan(config, lay, units, problems)


def _propagate(units: list[Unit]) -> None:
    """A unit whose input must be redone is not cached either (its outputs were made from the old input)."""
    by_id = {u.id: u for u in units}
    for unit in units:  # plan order is topological: deps come first
        if unit.status in DONE:
            redo = [d for d in unit.deps if d in by_id and by_id[d].todo]
            if redo:
                unit.status, unit.note = "pending", f"after {redo[0]}"


# ----------------------------------------------------------------------------------------------- printing
def _human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_plan(plan: Plan, *, units: bool = True) -> str:
    """The plan as text: per-stage totals, input problems, then one line per unit with size and status."""
    config = plan.config
    lines = [
        f"experiment {config.name!r}: {len(config.models)} models, {len(config.datasets)} datasets, "
        f"{len(config.detectors)} detectors"
        + (f", {len(config.zeroshot.models)} zero-shot VLMs" if config.zeroshot else ""),
        f"work directory {plan.layout.workdir}   store {plan.layout.store}",
    ]
    if config.unused_params:
        unused = ", ".join(config.unused_params)
        lines.append(f"detectors.params not applied (the selection leaves these detectors out): {unused}")
    lines.append("")
    lines += _format_inputs(config)
    lines += _format_zeroshot(plan)
    lines += _format_totals(plan)
    if plan.problems:
        lines += ["", "input problems (extraction of these fails until they are fixed):"]
        lines += [f"  {key}: {problem}" for key, problem in plan.problems.items()]
    if units:
        lines += _format_passes(plan)
        lines += _format_units(plan)
    return "\n".join(lines) + "\n"


def _format_inputs(config: ExperimentConfig) -> list[str]:
    """The models (with what their weights resolve to) and the datasets (with their image counts)."""
    lines = [f"{'model':<22} {'kind':<9} weights (resolved offline)"]
    lines += [f"{m.display_name:<22} {m.kind:<9} {m.kind_of.weights(m)}" for m in config.models.values()]
    lines += [
        f"{m.display_name:<22} {m.kind:<9} {m.kind_of.weights(m)}; skipped until {m.key_path}.checkpoint is set"
        for m, _ in config.skipped_models
    ]
    lines.append("")
    lines.append(f"{'dataset':<24} {'kind':<9} {'images':>10}  what defines them")
    for spec in config.datasets.values():
        count = spec.kind_of.count(spec, config)
        shown = f"{count:,}" if count is not None else "?"
        lines.append(f"{spec.id:<24} {spec.kind:<9} {shown:>10}  {spec.kind_of.describe(spec)}".rstrip())
    lines.append("")
    return lines


def _format_zeroshot(plan: Plan) -> list[str]:
    """Each VLM's zero-shot columns and how its GL-MCM patch embeddings are made."""
    vlm_units = [u for u in plan.stage("score") if isinstance(u, ZeroShotUnit)]
    if not vlm_units:
        return []
    lines = ["zero-shot scores per VLM (each on the ID test set and every OOD set):"]
    for unit in vlm_units:
        model = plan.config.models[unit.model or ""]
        logit = [c for c in unit.columns if "@" not in c]
        vocab = [c for c in unit.columns if "@" in c and "[" not in c]
        sweeps = len(unit.columns) - len(logit) - len(vocab)
        lines.append(f"  {model.display_name:<20} {' '.join(logit)}")
        lines.append(f"  {'':<20} {' '.join(vocab)}" + (f"  (+{sweeps} sweep points)" if sweeps else ""))
        lines.append(f"  {'':<20} {unit.patches.partition(': ')[0]}")
    routes = dict.fromkeys(u.patches for u in vlm_units if u.patches.startswith("GL-MCM"))
    lines += [f"  {line.partition(': ')[0]}: {line.partition(': ')[2]}" for line in routes]
    lines.append("")
    return lines


def _format_totals(plan: Plan) -> list[str]:
    """Per stage: units, cached, skipped, to run, images to process and bytes."""
    lines = [f"{'stage':<9} {'units':>7} {'cached':>7} {'skipped':>7} {'to run':>7} {'images':>14} {'size':>12}"]
    for stage in STAGES:
        stage_units = plan.stage(stage)
        todo = [u for u in stage_units if u.todo]
        items = sum(u.items or 0 for u in todo)
        nbytes = sum(u.nbytes or 0 for u in stage_units)
        lines.append(
            f"{stage:<9} {len(stage_units):>7} {sum(u.status == 'cached' for u in stage_units):>7} "
            f"{sum(u.status == 'skipped' for u in stage_units):>7} {len(todo):>7} "
            f"{(f'{items:,}' if items else '-'):>14} {(_human_bytes(nbytes) if nbytes else '-'):>12}"
        )
    return lines


def _format_units(plan: Plan) -> list[str]:
    """One line per unit (status, label, size, note), stage by stage; a VLM's unit lists its columns."""
    lines: list[str] = []
    for stage in STAGES:
        stage_units = plan.stage(stage)
        if not stage_units:
            continue
        lines += ["", f"[{stage}]"]
        for unit in stage_units:
            size = (
                f"{unit.items:,} images" if unit.items else "? images" if stage in ("extract", "fit", "score") else ""
            )
            if unit.nbytes:
                estimated = isinstance(unit, ExtractUnit) and unit.estimated_bytes
                size += f", {'~' if estimated else ''}{_human_bytes(unit.nbytes)}"
            note = f"  ({unit.note})" if unit.note else ""
            lines.append(f"  {unit.status:<8} {unit.label:<60} {size}{note}")
            if isinstance(unit, ZeroShotUnit):
                for column in unit.columns:
                    lines += [f"  {'':<8}   {unit.model}/{column}/{dataset}" for dataset in unit.datasets]
    return lines


def skip_line(model: ModelSpec, reason: str) -> str:
    """Why a declared model does not run and what makes it run, in one line."""
    return f"needs checkpoint = PATH ({model.key_path}.checkpoint): {reason}"


def _format_passes(plan: Plan, device: str = "auto") -> list[str]:
    """The pending extractions as passes: the models that share one decode of each image of a dataset."""
    from .passes import extraction_passes, pass_budget

    pending = [u for u in plan.units if isinstance(u, (ExtractUnit, HeadUnit)) and u.todo]
    passes = [p for p in extraction_passes(plan.config, pending, device) if p.units[0].step == "extract"]
    if not passes:
        return []
    budget = pass_budget(plan.config, device)
    source = (
        "engine.pass_memory_gb"
        if plan.config.engine.get("pass_memory_gb")
        else "80 % of this machine's free device memory"
    )
    shared = sum(p.shared for p in passes)
    lines = [
        "",
        f"[extract passes] {len(passes)} passes over the images ({shared} shared by several models: each image is "
        f"decoded once for them); memory per pass at most {_human_bytes(budget)} ({source})",
    ]
    for number, item in enumerate(passes, 1):
        size = f"~{_human_bytes(item.nbytes)}" if item.nbytes is not None else "size unknown: runs alone"
        names = ", ".join(plan.config.models[u.model_id].display_name for u in item.units)
        lines.append(f"  pass {number:<3} {item.units[0].dataset:<22} {len(item.units):>2} model(s), {size}: {names}")
    return lines


def plan_json(plan: Plan) -> str:
    """The plan as JSON (for tools): summary, problems and every unit."""
    return json.dumps(
        {
            "experiment": plan.config.name,
            "models": [
                {"id": m.id, "display": m.display_name, "kind": m.kind, "weights": m.kind_of.weights(m)}
                for m in plan.config.models.values()
            ],
            "skipped_models": [
                {"id": m.id, "display": m.display_name, "kind": m.kind, "reason": why}
                for m, why in plan.config.skipped_models
            ],
            "summary": plan.summary(),
            "problems": plan.problems,
            "unused_params": list(plan.config.unused_params),
            "units": [
                {
                    "id": u.id,
                    "stage": u.stage,
                    "status": u.status,
                    "key": u.key,
                    "model": u.model,
                    "dataset": u.dataset,
                    "detector": u.detector,
                    "items": u.items,
                    "bytes": u.nbytes,
                    "note": u.note,
                }
                for u in plan.units
            ],
        },
        indent=1,
    )
