"""The work of each unit: extraction, subsets, probes, fit+score, zero-shot, metrics, analyses and the report.

Every function here writes its outputs first and its ledger record last, so it can run in this process or in a
Ray worker (which shares the work directory), and an interrupted run redoes only units without a record. The
pieces come from the other packages (`extract`, `detectors`, `zeroshot`, `analysis`, `report`); what differs
between model and dataset kinds is asked of the kind objects (`runner/kinds.py`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ExtractError, OodbenchError, StoreError
from ..core.results import write_rows
from ..core.rundir import RunDir
from ..core.store import Store, hash_items
from ..util.atomic import atomic_save_npy, atomic_write_json, atomic_write_text
from .config import DatasetSpec, ExperimentConfig
from .kinds import ModelSpec
from .ledger import Ledger
from .plan import REPORT_FORMATS, Layout, fingerprint, layout, load_ref_vocabularies, skip_reason
from .units import (
    AnalysisUnit,
    CombineUnit,
    ExtractStageUnit,
    ExtractUnit,
    HeadUnit,
    MetricsUnit,
    ReportUnit,
    ScoreUnit,
    ZeroShotUnit,
)

__all__ = [
    "Context",
    "reset_changed_models",
    "run_extract_unit",
    "run_extract_pass",
    "run_fit_score",
    "run_zeroshot_unit",
    "run_metrics_unit",
    "run_combine_unit",
    "run_analysis_unit",
    "run_report_unit",
    "record_adopted",
]


@dataclass
class Context:
    """What every unit needs: the config, where things go, and how to show progress and run models."""

    config: ExperimentConfig
    progress: bool = True
    device: str = "auto"
    _backbone: tuple[str, Any] | None = field(default=None, repr=False)
    _inputs: Any = field(default=None, repr=False)  # evaluation.engine.ModelInputs of the last model scored

    def __post_init__(self) -> None:
        # A Ray worker gets the config, not this process's registry: import the file's detector plugins there too.
        from .. import detectors as detector_registry

        detector_registry.load_plugins(self.config.plugins)

    @property
    def layout(self) -> Layout:
        return layout(self.config)

    @property
    def store(self) -> Store:
        return Store(self.layout.store)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.layout.ledger)

    def backbone(self, model: ModelSpec) -> Any:
        """The model's extraction backbone, loaded once for consecutive units of the model (models can be GBs)."""
        if self._backbone is not None and self._backbone[0] == model.store_id:
            return self._backbone[1]
        self._backbone = None
        self._backbone = (model.store_id, model.kind_of.backbone(model, self.device))
        return self._backbone[1]

    def inputs(self, model_id: str) -> Any:
        """The model's `ModelInputs` (evaluation.engine), kept for consecutive units of the model: each entry is
        opened, checked finite and against the head once, and the fits share one pass over the fit set."""
        if self._inputs is not None and self._inputs.model_id == model_id:
            return self._inputs
        from ..evaluation.engine import ModelInputs

        self._inputs = None  # the previous model's arrays and statistics go before this model's are read
        self._inputs = ModelInputs(self.store, model_id, verify=self.config.evaluation.verify)
        return self._inputs

    def forget_inputs(self, model_id: str | None = None) -> None:
        """Drop the kept inputs (of `model_id`, or any): its store entries are about to change."""
        if self._inputs is not None and (model_id is None or self._inputs.model_id == model_id):
            self._inputs = None


# ----------------------------------------------------------------------------------------------- extraction
def record_adopted(ctx: Context, unit: ExtractUnit) -> None:
    """Record a store entry made outside the runner that the plan accepted as this unit's output."""
    ctx.ledger.write("extract", unit.label, unit.key, fingerprint=unit.adopt, adopted=True, model_key=unit.model_key)


def _record_entry(ctx: Context, unit: ExtractUnit) -> None:
    """Record a filled store entry with its fingerprint (after checking it is complete)."""
    sid, dataset_id = unit.model or "", unit.dataset or ""
    if not ctx.store.exists(sid, dataset_id):
        raise StoreError(f"extraction of {sid}/{dataset_id} finished without a complete store entry")
    fingerprinted = fingerprint(ctx.store.meta(sid, dataset_id))
    ctx.ledger.write("extract", unit.label, unit.key, fingerprint=fingerprinted, model_key=unit.model_key)


def reset_changed_models(ctx: Context, units: Iterable[ExtractStageUnit]) -> list[str]:
    """Delete the store entries and head of models whose definition changed (name, checkpoint, …) since extraction.

    The extractor refuses to mix checkpoints under one model id, so a changed model is re-extracted from scratch.
    """
    store = ctx.store
    config = ctx.config
    reset = sorted(
        {
            u.model
            for u in units
            if isinstance(u, ExtractUnit)
            and u.model_changed
            and u.step == "extract"
            and not config.models[u.model_id].kind_of.fills_store
            and u.model is not None
        }
    )
    for model_id in reset:
        store.delete_model(model_id)
    return reset


def run_extract_unit(ctx: Context, unit: ExtractStageUnit) -> None:
    """Fill one store entry (extracted by the model's kind, or derived from a parent entry) or train a head; record it."""
    config, store = ctx.config, ctx.store
    model = config.models[unit.model_id]
    ctx.forget_inputs()  # the store changes under them
    if isinstance(unit, HeadUnit):
        details = model.kind_of.train_head(ctx, model, stale=unit.status == "stale")
        ctx.ledger.write("extract", unit.label, unit.key, **details)
        return
    sid, dataset_id = model.store_id, unit.dataset
    assert dataset_id is not None
    dataset = config.datasets[dataset_id]
    if unit.status == "stale" and not model.kind_of.fills_store:
        store.delete(sid, dataset_id)  # made from other inputs: the store's writer would refuse to mix them
    if unit.step == "derive":
        assert dataset.parent is not None
        derive_subset(store, sid, dataset, config.datasets[dataset.parent])
    else:
        model.kind_of.extract(ctx, model, dataset)
    _record_entry(ctx, unit)


def run_extract_pass(ctx: Context, units: Sequence[ExtractStageUnit]) -> None:
    """Extract several models' entries of one dataset in one pass (each image decoded once); record each unit."""
    from ..extract.pipeline import GroupMember, extract_group

    if len(units) == 1:
        run_extract_unit(ctx, units[0])
        return
    entries = [unit for unit in units if isinstance(unit, ExtractUnit) and unit.step == "extract"]
    if len(entries) != len(units):
        raise OodbenchError(f"a shared extraction pass extracts store entries only, not {units[0].id}")
    config, store = ctx.config, ctx.store
    ctx.forget_inputs()  # the store changes under them
    dataset = config.datasets[units[0].dataset or ""]
    models = [config.models[unit.model_id] for unit in entries]
    for unit, model in zip(entries, models, strict=True):
        if unit.status == "stale":
            store.delete(model.store_id, dataset.id)  # made from other inputs: the store's writer would refuse them
    ctx._backbone = None  # free a single model kept from earlier units before loading the pass's models
    members = [
        GroupMember(model.kind_of.backbone(model, ctx.device), model.store_id, model.params.get("batch_size", 64))
        for model in models
    ]
    extract_group(
        store,
        members,
        dataset.kind_of.open(dataset),
        dataset_id=dataset.id,
        num_workers=config.engine["workers"],
        device=ctx.device,
        progress=ctx.progress,
    )
    del members
    for unit in entries:
        _record_entry(ctx, unit)


# ----------------------------------------------------------------------------------------------- subsets
_VAL_ID = re.compile(r"ILSVRC2012_val_\d{8}")
_SUFFIX_DEPTH = 3  # path components compared from the end (e.g. "n01440764/ILSVRC2012_val_00000293.JPEG")


def _components(text: str) -> list[str]:
    return [p for p in text.strip().replace("\\", "/").split("/") if p not in ("", ".")]


def _read_list(path: Path) -> list[str]:
    """Entries of a list file (TXT or CSV: the first field per line; '#' comments and a header line are ignored)."""
    entries: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        first = re.split(r"[,\t]", line, maxsplit=1)[0].strip().strip('"')
        if number == 0 and not _VAL_ID.search(first) and "." not in first and "/" not in first:
            continue  # a CSV header such as "path,label"
        entries.append(first)
    return entries


class _ItemIndex:
    """Finds list entries among a dataset's items: by ImageNet val id, else by the longest matching path suffix."""

    def __init__(self, items: Sequence[str]) -> None:
        self.by_suffix: dict[str, list[int]] = {}
        self.by_val_id: dict[str, list[int]] = {}
        for position, item in enumerate(items):
            parts = _components(item)
            for depth in range(1, min(_SUFFIX_DEPTH, len(parts)) + 1):
                self.by_suffix.setdefault("/".join(parts[-depth:]), []).append(position)
            found = _VAL_ID.search(item)
            if found:
                self.by_val_id.setdefault(found.group(0), []).append(position)

    def find(self, entry: str) -> list[int]:
        """Positions matching an entry (several means ambiguous, none means absent)."""
        found = _VAL_ID.search(entry)
        if found:
            return self.by_val_id.get(found.group(0), [])
        parts = _components(entry)
        for depth in range(min(_SUFFIX_DEPTH, len(parts)), 0, -1):
            hits = self.by_suffix.get("/".join(parts[-depth:]))
            if hits:
                return hits
        return []


def _entry_items(store: Store, model_id: str, dataset_id: str) -> list[str]:
    entry = store.entry_path(model_id, dataset_id)
    meta = store.meta(model_id, dataset_id)
    if (entry / "items.txt").is_file():
        return (entry / "items.txt").read_text(encoding="utf-8").splitlines()
    if "items" in meta:
        return list(meta["items"])
    raise ExtractError(
        f"{model_id}/{dataset_id} records no item list (items.txt), so a subset cannot be selected "
        "from it; re-extract it with `oodbench extract`"
    )


def derive_subset(store: Store, model_id: str, spec: DatasetSpec, parent: DatasetSpec) -> None:
    """Write the rows of `parent`'s entry that the subset's include/exclude lists select, as a new entry."""
    items = _entry_items(store, model_id, parent.id)
    keep, notes = _select_items(items, spec, parent)
    _write_subset(store, model_id, spec, parent, items, keep, notes)


def _select_items(items: Sequence[str], spec: DatasetSpec, parent: DatasetSpec) -> tuple[np.ndarray, dict[str, Any]]:
    """(which of the parent's items the subset keeps, per list file: its entries and those not in the parent)."""
    index_of = _ItemIndex(items)
    keep = np.ones(len(items), dtype=bool)
    notes: dict[str, Any] = {}
    for which in ("include", "exclude"):
        for file in spec.params.get(which, []):
            wanted = _read_list(Path(file))
            hits = [index_of.find(entry) for entry in wanted]
            ambiguous = [entry for entry, h in zip(wanted, hits, strict=True) if len(h) > 1]
            if ambiguous:
                raise ExtractError(
                    f"{spec.key_path}.{which}: {len(ambiguous)} entries of {file} match several items of "
                    f"{parent.id} (e.g. {ambiguous[0]!r}); give longer paths"
                )
            unknown = [entry for entry, h in zip(wanted, hits, strict=True) if not h]
            if which == "include" and unknown:
                raise ExtractError(
                    f"{spec.key_path}.include: {len(unknown)} of {len(wanted)} entries of {file} are not "
                    f"items of {parent.id} (e.g. {unknown[0]!r}); is it the right list for this dataset?"
                )
            selected = np.zeros(len(items), dtype=bool)
            selected[[h[0] for h in hits if h]] = True
            keep = keep & selected if which == "include" else keep & ~selected
            notes[file] = {"entries": len(wanted), "not_in_parent": len(unknown)}
    return keep, notes


def _write_subset(
    store: Store,
    model_id: str,
    spec: DatasetSpec,
    parent: DatasetSpec,
    items: Sequence[str],
    keep: np.ndarray,
    notes: Mapping[str, Any],
) -> None:
    """The kept rows of the parent's entry, in the subset's item order, as a store entry of their own."""
    kept = np.flatnonzero(keep)
    new_position = np.full(len(items), -1, dtype=np.int64)
    new_position[kept] = np.arange(kept.size)
    parent_meta = store.meta(model_id, parent.id)
    index = (
        np.asarray(store.read_array(model_id, parent.id, "index"))
        if "index" in parent_meta["arrays"]
        else np.arange(parent_meta["num_rows"])
    )
    rows = np.flatnonzero(new_position[index] >= 0)
    rows = rows[np.argsort(new_position[index[rows]], kind="stable")]
    sub_items = [items[i] for i in kept]
    source = store.read(model_id, parent.id, check_finite=False)
    arrays = {
        "features": source.features,
        "logits": source.logits,
        "labels": source.labels,
        **{f"extra.{k}": v for k, v in source.extras.items()},
    }
    arrays = {k: v for k, v in arrays.items() if v is not None}
    shard_size = int(parent_meta.get("shard_size", 4096))
    writer = store.writer(
        model_id,
        spec.id,
        provenance=parent_meta["provenance"],
        num_items=len(sub_items),
        shard_size=shard_size,
        item_hash=hash_items(sub_items),
    )
    entry = store.entry_path(model_id, spec.id)
    if not (entry / "items.txt").is_file():
        atomic_write_text(entry / "items.txt", "".join(f"{item}\n" for item in sub_items))
    positions = new_position[index[rows]]
    skipped_parent = {int(s["item"]): s for s in parent_meta.get("skipped", []) if "item" in s}
    for shard in writer.pending_shards():
        span = writer.shard_rows(shard)
        lo, hi = np.searchsorted(positions, [span.start, span.stop])
        picked = rows[lo:hi]
        shard_arrays = {name: np.asarray(value[picked]) for name, value in arrays.items()}
        shard_arrays["index"] = positions[lo:hi]
        skipped = [
            {**skipped_parent[int(old)], "item": int(new_position[old])}
            for old in kept[span.start : span.stop]
            if int(old) in skipped_parent
        ]
        writer.write_shard(shard, shard_arrays, skipped=skipped)
    writer.finalize(
        extra_meta={
            "dataset": {"derived_from": f"{model_id}/{parent.id}", "lists": notes, "num_items": len(sub_items)},
            "items_file": "items.txt",
        }
    )


# ----------------------------------------------------------------------------------------------- fit and score
def run_fit_score(
    ctx: Context,
    model_id: str,
    detector: str,
    params: Mapping[str, Any],
    todo: Sequence[Mapping[str, str]],
    share_with: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> list[str]:
    """Fit one detector on the model's fit set and score the datasets of `todo` ({label, key, dataset}); record each.

    The fit and scoring are the evaluation engine's (`evaluation.engine.fit_and_score`) over the model's inputs,
    loaded once per model (`Context.inputs`). `share_with`: every (detector, params) of this model that this process
    fits in this run, this one included; with more than one, their fits share one pass over the fit set.
    """
    from .. import detectors as registry
    from ..core.errors import DetectorError
    from ..evaluation.engine import fit_and_score
    from ..evaluation.evaluate import fit_set_size, fit_size_plan

    config, ledger, lay = ctx.config, ctx.ledger, ctx.layout
    spec = config.evaluation
    inputs = ctx.inputs(model_id)
    datasets = [item["dataset"] for item in todo]
    names = list(dict.fromkeys([spec.fit, *datasets]))
    reason = skip_reason(detector, params, {name: inputs.arrays(name) for name in names}, spec.fit, inputs.has_head)
    if reason is not None:
        if spec.strict:
            raise DetectorError(f"{detector} cannot run: {reason}")
        for item in todo:
            ledger.write("score", item["label"], item["key"], skipped=reason)
        return []
    inputs.check_compatible(names)
    # The parameters as given are checked against the fit set; with small_fit_set = "adapt" defaults scale to it.
    given = {detector: dict(spec.detectors.get(detector, params))}
    size = fit_set_size(inputs.outputs(spec.fit), count_classes=spec.small_fit_set == "adapt")
    plan, adapted, left_out = fit_size_plan(given, size, spec.small_fit_set)
    if left_out:  # small_fit_set = "adapt" leaves out what the fit set cannot support, with why
        for item in todo:
            ledger.write("score", item["label"], item["key"], skipped=left_out[detector])
        return []
    instance = registry.create(detector, **(plan[detector] if adapted else params))
    stats = None
    if len(share_with) > 1 and not adapted:
        created = []
        for name, shared_params in share_with:
            try:
                created.append(registry.create(name, **shared_params))
            except DetectorError:
                continue  # its own unit reports the error; the others still share
        stats = inputs.fit_statistics(spec.fit, created, spec.gram_dtype)

    def keep(fitted: registry.Detector) -> None:
        provenance = registry.fit_provenance(ctx.store, model_id, spec.fit)
        registry.save(fitted, lay.detector_dir(model_id, detector), provenance=provenance)

    per_dataset = fit_and_score(
        instance, inputs, spec.fit, datasets, stats=stats, on_fitted=keep if config.save_detectors else None
    )
    done = []
    for item in todo:
        scores = per_dataset[item["dataset"]]
        atomic_save_npy(lay.score_file(model_id, detector, item["dataset"]), scores)
        ledger.write(
            "score",
            item["label"],
            item["key"],
            rows=int(scores.shape[0]),
            detector=detector,
            params=dict(params),
            **({"adapted": adapted[detector]} if adapted else {}),
        )
        done.append(item["label"])
    return done


# ----------------------------------------------------------------------------------------------- zero-shot
def _vocab_summary(vocab: Any) -> dict[str, Any]:
    return {
        "name": vocab.name,
        "kind": vocab.kind,
        "version": vocab.version,
        "hash": vocab.hash,
        "size": len(vocab),
        "deployable": vocab.deployable,
    }


def run_zeroshot_unit(ctx: Context, unit: ZeroShotUnit) -> None:
    """Zero-shot scores of one VLM over the ID test and OOD sets (a run directory), building per-model vocabularies."""
    from ..extract.label_embedder import store_embedder
    from ..text.classes import load_classes
    from ..zeroshot.evaluate import evaluate_zeroshot_store, make_plan
    from ..zeroshot.vocab.artefact import VocabStore

    config, store, lay = ctx.config, ctx.store, ctx.layout
    spec = config.zeroshot
    assert spec is not None and unit.model is not None
    model = config.models[unit.model]

    classes = load_classes(spec.classes)
    # A long label list (the WordNet pool) is encoded in shards; a line per shard says how far it is.
    embed = store_embedder(
        store,
        model.store_id,
        load_bundle=model.kind_of.text_model(ctx, model),
        report=lambda line: print(line, file=sys.stderr, flush=True),
    )
    refs, problems = load_ref_vocabularies(config)
    if problems:
        key, problem = next(iter(problems.items()))
        raise OodbenchError(f"{key}: {problem}")
    built = VocabStore(lay.vocabularies / model.id)
    vocabularies: dict[str, Any] = {}
    pending = dict(spec.vocabularies)
    while pending:  # unions after their parts
        for name, vocab in list(pending.items()):
            if "ref" in vocab:
                vocabularies[name] = refs[name]
            elif vocab["build"] == "wordnet":
                from ..zeroshot.vocab.wordnet_negmining import mine_wordnet_negatives

                vocabularies[name] = built.save(
                    mine_wordnet_negatives(
                        classes,
                        embed,
                        m=vocab["m"],
                        percentile=vocab["percentile"],
                        pool=vocab["pool"],
                        name=name,
                        model=model.id,
                    )
                )
            elif all(part in vocabularies for part in vocab["of"]):
                from ..zeroshot.vocab.builders import build_union

                first, second = (vocabularies[p] for p in vocab["of"])
                vocabularies[name] = built.save(build_union(first, second, name=name))
            else:
                continue
            del pending[name]
    plan = make_plan(
        spec.scores, list(vocabularies.values()), sweep_k=spec.sweep_k, sweep_m=spec.sweep_m, params=spec.params
    )
    evaluate_zeroshot_store(
        store,
        model.store_id,
        config.id_test,
        list(config.ood),
        classes,
        embed,
        plan,
        out_dir=lay.run_dir(model.id),
        tpr=config.tpr,
        progress=ctx.progress,
    )
    from ..text.templates import SEED_TEMPLATES

    text = embed(list(classes.names), SEED_TEMPLATES)  # cached by the scoring above
    _record_accuracy_and_name(ctx, model, RunDir(lay.run_dir(model.id)), text_embeddings=text)
    ctx.ledger.write(
        "score", unit.label, unit.key, vocabularies={k: _vocab_summary(v) for k, v in vocabularies.items()}
    )


def _record_accuracy_and_name(ctx: Context, model: ModelSpec, run_dir: RunDir, *, text_embeddings: Any = None) -> None:
    """Top-1 of the ID test set into accuracy.json, and the model's display name into run.json."""
    from ..evaluation.accuracy import record_accuracy

    # A classifier's logits live under its own id (a probe's too); a VLM's image embeddings under its store id.
    store_id = model.id if model.is_classifier else model.store_id
    record_accuracy(run_dir.path, ctx.store, store_id, ctx.config.id_test, text_embeddings=text_embeddings)
    description = run_dir.read_info()  # a classifier's run.json has it already (_run_json); a VLM's is written apart
    if description and description.get("display") != model.display_name:
        run_dir.write_info({**description, "display": model.display_name})


# ----------------------------------------------------------------------------------------------- metrics
def run_metrics_unit(ctx: Context, unit: MetricsUnit, score_units: Sequence[ScoreUnit]) -> None:
    """One model's run directory, written by the evaluation engine's writer: scores, rows, the table, run.json."""
    from ..evaluation.engine import RunWriter, result_tables
    from ..evaluation.evaluate import run_description

    config, lay, ledger = ctx.config, ctx.layout, ctx.ledger
    spec = config.evaluation
    model_id = unit.model
    assert model_id is not None
    scores: dict[str, dict[str, np.ndarray]] = {}
    skipped: dict[str, str] = {}
    adapted: dict[str, Any] = {}
    for score_unit in score_units:
        record = ledger.done("score", score_unit.label, score_unit.key)
        if record is None:
            raise OodbenchError(f"metrics of {model_id}: score unit {score_unit.label} has not run")
        if record.get("skipped"):
            skipped[score_unit.detector or ""] = record["skipped"]
            continue
        if record.get("adapted"):
            adapted[score_unit.detector or ""] = record["adapted"]
        values = np.load(lay.score_file(model_id, score_unit.detector or "", score_unit.dataset or ""))
        scores.setdefault(score_unit.dataset or "", {})[score_unit.detector or ""] = np.asarray(values)
    ran = [d for d in config.detectors if d not in skipped]
    rows, table = result_tables(model_id, spec, ran, scores)
    score_keys = {d: u.key for u in score_units if (d := u.detector or "") in ran and u.dataset == spec.id}

    def describe(keys: Mapping[str, str], **status: Any) -> dict[str, Any]:
        """The run description, in the layout `oodbench evaluate` writes (so analyses and reports read it)."""
        description = run_description(
            ctx.store,
            model_id,
            spec.fit,
            spec.id,
            list(spec.ood),
            config.detectors,
            keys,
            csid_datasets=spec.csid,
            adapted=adapted,
            **status,
        )
        if spec.convention != "oodbench":
            description["convention"] = spec.convention
        runner = {"experiment": config.name, "config": str(config.path) if config.path else None, "key": unit.key}
        return {**description, "runner": runner, "display": config.models[model_id].display_name}

    run_dir = RunDir(lay.run_dir(model_id))
    writer = RunWriter(run_dir, model_id, describe, tpr=config.tpr)
    writer.finish(rows, scores, table, score_keys, complete=True, skipped=skipped)
    _record_accuracy_and_name(ctx, config.models[model_id], run_dir)
    ledger.write("metrics", unit.label, unit.key, rows=len(rows), skipped=skipped)


def model_run_dirs(ctx: Context) -> list[Path]:
    """Run directories of every model, in config order."""
    config = ctx.config
    model_ids = [m.id for m in config.classifiers] + list(config.zeroshot.models if config.zeroshot else ())
    return [ctx.layout.run_dir(m) for m in model_ids]


def run_combine_unit(ctx: Context, unit: CombineUnit) -> None:
    """All models' rows in one Parquet file."""
    rows = [row for d in model_run_dirs(ctx) for row in RunDir(d).read_rows()]
    write_rows(rows, ctx.layout.results)
    ctx.ledger.write("metrics", unit.label, unit.key, rows=len(rows))


# ----------------------------------------------------------------------------------------------- analysis
def run_analysis_unit(ctx: Context, unit: AnalysisUnit) -> None:
    """One analysis of one model's run: the subsampling study (Table A6 rows) or confidence intervals."""
    from ..analysis.rundata import load_run

    name, params = unit.analysis, dict(unit.params)
    assert unit.model is not None
    run = load_run(ctx.layout.run_dir(unit.model))
    target = ctx.layout.analysis / name / f"{unit.model}.json"
    seed = params.get("seed", ctx.config.seed)
    if name == "subsample":
        from ..analysis.spread import spread_vs_noise
        from ..analysis.subsample import subsample_run

        results = []
        requested = params.get("n", "auto")
        for n in requested if isinstance(requested, list) else [requested]:
            studies, notes = subsample_run(
                run, n, draws=params.get("draws", 1000), seed=seed, tpr=ctx.config.tpr, progress=ctx.progress
            )
            summaries = [s.summary() for s in studies]
            results.append(
                {
                    "n": studies[0].n,
                    "requested": str(n),
                    "notes": notes,
                    "summaries": [s.as_dict() for s in summaries],
                    "spread": [s.as_dict() for s in spread_vs_noise(summaries)],
                }
            )
        payload: dict[str, Any] = {
            "run": str(run.path),
            "model": unit.model,
            "draws": params.get("draws", 1000),
            "seed": seed,
            "tpr": ctx.config.tpr,
            "results": results,
        }
    else:
        from ..analysis.runs import INTERVAL_METHODS, intervals_for_run

        methods = tuple(params.get("methods", INTERVAL_METHODS))
        records = intervals_for_run(
            run,
            methods=methods,
            resamples=params.get("resamples", 2000),
            confidence=params.get("confidence", 0.95),
            seed=seed,
            tpr=ctx.config.tpr,
            progress=ctx.progress,
        )
        payload = {
            "run": str(run.path),
            "model": unit.model,
            "resamples": params.get("resamples", 2000),
            "seed": seed,
            "records": [r.as_dict() for r in records],
        }
    atomic_write_json(target, payload)
    ctx.ledger.write("analysis", unit.label, unit.key, output=str(target))


# ----------------------------------------------------------------------------------------------- report
def run_report_unit(ctx: Context, unit: ReportUnit) -> None:
    """Tables, figures and the self-contained HTML report of every model's run."""
    from ..report.build import ReportOptions, build_report
    from ..report.output import write_report

    config = ctx.config
    sub = config.analysis.get("subsample", {})
    intervals = config.analysis.get("intervals", {})
    requested_n = sub.get("n", "auto")
    options = ReportOptions(
        n=requested_n[0] if isinstance(requested_n, list) else requested_n,
        draws=sub.get("draws", 1000),
        seed=sub.get("seed", config.seed),
        curve_draws=config.report["curve_draws"],
        resamples=intervals.get("resamples", config.report["resamples"]),
        tpr=config.tpr,
        score_figures=config.report["score_figures"],
        title=config.report["title"] or f"oodbench: {config.name}",
    )
    content = build_report([str(d) for d in model_run_dirs(ctx)], options, progress=ctx.progress)
    formats = [REPORT_FORMATS[f] for f in config.report["formats"]]
    written = write_report(content, ctx.layout.report, formats, config.report["figure_formats"])
    ctx.ledger.write(
        "report",
        unit.label,
        unit.key,
        notes=list(content.notes),
        files=[str(p) for p in written["reports"]],
        tables=len(written["tables"]),
        figures=len(written["figures"]),
    )
