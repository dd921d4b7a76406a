"""Evaluate zero-shot scores (model × score × vocabulary × OOD set) from cached embeddings and write a run directory.

The run directory has the layout of `oodbench evaluate` (``results.parquet``, ``scores/<model>/<dataset>.npz``,
``table.md``, ``run.json``). Its ``run.json`` says ``"kind": "zeroshot"``, holds the ``vocabularies`` metadata that
`oodbench report` reads for Table 2 and the vocabulary-size figure ({name: {label, size, deployable, family, classes,
k, m}}), and a ``zeroshot`` section describing each detector column: its score, vocabulary (name, version, hash,
kind, deployable), the prefix size M or siblings-per-class k of a sweep, and how many labels it used. Detector names
are ``<score>`` for logit-space scores and ``<score>@<vocabulary>`` (plus ``[m=M]`` / ``[k=K]`` for sweep points) for
vocabulary scores, the naming `oodbench.report.tables.parse_vocabulary_score` reads. A rerun reuses every score whose
inputs did not change.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import metrics
from ..core.errors import ZeroShotError
from ..core.outputs import Outputs
from ..core.results import ResultRow, rows_from_metrics
from ..core.rundir import RunDir
from ..core.store import Store
from ..text.classes import ClassList
from ..text.templates import SEED_TEMPLATES
from ..util.progress import progress_bar
from .scores import LOGIT_SCORES, SCORES, get_score, glmcm_scores, logit_scores, neglabel_sweep
from .text import EmbedFn, embed_labels
from .vocab.artefact import KINDS, Vocabulary
from .vocab.labels import IdFilter

__all__ = [
    "VocabRun",
    "Plan",
    "ZeroShotResult",
    "plan_vocab_runs",
    "make_plan",
    "evaluate_zeroshot",
    "evaluate_zeroshot_store",
    "report_vocabularies",
    "PATCH_EXTRA",
    "DEFAULT_SCORES",
]

PATCH_EXTRA = "patch_embeddings"
DEFAULT_SCORES = ("mcm", "maxlogit", "energy", "gen", "entropy", "margin", "glmcm", "neglabel", "eoe")
# The score a vocabulary feeds unless told otherwise: EOE's outlier lists go with its own score.
_DEFAULT_VOCAB_SCORE = {"eoe": "eoe"}


@dataclass(frozen=True)
class VocabRun:
    """One vocabulary score column: a score, a vocabulary and (for sweeps) a prefix size m or siblings per class k."""

    score: str
    vocab: Vocabulary
    m: int | None = None
    k: int | None = None

    @property
    def detector(self) -> str:
        """Column name in result rows, e.g. 'neglabel@wn-vitb16' or 'neglabel@siblings[k=5]'."""
        suffix = f"[m={self.m}]" if self.m is not None else f"[k={self.k}]" if self.k is not None else ""
        return f"{self.score}@{self.vocab.name}{suffix}"

    def labels(self) -> list[str]:
        """The vocabulary's labels at this run's size."""
        return self.vocab.select(m=self.m, k=self.k)


@dataclass
class ZeroShotResult:
    """Rows, per-image scores, detector descriptions and rendered table of one model's zero-shot evaluation."""

    rows: list[ResultRow]
    scores: dict[str, dict[str, np.ndarray]]  # dataset -> detector -> scores
    detectors: dict[str, dict[str, Any]]  # detector -> description (score, vocabulary, kind, m, k, ...)
    table_markdown: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    run_dir: Path | None = None


def plan_vocab_runs(
    vocabularies: Sequence[Vocabulary],
    *,
    vocab_scores: Sequence[str] | None = None,
    sweep_k: Sequence[int] = (),
    sweep_m: Sequence[int] = (),
) -> list[VocabRun]:
    """Score columns for the vocabularies: the default size of each, plus k/M sweep points where they apply."""
    for name in vocab_scores or ():
        if get_score(name).vocabulary is None:
            raise ZeroShotError(
                f"{name} does not use a vocabulary; vocabulary scores: "
                + ", ".join(s for s, spec in SCORES.items() if spec.vocabulary)
            )
    runs: list[VocabRun] = []
    names = [v.name for v in vocabularies]
    if len(set(names)) != len(names):
        raise ZeroShotError(f"vocabulary names must be distinct in one evaluation; got {names}")
    for vocab in vocabularies:
        for score in vocab_scores or [_DEFAULT_VOCAB_SCORE.get(vocab.kind, "neglabel")]:
            runs.append(VocabRun(score, vocab))
            if vocab.per_class is not None:
                runs.extend(VocabRun(score, vocab, k=int(k)) for k in sweep_k)
            if vocab.ranked is not None:
                runs.extend(VocabRun(score, vocab, m=int(m)) for m in sweep_m)
    return runs


def _score_params(score: str, params: Mapping[str, Mapping[str, Any]], tau: float | None) -> dict[str, Any]:
    spec = get_score(score)
    given = dict(params.get(score, {}))
    unknown = sorted(set(given) - set(spec.defaults))
    if unknown:
        raise ZeroShotError(f"{score} has no parameter {', '.join(unknown)}; its parameters: {dict(spec.defaults)}")
    merged = {**spec.defaults, **given}
    if tau is not None and "tau" not in given:
        merged["tau"] = tau
    return merged


@dataclass
class Plan:
    """What one evaluation computes: a description per detector column, and the vocabulary runs behind them."""

    detectors: dict[str, dict[str, Any]]
    runs: dict[str, VocabRun]
    not_run: dict[str, str] = field(default_factory=dict)  # requested score -> why no column uses it


def make_plan(
    scores: Sequence[str] = DEFAULT_SCORES,
    vocabularies: Sequence[Vocabulary] = (),
    *,
    vocab_scores: Sequence[str] | None = None,
    sweep_k: Sequence[int] = (),
    sweep_m: Sequence[int] = (),
    params: Mapping[str, Mapping[str, Any]] | None = None,
    tau: float | None = None,
) -> Plan:
    """Detector columns for these scores and vocabularies.

    Logit-space scores give one column each. Each vocabulary gives one column per vocabulary score: those in
    `vocab_scores` when given, else its kind's default (``eoe`` for EOE lists, ``neglabel`` otherwise) if that score
    is among `scores`; plus a column per k in `sweep_k` (vocabularies with per-class lists) and per M in `sweep_m`
    (vocabularies with a WordNet ranking).
    """
    params = params or {}
    for name in scores:
        get_score(name)
    unknown_params = sorted(set(params) - set(SCORES))
    if unknown_params:
        raise ZeroShotError(f"parameters given for unknown score(s) {unknown_params}; scores: {', '.join(SCORES)}")
    detectors: dict[str, dict[str, Any]] = {}
    for name in scores:
        if SCORES[name].vocabulary is None:
            detectors[name] = {"score": name, "column": "logit", "params": _score_params(name, params, tau)}
    wanted = [s for s in scores if SCORES[s].vocabulary is not None]
    runs: dict[str, VocabRun] = {}
    for run in plan_vocab_runs(vocabularies, vocab_scores=vocab_scores, sweep_k=sweep_k, sweep_m=sweep_m):
        if vocab_scores is None and run.score not in wanted:
            continue
        runs[run.detector] = run
        detectors[run.detector] = {
            "score": run.score,
            "column": KINDS[run.vocab.kind],
            "vocabulary": run.vocab.name,
            "vocab_ref": run.vocab.ref,
            "vocab_hash": run.vocab.hash,
            "kind": run.vocab.kind,
            "deployable": run.vocab.deployable,
            "m": run.m,
            "k": run.k,
            "params": _score_params(run.score, params, tau),
        }
    not_run = {}
    for name in wanted:
        if not any(r.score == name for r in runs.values()):
            not_run[name] = (
                "no vocabulary was given"
                if not vocabularies
                else f"no given vocabulary feeds {name} (force it with --vocab-score {name})"
            )
    return Plan(detectors, runs, not_run)


def evaluate_zeroshot(
    datasets: Mapping[str, Outputs],
    id_dataset: str,
    id_classes: ClassList,
    embed: EmbedFn,
    plan: Plan,
    *,
    templates: Sequence[str] = SEED_TEMPLATES,
    model: str = "model",
    tpr: float = 0.95,
    progress: bool = True,
    cached: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    on_detectors_done: Any = None,
) -> ZeroShotResult:
    """Score the ID test set and every OOD set for each detector column of `plan`; compute all metrics.

    `datasets` maps dataset id -> Outputs whose features are image embeddings (patch embeddings, when present, in
    ``extras['patch_embeddings']``). Columns whose inputs are missing (no patch embeddings for glmcm) are skipped
    and reported. `cached` maps dataset -> detector -> scores to reuse instead of recomputing;
    `on_detectors_done` is called with {detector: {dataset: scores}} as each batch of columns (the logit scores of
    one setting share a pass) finishes.
    """
    if id_dataset not in datasets:
        raise ZeroShotError(f"the ID dataset {id_dataset!r} is not among the datasets {list(datasets)}")
    ood_names = [name for name in datasets if name != id_dataset]
    if not ood_names:
        raise ZeroShotError("no OOD datasets given: pass at least one")
    for name, outputs in datasets.items():
        if len(outputs) == 0:
            raise ZeroShotError(f"dataset {name!r} is empty")
    cached = cached or {}
    detectors = {name: dict(info) for name, info in plan.detectors.items()}
    skipped = dict(plan.not_run)
    if "glmcm" in detectors:
        lacking = [ds for ds, out in datasets.items() if PATCH_EXTRA not in out.extras]
        if lacking:
            skipped["glmcm"] = f"no extra.{PATCH_EXTRA} in {', '.join(lacking)} (extract with patch embeddings)"
            detectors.pop("glmcm")
    logit_names = [n for n in detectors if n in LOGIT_SCORES]
    results: dict[str, dict[str, np.ndarray]] = {ds: {} for ds in datasets}

    def from_cache(detector: str) -> bool:
        if not all(
            detector in cached.get(ds, {}) and len(cached[ds][detector]) == len(out) for ds, out in datasets.items()
        ):
            return False
        for ds in datasets:
            results[ds][detector] = np.asarray(cached[ds][detector], dtype=np.float64)
        return True

    def finish(batch: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        for detector, per_dataset in batch.items():
            for ds, values in per_dataset.items():
                results[ds][detector] = np.asarray(values, dtype=np.float64)
        if on_detectors_done is not None:
            on_detectors_done({detector: dict(per_dataset) for detector, per_dataset in batch.items()})

    # Text embeddings are computed on first need and once per label list (one call per vocabulary covers its sweep).
    id_filter = IdFilter(id_classes.names)
    texts: dict[str, np.ndarray] = {}
    label_rows: dict[str, dict[str, int]] = {}

    def id_text() -> np.ndarray:
        if "" not in texts:
            texts[""] = embed_labels(embed, list(id_classes.names), templates)
        return texts[""]

    def vocab_text(run: VocabRun, labels: list[str]) -> np.ndarray:
        name = run.vocab.name
        if name not in texts:
            every = dict.fromkeys(
                lbl for r in plan.runs.values() if r.vocab.name == name for lbl in id_filter.keep(r.labels())[0]
            )
            texts[name] = embed_labels(embed, list(every), templates)
            label_rows[name] = {label: i for i, label in enumerate(every)}
        if not labels:
            return np.zeros((0, id_text().shape[1]), dtype=np.float32)
        return texts[name][[label_rows[name][label] for label in labels]]

    with progress_bar(progress) as bar:
        task = bar.add_task("zero-shot scores", total=len(detectors))
        todo = [n for n in logit_names if not from_cache(n)]
        # Logit-space scores with equal settings share one pass over the ID logits.
        settings: dict[tuple[float, float, int], list[str]] = {}
        for name in todo:
            p = detectors[name]["params"]
            settings.setdefault((p["tau"], p.get("gamma", 0.1), p.get("top_m", 100)), []).append(name)
        for (tau_value, gamma, top_m), names in settings.items():
            bar.update(task, description=", ".join(names))
            per_dataset = {
                ds: logit_scores(out.features, id_text(), names=names, tau=tau_value, gen_gamma=gamma, gen_top_m=top_m)
                for ds, out in datasets.items()
            }
            finish({name: {ds: per_dataset[ds][name] for ds in datasets} for name in names})
        bar.advance(task, len(logit_names))
        if "glmcm" in detectors:
            bar.update(task, description="glmcm")
            if not from_cache("glmcm"):
                finish(
                    {
                        "glmcm": {
                            ds: glmcm_scores(
                                out.features, out.extras[PATCH_EXTRA], id_text(), **detectors["glmcm"]["params"]
                            )
                            for ds, out in datasets.items()
                        }
                    }
                )
            bar.advance(task)
        # NegLabel runs of one vocabulary and τ (its sweep points) share one pass: each label's similarities are
        # computed once, not once per run that holds it.
        sweeps: dict[tuple[str, float], dict[str, list[int]]] = {}
        for detector, run in plan.runs.items():
            bar.update(task, description=detector)
            labels, dropped = id_filter.keep(run.labels())
            if not labels:
                # No negatives would make NegLabel 1 for every image (AUROC 0.5): a silent, meaningless column.
                raise ZeroShotError(
                    f"{detector}: vocabulary {run.vocab.name!r} has no label left after removing the ID class names "
                    f"and their WordNet synonyms ({len(run.labels())} labels, {len(dropped)} of them ID names)"
                )
            detectors[detector].update(num_labels=len(labels), dropped_id_labels=len(dropped))
            if from_cache(detector):
                bar.advance(task)
            elif run.score == "neglabel":
                vocab_text(run, [])  # embeds the vocabulary's labels once
                rows = [label_rows[run.vocab.name][label] for label in labels]
                sweeps.setdefault((run.vocab.name, detectors[detector]["params"]["tau"]), {})[detector] = rows
            else:
                matrix = vocab_text(run, labels)
                compute = get_score(run.score).compute
                finish(
                    {
                        detector: {
                            ds: compute(out.features, id_text(), matrix, **detectors[detector]["params"])
                            for ds, out in datasets.items()
                        }
                    }
                )
                bar.advance(task)
        for (name, tau_value), members in sweeps.items():
            bar.update(task, description=f"neglabel@{name} ({len(members)} columns)")
            runs = [
                (rows, detectors[d]["params"]["groups"], detectors[d]["params"]["seed"]) for d, rows in members.items()
            ]
            per_dataset = {
                ds: neglabel_sweep(out.features, id_text(), texts[name], runs, tau=tau_value)
                for ds, out in datasets.items()
            }
            finish({d: {ds: per_dataset[ds][i] for ds in datasets} for i, d in enumerate(members)})
            bar.advance(task, len(members))

    rows: list[ResultRow] = []
    for detector in detectors:
        for ood in ood_names:
            values = metrics.evaluate(results[id_dataset][detector], results[ood][detector], tpr)
            rows.extend(
                rows_from_metrics(
                    model, id_dataset, ood, detector, values, len(datasets[id_dataset]), len(datasets[ood])
                )
            )
    return ZeroShotResult(rows=rows, scores=results, detectors=detectors, skipped=skipped)


# ---------------------------------------------------------------------------------------------- store + run dir
def _detector_key(
    entries: Mapping[str, Mapping[str, Any]], id_classes: ClassList, templates: Sequence[str], info: Mapping[str, Any]
) -> str:
    """Content key of one detector's scores: its inputs' store metadata, class list, templates, score, vocabulary."""
    payload = {
        "entries": {
            ds: [m.get("finished"), m.get("num_rows"), m.get("provenance"), m.get("item_hash")]
            for ds, m in sorted(entries.items())
        },
        "classes": id_classes.hash,
        "templates": list(templates),
        "detector": {k: info.get(k) for k in ("score", "vocab_hash", "m", "k", "params")},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def evaluate_zeroshot_store(
    store: Store | str | os.PathLike[str],
    model_id: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    id_classes: ClassList,
    embed: EmbedFn,
    plan: Plan,
    *,
    out_dir: str | os.PathLike[str] | None = None,
    templates: Sequence[str] = SEED_TEMPLATES,
    tpr: float = 0.95,
    progress: bool = True,
) -> ZeroShotResult:
    """Zero-shot evaluation of one model's store entries; with `out_dir`, writes (and resumes) a run directory."""
    from .table import render_run_tables

    store = store if isinstance(store, Store) else Store(store)
    if not ood_datasets:
        raise ZeroShotError("no OOD datasets given: pass at least one --ood")
    names = [id_dataset, *ood_datasets]
    if len(set(names)) != len(names):
        raise ZeroShotError(f"dataset names must be distinct; got {names}")
    store.check_compatible(*[(model_id, name) for name in names])
    datasets = {name: store.read(model_id, name) for name in names}
    entries = {name: store.meta(model_id, name) for name in names}
    vocabularies = list({run.vocab.name: run.vocab for run in plan.runs.values()}.values())
    keys = {d: _detector_key(entries, id_classes, templates, info) for d, info in plan.detectors.items()}

    run_dir = RunDir(out_dir) if out_dir is not None else None
    if run_dir is not None:
        run_dir.check_writable("out_dir")
    cached, done = run_dir.resume(model_id, names, keys) if run_dir is not None else ({}, {})

    def persist(batch: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        # Saved as each batch of columns finishes (one write per dataset), so an interrupted run resumes after it.
        if run_dir is None:
            return
        for ds in next(iter(batch.values())):
            run_dir.save_scores(model_id, ds, {detector: per_dataset[ds] for detector, per_dataset in batch.items()})
        done.update({detector: keys[detector] for detector in batch})
        _write_run_json(
            run_dir,
            store,
            model_id,
            id_dataset,
            ood_datasets,
            entries,
            id_classes,
            templates,
            plan.detectors,
            done,
            vocabularies,
            complete=False,
        )

    result = evaluate_zeroshot(
        datasets,
        id_dataset,
        id_classes,
        embed,
        plan,
        templates=templates,
        model=model_id,
        tpr=tpr,
        progress=progress,
        cached=cached,
        on_detectors_done=persist,
    )
    info: dict[str, Any] = {"model": model_id, "zeroshot": {"detectors": result.detectors}}
    if run_dir is not None:
        info = _write_run_json(
            run_dir,
            store,
            model_id,
            id_dataset,
            ood_datasets,
            entries,
            id_classes,
            templates,
            result.detectors,
            {d: keys[d] for d in result.detectors},
            vocabularies,
            complete=True,
            skipped=result.skipped,
        )
        result.run_dir = run_dir.path
    result.table_markdown = render_run_tables(result.rows, info)
    if run_dir is not None:
        # Scores were saved column by column as they finished (merged, as the resume reads them).
        run_dir.write_results(model_id, result.rows, {}, result.table_markdown)
    return result


def report_vocabularies(vocabularies: Sequence[Vocabulary]) -> dict[str, dict[str, Any]]:
    """How the report shows each vocabulary: {name: {label, size, deployable, family, classes?, k?, m?}}.

    label: the Fi-ImageNet-1k paper's Table-2 column of its kind (WN, LLM siblings, WN+LLM, EOE, oracle), with the
    name added when the run has several vocabularies of that kind (a custom list goes by its name); family: its kind; size: its label
    count; k / m: its own siblings per class / WordNet prefix size, and classes: how many ID classes its per-class
    lists cover, from which the report sizes the k and M sweep points as `Vocabulary.select` does.
    """
    per_kind = Counter(v.kind for v in vocabularies)
    described: dict[str, dict[str, Any]] = {}
    for vocab in vocabularies:
        column = KINDS[vocab.kind]
        if vocab.kind == "custom":
            label = vocab.name
        else:
            label = column if per_kind[vocab.kind] == 1 else f"{column}: {vocab.name}"
        entry: dict[str, Any] = {
            "label": label,
            "size": len(vocab),
            "deployable": vocab.deployable,
            "family": vocab.kind,
        }
        if vocab.per_class is not None:
            entry["classes"] = len(vocab.per_class)
            if isinstance(vocab.params.get("k"), int):
                entry["k"] = vocab.params["k"]
        if vocab.ranked is not None and isinstance(vocab.params.get("m"), int):
            entry["m"] = vocab.params["m"]
        described[vocab.name] = entry
    return described


def _write_run_json(
    run_dir: RunDir,
    store: Store,
    model_id: str,
    id_dataset: str,
    ood_datasets: Sequence[str],
    entries: Mapping[str, Mapping[str, Any]],
    id_classes: ClassList,
    templates: Sequence[str],
    detectors: Mapping[str, Mapping[str, Any]],
    score_keys: Mapping[str, str],
    vocabularies: Sequence[Vocabulary],
    *,
    complete: bool,
    skipped: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    info = {
        "kind": "zeroshot",
        "model": model_id,
        "store": str(store.root.resolve()),
        "fit_dataset": None,
        "id_dataset": id_dataset,
        "ood_datasets": list(ood_datasets),
        "detectors": {name: dict(d.get("params", {})) for name, d in detectors.items()},
        "skipped_detectors": dict(skipped or {}),
        "score_keys": dict(score_keys),
        "head": None,
        "entries": {
            name: {k: meta.get(k) for k in ("provenance", "item_hash", "num_rows", "finished", "skipped", "versions")}
            for name, meta in entries.items()
        },
        "complete": complete,
        "vocabularies": report_vocabularies(vocabularies),
        "zeroshot": {
            "id_classes": id_classes.describe(),
            "templates": list(templates),
            "detectors": {name: dict(d) for name, d in detectors.items()},
            "vocabularies": {
                v.name: {
                    "ref": v.ref,
                    "version": v.version,
                    "hash": v.hash,
                    "kind": v.kind,
                    "deployable": v.deployable,
                    "size": len(v),
                    "params": v.params,
                    "provenance": v.provenance,
                }
                for v in vocabularies
            },
        },
    }
    run_dir.write_info(info)
    return info
