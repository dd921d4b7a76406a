"""Assemble a report from evaluation runs: the tables, the figures (built lazily) and the provenance, in sections.

`build_report` decides *what* goes in; `write_report` renders it as Markdown, LaTeX and HTML files plus PNG/PDF
figures; `html_report.render_html_document` turns it into one self-contained HTML page.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..analysis.breakdown import class_acceptance
from ..analysis.delong import DeLongResult, delong_test
from ..analysis.published import (
    PUBLISHED_SETS,
    Accuracy,
    Comparison,
    accuracy_not_computed,
    compare_published,
    read_accuracy,
    top1_fpr_points,
)
from ..analysis.rundata import RunData, check_distinct, load_run
from ..analysis.runs import IntervalRecord, best_detectors, interval_record
from ..analysis.spread import spread_vs_noise
from ..analysis.subsample import (
    SubsampleStudy,
    SubsampleSummary,
    acceptance_bits,
    resolve_n,
    subsample_curve,
    subsample_fpr,
)
from ..core.errors import AnalysisError
from ..core.oodgroups import OodGroups
from ..core.results import ResultRow, convention_rows
from ..core.tabular import Cell, Table
from ..util.progress import progress_bar
from . import figures, tables
from .conventions import (
    convention_text,
    full_spectrum_tables,
    group_tables,
    openood_exports,
    resolve_groups,
    rows_in_convention,
    with_convention_note,
)

__all__ = [
    "CONVENTION",
    "label_variants",
    "ReportOptions",
    "FigureItem",
    "Section",
    "ReportContent",
    "build_report",
    "curve_sizes",
    "provenance_tables",
    "split_rows",
    "merge_vocabularies",
]


CONVENTION = (
    "Convention: a higher score means more in-distribution, and ID is the positive class. FPR@95 is the share of OOD "
    "images accepted as ID at the threshold that accepts 95% of the ID test images (ties at the threshold count as "
    "accepted); AUROC is the probability that an ID image outscores an OOD image (ties count one half). OpenOOD and "
    "pytorch-ood report FPR@95 with OOD as the positive class (the share of ID images rejected when 95% of the OOD "
    "images are caught): a different number. Values in %."
)


@dataclass(frozen=True)
class ReportOptions:
    """What to compute for a report (subsampling, intervals, figures)."""

    n: int | str = "auto"  # subset size of Table A6 ('auto': 655 capped at half the smallest OOD set)
    draws: int = 1000
    seed: int = 0
    curve_points: int = 8  # subset sizes per Fig. A4 curve (log-spaced up to N)
    curve_draws: int = 300
    resamples: int = 1000  # bootstrap resamples for the interval table
    confidence: float = 0.95
    tpr: float = 0.95
    plot_detectors: tuple[str, ...] | None = None  # ROC/histograms; default: the 3 best by mean FPR@95
    score_figures: bool = True  # ROC curves and score histograms per (model, OOD set)
    vocabularies: Mapping[str, Any] | None = None
    title: str = "oodbench report"
    against: str | None = None  # a published set (e.g. "fi-imagenet-1k") to put beside the run's numbers
    # A "Context" section first: paragraphs (str, blank lines between) and tables, e.g. the demo's datasets.
    intro: tuple[str | Table, ...] = ()
    convention: str = "oodbench"  # metric convention of the result tables: oodbench or openood (report/conventions.py)
    aupr: bool = False  # AUPR-In / AUPR-Out in the per-model and group tables
    groups: str | None = None  # OOD groups file or shipped name; default with openood: OpenOOD v1.5's near / far
    csid: tuple[str, ...] = ()  # covariate-shifted ID sets (default: each run's run.json csid_datasets)


@dataclass
class FigureItem:
    """A figure made on demand (so a report with many figures never holds them all in memory)."""

    stem: str
    caption: str
    make: Callable[[], Figure]


@dataclass
class Section:
    """A titled part of the report: an introduction and tables/figures in order."""

    key: str
    title: str
    text: str = ""
    items: list[Table | FigureItem] = field(default_factory=list)


@dataclass
class ReportContent:
    """Everything a renderer needs."""

    title: str
    sections: list[Section]
    runs: list[str]
    notes: list[str] = field(default_factory=list)
    subsample: list[SubsampleSummary] = field(default_factory=list)
    intervals: list[IntervalRecord] = field(default_factory=list)
    comparisons: list[tuple[str, str, DeLongResult]] = field(default_factory=list)
    published: list[Comparison] = field(default_factory=list)  # with --against: every published cell
    exports: dict[str, str] = field(default_factory=dict)  # relative path -> text (OpenOOD's CSV layout)

    def tables(self) -> list[Table]:
        return [item for section in self.sections for item in section.items if isinstance(item, Table)]

    def figures(self) -> list[FigureItem]:
        return [item for section in self.sections for item in section.items if isinstance(item, FigureItem)]


def curve_sizes(n_total: int, points: int, extra: Sequence[int] = ()) -> list[int]:
    """Log-spaced subset sizes from min(10, N) to N (plus `extra` sizes that fit), for Fig. A4."""
    start = min(10, n_total)
    sizes = {int(round(v)) for v in np.geomspace(start, n_total, max(2, points))} | {
        e for e in extra if 1 <= e <= n_total
    }
    return sorted(s for s in sizes if s >= 1)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


def _mean_fpr_order(rows: Sequence[ResultRow], pair: tuple[str, str], available: set[str]) -> list[str]:
    """Detectors of a (model, ID) ordered by mean FPR@95 over its OOD sets (only those with scores)."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        if (r.model, r.id_dataset) == pair and r.metric == "fpr95" and r.detector in available:
            sums.setdefault(r.detector, []).append(r.value)
    order = list(sums)
    return sorted(sums, key=lambda d: (float(np.mean(sums[d])), order.index(d)))


def plain_text(value: object) -> str:
    """A provenance value as reading text: nested mappings as `key: value` pairs, lists comma-separated.

    Never a Python repr: `{'input': '8x8'}` reads as `input: 8x8`, and a nested `{'sizes': {'fit': 650}}` as
    `sizes: (fit: 650)`.
    """
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_nested(v)}" for k, v in value.items()) or "–"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain_text(v) for v in value) or "–"
    return "–" if value is None else str(value)


def _nested(value: object) -> str:
    if isinstance(value, Mapping) and value:
        return "(" + ", ".join(f"{k}: {_nested(v)}" for k, v in value.items()) + ")"
    return plain_text(value)


def provenance_tables(run: RunData) -> list[Table]:
    """The run's description (datasets, detectors), its store entries' provenance and the library versions."""
    info = run.info
    key = _slug(run.path.name or "run")
    if not info:
        return [
            Table(
                f"prov-{key}",
                f"Run {run.path}",
                ("item", "value"),
                ((Cell("run.json"), Cell("absent: no provenance recorded")),),
                align=("l", "l"),
                wrap=True,
            )
        ]
    head = info.get("head") or {}
    head_prov = head.get("provenance") or {}
    general = [
        ("model", str(info.get("model", "–"))),
        ("run directory", str(run.path)),
        ("kind", "zero-shot" if run.is_zeroshot else "supervised"),
        ("store", str(info.get("store", "–"))),
        ("fit set", str(info.get("fit_dataset") or "–")),
        ("ID test set", str(info.get("id_dataset", "–"))),
        ("OOD sets", ", ".join(info.get("ood_datasets", [])) or "–"),
        ("head", plain_text(head_prov)),
        ("complete", str(info.get("complete", "–"))),
    ]
    detectors = info.get("detectors") or {}
    general.append(
        (
            "detectors",
            ", ".join(
                f"{name}({', '.join(f'{k}={plain_text(v)}' for k, v in params.items())})" if params else name
                for name, params in detectors.items()
            )
            or "–",
        )
    )
    for name, reason in (info.get("skipped_detectors") or {}).items():
        general.append((f"skipped {name}", plain_text(reason)))
    result = [
        Table(
            f"prov-{key}",
            f"Run: {info.get('model', run.path.name)}",
            ("item", "value"),
            tuple((Cell(k), Cell(v)) for k, v in general),
            align=("l", "l"),
            wrap=True,
        )
    ]
    entries = info.get("entries") or {}
    if entries:
        body = []
        versions: dict[str, set[str]] = {}
        for dataset, meta in entries.items():
            meta = meta or {}
            prov = meta.get("provenance") or {}
            body.append(
                (
                    Cell(dataset),
                    Cell(str(meta.get("num_rows", "–"))),
                    Cell(str(meta.get("item_hash") or "–")),
                    Cell(plain_text(prov.get("model"))),
                    Cell(plain_text(prov.get("checkpoint"))),
                    Cell(plain_text(prov.get("preprocessing"))),
                    Cell(str(meta.get("finished") or "–")),
                )
            )
            for lib, version in (meta.get("versions") or {}).items():
                versions.setdefault(lib, set()).add(str(version))
        for lib, version in (head.get("versions") or {}).items():
            versions.setdefault(lib, set()).add(str(version))
        result.append(
            Table(
                f"entries-{key}",
                "Store entries (dataset hashes, checkpoints)",
                ("dataset", "rows", "item hash (SHA-256)", "model", "checkpoint", "preprocessing", "extracted"),
                tuple(body),
                align=("l", "r", "l", "l", "l", "l", "l"),
                wrap=True,
            )
        )
        if versions:
            result.append(
                Table(
                    f"versions-{key}",
                    "Library versions at extraction",
                    ("library", "version"),
                    tuple((Cell(lib), Cell(", ".join(sorted(v)))) for lib, v in sorted(versions.items())),
                )
            )
    return result


def _report_versions() -> Table:
    import platform

    import matplotlib
    import scipy

    from .. import __version__

    items = [
        ("python", platform.python_version()),
        ("oodbench", __version__),
        ("numpy", np.__version__),
        ("scipy", scipy.__version__),
        ("matplotlib", matplotlib.__version__),
    ]
    return Table(
        "versions-report",
        "Library versions of this report",
        ("library", "version"),
        tuple((Cell(k), Cell(v)) for k, v in items),
    )


def build_report(
    run_dirs: Sequence[str | os.PathLike[str]] | Sequence[RunData],
    options: ReportOptions | None = None,
    *,
    progress: bool = False,
) -> ReportContent:
    """Tables, figures and provenance for one or more evaluation runs (e.g. one per model)."""
    options = options or ReportOptions()
    groups = resolve_groups(options.groups, options.convention)  # a bad convention or groups file fails here
    if options.against is not None and options.against not in PUBLISHED_SETS:
        # Checked before any statistics run: a typo should not cost the whole report's time.
        raise AnalysisError(f"unknown published set {options.against!r}; available: {', '.join(PUBLISHED_SETS)}")
    if all(isinstance(r, RunData) for r in run_dirs):
        runs = list(run_dirs)  # type: ignore[arg-type]
    elif any(isinstance(r, RunData) for r in run_dirs):
        raise AnalysisError("pass either run directories or loaded RunData objects, not a mix")
    else:
        runs = [load_run(p) for p in run_dirs]  # type: ignore[arg-type]
    if not runs:
        raise AnalysisError("no runs to report on")
    runs = label_variants(runs)
    check_distinct(runs)
    supervised, zeroshot = split_rows(runs)
    supervised = convention_rows(supervised, "oodbench")  # the score sections' rows; tables use `shown`
    shown = rows_in_convention(runs, supervised, options.convention, options.tpr)
    convention = convention_text(options.convention, CONVENTION)
    content = ReportContent(options.title, [], [str(run.path) for run in runs])
    vocabularies, conflicts = merge_vocabularies(runs, options.vocabularies)
    content.notes.extend(conflicts)

    # Which run holds the scores of each supervised (model, ID) pair (never a zero-shot run of the same model id).
    pairs = list(dict.fromkeys((r.model, r.id_dataset) for r in supervised))
    scored: dict[tuple[str, str], RunData] = {}
    for run in runs:
        if run.is_zeroshot:
            continue
        for pair in run.pairs():
            if pair in pairs and pair not in scored and run.path.is_dir() and run.has_scores(*pair):
                scored[pair] = run

    if options.intro:
        content.sections.append(
            Section(
                "context",
                "Context",
                "\n\n".join(i for i in options.intro if isinstance(i, str)),
                [i for i in options.intro if isinstance(i, Table)],
            )
        )
    accuracy: list[Accuracy] = [a for run in runs if run.path.is_dir() for a in read_accuracy(run.path)]
    if supervised:
        overview = Section("overview", "Overview", "Best detectors per model and OOD set.\n\n" + convention)
        top1: dict[str, dict[str, float]] = {}
        for acc in accuracy:
            top1.setdefault(acc.model, {})[acc.labels] = acc.top1
        label_sets = {acc.model: acc.label_set for acc in accuracy if acc.labels == "original" and acc.label_set}
        missing = {m: why for run in runs if run.path.is_dir() for m, why in accuracy_not_computed(run.path).items()}
        for run in runs:  # a model shown under a label (runs of one model that differ) keeps its accuracy
            if isinstance(run, _Variant):
                for known in (top1, label_sets, missing):
                    if run.model_name in known:
                        known[run.label] = known[run.model_name]  # type: ignore[index]
        overview_tables = [
            tables.table1(shown, top1=top1, label_sets=label_sets, top1_missing=missing),
            tables.table_a2(shown),
            tables.table_a1(shown),
        ]
        if options.convention != "oodbench":
            overview_tables = [with_convention_note(t, options.convention) for t in overview_tables]
        overview.items.extend(overview_tables)
        content.sections.append(overview)
        _add_layout_sections(content, runs, shown, pairs, groups, options, accuracy)
        for model, id_dataset in pairs:
            section = Section(f"model-{_slug(model)}-{_slug(id_dataset)}", f"Model {model} (ID: {id_dataset})")
            section.items.append(
                tables.table_detectors(
                    shown,
                    model,
                    id_dataset,
                    convention=None if options.convention == "oodbench" else options.convention,
                    aupr=options.aupr,
                )
            )
            section.items.append(
                FigureItem(
                    f"fig1-{_slug(model)}",
                    f"Best detector per OOD set for {model} (paper Fig. 1)",
                    lambda m=model, i=id_dataset: figures.fig_best_detectors(shown, m, i),
                )
            )
            content.sections.append(section)

    if zeroshot:
        zero_pairs = list(dict.fromkeys((r.model, r.id_dataset) for r in zeroshot))
        zero = Section(
            "zeroshot",
            "Zero-shot vocabularies",
            "Zero-shot models (" + ", ".join(m for m, _ in zero_pairs) + ") appear in Table 2 and the "
            "vocabulary-size figure only, not in the supervised tables, subsampling or intervals."
            + ("" if supervised and options.convention == "oodbench" else "\n\n" + CONVENTION),  # Table 2: oodbench's
        )
        zero.items.append(tables.table2(zeroshot, vocabularies, pairs=zero_pairs))
        if figures.vocab_sweep_lines(zeroshot, vocabularies):
            zero.items.append(
                FigureItem(
                    "figA1-vocabulary-sweep",
                    "FPR@95 against negative-vocabulary size (paper Figs. A1 and A2)",
                    lambda: figures.fig_vocab_sweep(zeroshot, vocabularies),
                )
            )
        content.sections.append(zero)

    scored_pairs = [p for p in pairs if p in scored]
    missing = [p for p in pairs if p not in scored]
    if missing:
        content.notes.append(
            "No per-image scores for "
            + ", ".join(f"{m}/{i}" for m, i in missing)
            + ": subsampling, intervals and score figures skipped for them."
        )
    if scored_pairs:
        _add_score_sections(content, supervised, scored, scored_pairs, options, progress)
        if options.convention != "oodbench":  # their thresholds accept 95% of ID: oodbench's FPR@95, said so
            for section in content.sections:
                if section.key in ("subsampling", "uncertainty", "ood-classes", "scores"):
                    section.text = (section.text + "\n\n" + CONVENTION).strip()

    if options.against:
        _add_published_section(content, runs, options.against, accuracy)

    provenance = Section("provenance", "Provenance", "Models, checkpoints, dataset hashes and library versions.")
    for run in runs:
        provenance.items.extend(provenance_tables(run))
    provenance.items.append(_report_versions())
    content.sections.append(provenance)
    _unique_names(content)
    return content


def _add_layout_sections(
    content: ReportContent,
    runs: Sequence[RunData],
    shown: Sequence[ResultRow],
    pairs: Sequence[tuple[str, str]],
    groups: OodGroups | None,
    options: ReportOptions,
    accuracy: Sequence[Accuracy],
) -> None:
    """OpenOOD's layouts: near / far group tables, full-spectrum tables, and (openood convention) its CSV files."""
    if groups is not None:
        grouped = group_tables(shown, groups, pairs, options.convention, options.aupr)
        if grouped:
            content.sections.append(
                Section(
                    "groups",
                    "OOD groups",
                    f"OOD sets grouped as {groups.title} ({groups.source}), each group with its mean.",
                    list(grouped),
                )
            )
    full, full_rows = full_spectrum_tables(runs, shown, pairs, groups, options.convention, options.tpr, options.csid)
    if full:
        content.sections.append(
            Section(
                "full-spectrum",
                "Full-spectrum evaluation",
                "Covariate-shifted ID sets counted as ID (their images joined to the ID test set's), beside the "
                "standard setting, as OpenOOD v1.5's full-spectrum results.",
                list(full),
            )
        )
    if options.convention == "openood":
        content.exports.update(openood_exports(shown, full_rows, groups, accuracy))


def _add_published_section(
    content: ReportContent, runs: Sequence[RunData], against: str, accuracy: Sequence[Accuracy]
) -> None:
    """The published tables' layouts with the runs' values beside the paper's (after the Overview)."""
    from ..analysis.published import load_published
    from .published import published_tables, summary_table

    rows = [r for run in runs for r in run.rows]
    owners: dict[tuple[str, str], RunData] = {}
    for run in runs:
        for pair in run.pairs():
            owners.setdefault(pair, run)

    def scores(model: str, id_dataset: str, ood_dataset: str) -> tuple[dict, dict] | None:
        run = owners.get((model, id_dataset))
        if run is None or not run.path.is_dir() or not run.has_scores(model, ood_dataset):
            return None
        if not run.has_scores(model, id_dataset):
            return None
        return run.paired_scores(model, id_dataset, ood_dataset)

    content.published = compare_published(rows, accuracy, scores=scores, name=against, subsample=content.subsample)
    if not any(c.run_model for c in content.published):
        content.notes.append(
            f"--against {against}: no model of the runs ({', '.join(sorted({r.model for r in rows}))}) names a model "
            "of the paper's Table A8 (by display name or checkpoint); every published cell is shown without a "
            "reproduction."
        )
    section = Section(
        "published",
        "Beside the Fi-ImageNet-1k paper",
        "The paper's Tables 1, 2, 3 and A1–A7 in their printed layouts, each cell holding this run's value beside the "
        "published one (Rozumnyi et al., Fi-ImageNet-1k: An OOD benchmark From the Inside of the ImageNet-1k "
        "validation set). Models match by their Table A8 name or checkpoint, datasets by name.",
    )
    section.items.append(summary_table(content.published))
    section.items.extend(published_tables(content.published, accuracy))
    points = top1_fpr_points(rows, accuracy, against)
    rho = next((c for c in content.published if c.cell.metric == "spearman_top1_fpr95"), None)
    cells = load_published(against, "A7")
    top1 = {c.model: c.value for c in cells if c.metric == "top1"}
    published_points = [(c.model, top1[c.model], c.value) for c in cells if c.metric == "fpr95"]
    section.items.append(
        FigureItem(
            "top1-vs-fpr95",
            "Top-1 (re-annotated labels) against best FPR@95 on Fi-ImageNet-1k: the run's models and the paper's "
            "Table A7",
            lambda: figures.fig_top1_fpr(
                points, published_points, (rho.reproduced if rho else None, rho.cell.value if rho else None)
            ),
        )
    )
    keys = [s.key for s in content.sections]
    position = keys.index("overview") + 1 if "overview" in keys else len([k for k in keys if k == "context"])
    content.sections.insert(position, section)


@dataclass
class _Variant(RunData):
    """A run whose model is shown under a label (its rows say the label); scores are read under the real name."""

    model_name: str = ""
    label: str = ""

    def _real(self, model: str) -> str:
        return self.model_name if model == self.label else model

    def has_scores(self, model: str, dataset: str) -> bool:
        return super().has_scores(self._real(model), dataset)

    def scores(self, model: str, dataset: str) -> dict[str, np.ndarray]:
        return super().scores(self._real(model), dataset)


def _settings(run: RunData) -> dict[str, str]:
    """What a run was evaluated with, flattened: each detector's parameters, the fit set, the head, the store."""
    info = run.info
    flat = {
        f"{name}": ", ".join(f"{k}={plain_text(v)}" for k, v in sorted((params or {}).items()))
        for name, params in (info.get("detectors") or {}).items()
    }
    flat["fit set"] = str(info.get("fit_dataset") or "")
    head = (info.get("head") or {}).get("provenance") or {}
    flat["head"] = plain_text(dict(sorted(head.items()))) if head else ""
    flat["store"] = str(info.get("store") or "")
    return flat


def label_variants(runs: Sequence[RunData]) -> list[RunData]:
    """Runs of one (model, ID set) that differ in their settings, relabelled by what differs (e.g.
    ``resnet50 [energy: temperature=2]``) so that tables keep them apart; runs without a difference are labelled
    by their directory name."""
    by_pair: dict[tuple[str, str], list[int]] = {}
    for index, run in enumerate(runs):
        for pair in run.pairs():
            by_pair.setdefault(pair, []).append(index)
    labels: dict[int, tuple[str, str]] = {}
    for (model, _), indices in by_pair.items():
        if len(indices) < 2 or any(runs[i].is_zeroshot or len({m for m, _ in runs[i].pairs()}) > 1 for i in indices):
            continue
        settings = [_settings(runs[i]) for i in indices]
        keys = sorted({k for s in settings for k in s})
        differing = [k for k in keys if len({s.get(k, "(absent)") for s in settings}) > 1]
        for i, setting in zip(indices, settings, strict=True):
            parts = [
                f"{k}: {setting.get(k) or '(default)'}" if setting.get(k) is not None else f"{k}: absent"
                for k in differing
            ]
            labels[i] = (model, f"{model} [{'; '.join(parts) if parts else runs[i].path.name}]")
    if not labels:
        return list(runs)
    seen = [label for _, label in labels.values()]
    if len(set(seen)) != len(seen):
        raise AnalysisError(f"runs of one model cannot be told apart: {sorted(seen)}; give them distinct directories")
    result: list[RunData] = []
    for index, run in enumerate(runs):
        if index not in labels:
            result.append(run)
            continue
        model, label = labels[index]
        rows = [replace(r, model=label) if r.model == model else r for r in run.rows]
        result.append(_Variant(run.path, run.info, rows, model_name=model, label=label))
    return result


def split_rows(runs: Sequence[RunData]) -> tuple[list[ResultRow], list[ResultRow]]:
    """(supervised rows, zero-shot rows) of the runs.

    A run whose run.json says ``"kind": "zeroshot"`` is zero-shot as a whole; in other runs (and bare results files)
    a (model, ID set) with vocabulary-bound scores (``score@vocabulary``) is a zero-shot model.
    """
    supervised: list[ResultRow] = []
    zeroshot: list[ResultRow] = []
    for run in runs:
        if run.is_zeroshot:
            zeroshot.extend(run.rows)
            continue
        zero_pairs = set(tables.zeroshot_pairs(run.rows))
        for row in run.rows:
            (zeroshot if (row.model, row.id_dataset) in zero_pairs else supervised).append(row)
    return supervised, zeroshot


def merge_vocabularies(runs: Sequence[RunData], given: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """Vocabulary metadata of the runs' run.json ("vocabularies") overlaid field by field with `given`, and notes
    on keys whose metadata differ between runs."""
    merged: dict[str, Any] = {}
    notes: list[str] = []
    for run in runs:
        found = run.info.get("vocabularies") or {}
        if not isinstance(found, Mapping):
            raise AnalysisError(f"{run.path}/run.json: 'vocabularies' must map keys to {{label, size, ...}}")
        for key, meta in found.items():
            if key in merged and merged[key] != meta:
                notes.append(
                    f"vocabulary {key!r} is described differently by the runs ({merged[key]} vs {meta} "
                    f"in {run.path}); using the latter"
                )
            merged[key] = meta
    for key, meta in (given or {}).items():
        earlier = merged.get(key)
        both = isinstance(earlier, Mapping) and isinstance(meta, Mapping)
        merged[key] = {**earlier, **meta} if both else meta  # type: ignore[dict-item]
    return merged, notes


def _unique_names(content: ReportContent) -> None:
    """Suffix repeated table keys and figure stems (-2, -3, …): they name files and HTML anchors."""
    seen: dict[str, int] = {}
    for section in content.sections:
        for index, item in enumerate(section.items):
            name = item.key if isinstance(item, Table) else item.stem
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                unique = f"{name}-{seen[name]}"
                if isinstance(item, Table):
                    section.items[index] = replace(item, key=unique)
                else:
                    item.stem = unique


def _add_score_sections(
    content: ReportContent,
    supervised: Sequence[ResultRow],
    scored: Mapping[tuple[str, str], RunData],
    pairs: Sequence[tuple[str, str]],
    options: ReportOptions,
    progress: bool,
) -> None:
    """Subsampling (Table A6, Fig. A4), intervals and DeLong, ROC curves and histograms."""
    plans = [(pair, ood) for pair in pairs for ood in scored[pair].ood_datasets(*pair)]
    n_ood = {(r.model, r.id_dataset, r.ood_dataset): r.n_ood for run in scored.values() for r in run.rows}
    sizes = {f"{pair[0]}/{ood}": n_ood[(*pair, ood)] for pair, ood in plans}
    n = resolve_n(options.n, sizes)
    if n > max(sizes.values()):
        raise AnalysisError(
            f"n={n} exceeds every OOD set ({', '.join(f'{k}: {v}' for k, v in sizes.items())}); "
            f"pass a smaller n, e.g. {max(1, min(sizes.values()) // 2)}"
        )
    sub = Section(
        "subsampling",
        "Subsampling (paper Table A6, Fig. A4)",
        f"The best detector's FPR@95 over {options.draws} draws of n={n} OOD images without replacement.",
    )
    stats_section = Section(
        "uncertainty",
        "Uncertainty",
        "Intervals of each OOD set's best detector, and DeLong's test of the two best by AUROC.",
    )
    score_section = Section("scores", "ROC curves and score distributions")
    class_section = Section(
        "ood-classes",
        "Which OOD classes pass as ID",
        "For OOD sets whose store entry carries class labels: each class's images accepted as ID by the best detector "
        "(by FPR@95) at the threshold that accepts 95% of the ID test set, most accepted first, with Wilson 95% "
        "intervals.",
    )
    curves: dict[tuple[str, str], dict[str, list[SubsampleStudy]]] = {}
    thresholds: dict[tuple[str, str], dict[str, float]] = {}  # ID thresholds per (model, ID set): computed once
    with progress_bar(progress) as bar:
        task = bar.add_task("report statistics", total=len(plans))
        for pair, ood in plans:
            run = scored[pair]
            id_scores, ood_scores = run.paired_scores(pair[0], pair[1], ood)
            id_scores = {d: s for d, s in id_scores.items() if tables.parse_vocabulary_score(d) is None}
            ood_scores = {d: ood_scores[d] for d in id_scores}
            total = len(next(iter(ood_scores.values())))
            # One set of acceptance bits serves Table A6 and every point of the Fig. A4 curve.
            bits = acceptance_bits(id_scores, ood_scores, options.tpr, thresholds.setdefault(pair, {}))
            if n <= total:
                study = subsample_fpr(
                    id_scores,
                    ood_scores,
                    n,
                    draws=options.draws,
                    seed=options.seed,
                    tpr=options.tpr,
                    model=pair[0],
                    id_dataset=pair[1],
                    ood_dataset=ood,
                    bits=bits,
                )
                content.subsample.append(study.summary())
            else:
                content.notes.append(f"{pair[0]}/{ood}: not subsampled, n={n} exceeds its {total} OOD images.")
            curves.setdefault(pair, {})[ood] = subsample_curve(
                id_scores,
                ood_scores,
                curve_sizes(total, options.curve_points, [n]),
                draws=options.curve_draws,
                seed=options.seed,
                tpr=options.tpr,
                model=pair[0],
                id_dataset=pair[1],
                ood_dataset=ood,
                bits=bits,
            )
            ranked = [
                d for d in best_detectors(run, pair[0], pair[1], ood, "fpr95", count=len(id_scores)) if d in id_scores
            ]
            best = ranked[0] if ranked else curves[pair][ood][0].best
            content.intervals.append(
                interval_record(
                    pair[0],
                    pair[1],
                    ood,
                    best,
                    id_scores[best],
                    ood_scores[best],
                    resamples=options.resamples,
                    confidence=options.confidence,
                    seed=options.seed,
                    tpr=options.tpr,
                )
            )
            labelled = _ood_labels(run, pair[0], ood, total)
            if labelled is not None:
                class_section.items.append(
                    tables.table_class_acceptance(
                        class_acceptance(id_scores[best], ood_scores[best], labelled[0], labelled[1], tpr=options.tpr),
                        key=f"classes-{_slug(pair[0])}-{_slug(ood)}",
                        title=f"{pair[0]} on {ood}: acceptance per OOD class ({best})",
                    )
                )
            top_auroc = [
                d for d in best_detectors(run, pair[0], pair[1], ood, "auroc", count=len(id_scores)) if d in id_scores
            ][:2]
            if len(top_auroc) == 2:
                a, b = top_auroc
                content.comparisons.append(
                    (
                        pair[0],
                        ood,
                        delong_test(
                            id_scores[a],
                            ood_scores[a],
                            id_scores[b],
                            ood_scores[b],
                            confidence=options.confidence,
                            names=(a, b),
                        ),
                    )
                )
            if options.score_figures:
                chosen = list(options.plot_detectors or _mean_fpr_order(supervised, pair, set(id_scores))[:3])
                chosen = [d for d in chosen if d in id_scores]
                if chosen:
                    ids_c = {d: id_scores[d] for d in chosen}
                    oods_c = {d: ood_scores[d] for d in chosen}
                    label = f"{pair[0]}: {pair[1]} vs {ood}"
                    score_section.items.append(
                        FigureItem(
                            f"roc-{_slug(pair[0])}-{_slug(ood)}",
                            f"ROC curves, {label}",
                            lambda i=ids_c, o=oods_c, t=label: figures.fig_roc(i, o, t, options.tpr),
                        )
                    )
                    score_section.items.append(
                        FigureItem(
                            f"hist-{_slug(pair[0])}-{_slug(ood)}",
                            f"Score histograms, {label}",
                            lambda i=ids_c, o=oods_c, t=label, lab=(pair[1], ood): figures.fig_score_histograms(
                                i, o, t, options.tpr, labels=lab
                            ),
                        )
                    )
            bar.advance(task)
    if content.subsample:
        spreads = spread_vs_noise(content.subsample)
        sub.items.append(tables.table_a6(content.subsample, spreads))
    for pair, per_ood in curves.items():
        sub.items.append(
            FigureItem(
                f"figA4-{_slug(pair[0])}",
                f"FPR@95 over subset size n, {pair[0]} "
                f"({options.curve_draws} draws per n; band: mean ± 2σ; dashed: full ± 2·SE) (paper Fig. A4)",
                lambda c=per_ood, m=pair[0]: figures.fig_subsample_curves(c, m),
            )
        )
    content.sections.append(sub)
    if content.intervals:
        stats_section.items.append(
            tables.table_intervals(
                content.intervals, options.confidence, title="Confidence intervals of the best detector per OOD set"
            )
        )
    if content.comparisons:
        stats_section.items.append(tables.table_delong(content.comparisons, options.confidence))
    content.sections.append(stats_section)
    if class_section.items:
        content.sections.append(class_section)
    if score_section.items:
        content.sections.append(score_section)


def _ood_labels(run: RunData, model: str, ood: str, count: int) -> tuple[np.ndarray, list[str] | None] | None:
    """The class labels (and names) of an OOD set's store entry, when it has them row for row with the scores."""
    from ..core.errors import StoreError
    from ..core.store import Store

    root = run.info.get("store")
    real = run.model_name if isinstance(run, _Variant) and model == run.label else model
    if not root or not os.path.isdir(root):
        return None
    try:
        store = Store(root)
        meta = store.meta(real, ood)
        if "labels" not in meta.get("arrays", {}):
            return None
        labels = np.asarray(store.read_array(real, ood, "labels"))
    except StoreError:
        return None
    if labels.shape != (count,) or not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
        return None
    names = (meta.get("dataset") or {}).get("class_names")
    if names is not None and labels.size and labels.max() >= len(names):
        names = None
    return labels, names
