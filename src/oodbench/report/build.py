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
from ..analysis.runs import IntervalRecord, IntervalRequest, best_detectors, interval_records
from ..analysis.spread import spread_vs_noise
from ..analysis.subsample import (
    AcceptanceBits,
    SubsampleStudy,
    SubsampleSummary,
    acceptance_bits,
    resolve_n,
    subsample_curve,
    subsample_fpr,
)
from ..core.errors import AnalysisError, MetricError
from ..core.grouped import relabel_table
from ..core.metrics import DEFAULT_TPR, fpr_label, relabel_fpr, stated_tpr, tpr_of_metric
from ..core.names import suggest
from ..core.oodgroups import OodGroups
from ..core.results import ResultRow, convention_rows
from ..core.tabular import Table
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
from .provenance import RunProvenance, plain_text, provenance_tables, report_versions, slug

__all__ = [
    "CONVENTION",
    "label_variants",
    "ReportOptions",
    "FigureItem",
    "Section",
    "ReportContent",
    "build_report",
    "curve_sizes",
    "plain_text",
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
    # The ID acceptance rate of the FPR threshold; None: the one the runs were evaluated at (run.json's tpr).
    tpr: float | None = None
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

    @property
    def rate(self) -> float:
        """The FPR's ID acceptance rate: `tpr`, which `build_report` sets to the runs' (0.95 while unset)."""
        return DEFAULT_TPR if self.tpr is None else float(self.tpr)


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


def _mean_fpr_order(rows: Sequence[ResultRow], pair: tuple[str, str], available: set[str]) -> list[str]:
    """Detectors of a (model, ID) ordered by mean FPR@95 over its OOD sets (only those with scores)."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        if (r.model, r.id_dataset) == pair and r.metric == "fpr95" and r.detector in available:
            sums.setdefault(r.detector, []).append(r.value)
    order = list(sums)
    return sorted(sums, key=lambda d: (float(np.mean(sums[d])), order.index(d)))


def build_report(
    run_dirs: Sequence[str | os.PathLike[str]] | Sequence[RunData],
    options: ReportOptions | None = None,
    *,
    progress: bool = False,
) -> ReportContent:
    """Tables, figures and provenance for one or more evaluation runs (e.g. one per model)."""
    options = options or ReportOptions()
    groups = _checked_groups(options)
    runs = _loaded_runs(run_dirs)
    # Every number, label and computed table of the report is at the runs' own rate, so they agree on one FPR.
    options = replace(options, tpr=_report_tpr(runs, options))
    _check_plot_detectors(runs, options)
    runs = [replace(run, rows=_plain_fpr_rows(run.rows)) for run in runs]
    supervised, zeroshot = split_rows(runs)
    supervised = convention_rows(supervised, "oodbench")  # the score sections' rows; tables use `shown`
    shown = rows_in_convention(runs, supervised, options.convention, options.rate)
    content = ReportContent(options.title, [], [str(run.path) for run in runs])
    vocabularies, conflicts = merge_vocabularies(runs, options.vocabularies)
    content.notes.extend(conflicts)
    pairs = list(dict.fromkeys((r.model, r.id_dataset) for r in supervised))
    accuracy: list[Accuracy] = [a for run in runs if run.path.is_dir() for a in read_accuracy(run.path)]
    if options.intro:
        content.sections.append(_context_section(options.intro))
    if supervised:
        content.sections.append(_overview_section(runs, shown, accuracy, options))
        _add_layout_sections(content, runs, shown, pairs, groups, options, accuracy)
        content.sections.extend(_model_section(shown, pair, options) for pair in pairs)
    if zeroshot:
        content.sections.append(_zeroshot_section(zeroshot, vocabularies, bool(supervised), options))
    _add_score_sections(content, supervised, _scored_runs(runs, pairs), pairs, options, progress)
    if options.against:
        _add_published_section(content, runs, options.against, accuracy)
    content.sections.append(_provenance_section(runs))
    _relabel(content, options.rate)
    _unique_names(content)
    return content


def run_tpr(run: RunData) -> float:
    """The ID acceptance rate of a run's FPR: run.json's ``tpr``, else the rate its rows' FPR names state (``fpr80``),
    else 0.95 (runs written before run.json recorded it, and result files named ``fpr95``)."""
    try:
        stated = stated_tpr(r.metric for r in run.rows)
    except MetricError as exc:
        raise AnalysisError(f"{run.path}: {exc}") from None
    recorded = run.info.get("tpr")
    if recorded is None:
        return stated if stated is not None else DEFAULT_TPR
    if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or not 0.0 < recorded <= 1.0:
        raise AnalysisError(f"{run.path}/run.json: tpr must be a rate in (0, 1]; got {recorded!r}")
    if stated is not None and stated != float(recorded):
        raise AnalysisError(
            f"{run.path}: run.json records tpr {recorded} but its results hold {fpr_label(stated)}; the run is damaged"
        )
    return float(recorded)


def _report_tpr(runs: Sequence[RunData], options: ReportOptions) -> float:
    """The one rate of the runs' FPR (options.tpr, when given, must be it); runs at different rates refused."""
    rates = {run.path: run_tpr(run) for run in runs}
    distinct = sorted(set(rates.values()))
    if len(distinct) > 1:
        listed = ", ".join(f"{path} {fpr_label(rate)}" for path, rate in rates.items())
        raise AnalysisError(
            f"the runs' FPRs are taken at different ID acceptance rates ({listed}); one report shows one rate: "
            "report them apart, or evaluate them at the same --tpr"
        )
    rate = distinct[0]
    if options.tpr is not None and float(options.tpr) != rate:
        raise AnalysisError(
            f"tpr {options.tpr}: the runs were evaluated at tpr {rate:g} ({fpr_label(rate)}); a report at another "
            "rate would show two thresholds under one name (leave tpr unset to use the runs')"
        )
    if options.against and rate != DEFAULT_TPR:
        raise AnalysisError(
            f"--against {options.against}: the published numbers are FPR@95 and the runs' are {fpr_label(rate)} "
            f"(evaluated at tpr {rate:g}); evaluate at --tpr 0.95 to compare"
        )
    return rate


def _plain_fpr_rows(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """Rows with the FPR under the name the tables read (``fpr80`` -> ``fpr95``, ``openood.fpr80`` too); the
    report states the rate in every label instead (`_relabel`)."""
    plain = []
    for row in rows:
        if tpr_of_metric(row.metric) is not None and not row.metric.endswith("fpr95"):
            prefix = row.metric.rpartition("fpr")[0]  # "" or a convention's "openood."
            row = replace(row, metric=f"{prefix}fpr95")
        plain.append(row)
    return plain


def _check_plot_detectors(runs: Sequence[RunData], options: ReportOptions) -> None:
    """Refuse a --plot-detector the runs do not hold (its ROC curves and histograms would silently vanish)."""
    if not options.plot_detectors:
        return
    known = list(
        dict.fromkeys(
            r.detector
            for run in runs
            if not run.is_zeroshot
            for r in run.rows
            if tables.parse_vocabulary_score(r.detector) is None
        )
    )
    for name in options.plot_detectors:
        if name not in known:
            raise AnalysisError(
                f"--plot-detector: no detector {name!r} in the runs{suggest(name, known)} "
                f"(their detectors: {', '.join(known) or 'none'})"
            )


def _relabel(content: ReportContent, tpr: float) -> None:
    """Every title, text, caption and table label restated at `tpr` (FPR@80, "accepts 80% of ID"); none at 0.95."""
    if tpr == DEFAULT_TPR:
        return
    content.notes = [relabel_fpr(note, tpr) for note in content.notes]
    for section in content.sections:
        section.title, section.text = relabel_fpr(section.title, tpr), relabel_fpr(section.text, tpr)
        for index, item in enumerate(section.items):
            if isinstance(item, Table):
                section.items[index] = relabel_table(item, tpr)
            else:
                item.caption = relabel_fpr(item.caption, tpr)


def _checked_groups(options: ReportOptions) -> OodGroups | None:
    """The OOD groups of the options, after checking the options that can fail before any work."""
    groups = resolve_groups(options.groups, options.convention)  # a bad convention or groups file fails here
    if options.against is not None and options.against not in PUBLISHED_SETS:
        # Checked before any statistics run: a typo should not cost the whole report's time.
        raise AnalysisError(f"unknown published set {options.against!r}; available: {', '.join(PUBLISHED_SETS)}")
    return groups


def _loaded_runs(run_dirs: Sequence[str | os.PathLike[str]] | Sequence[RunData]) -> list[RunData]:
    """The runs (loaded from their directories where given as paths), labelled apart and checked distinct."""
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
    return runs


def _scored_runs(runs: Sequence[RunData], pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RunData]:
    """Which run holds the scores of each supervised (model, ID) pair (never a zero-shot run of the same model id)."""
    scored: dict[tuple[str, str], RunData] = {}
    for run in runs:
        if run.is_zeroshot:
            continue
        for pair in run.pairs():
            if pair in pairs and pair not in scored and run.path.is_dir() and run.has_scores(*pair):
                scored[pair] = run
    return scored


def _context_section(intro: Sequence[str | Table]) -> Section:
    """The "Context" section: the intro's paragraphs, then its tables."""
    text = "\n\n".join(i for i in intro if isinstance(i, str))
    return Section("context", "Context", text, [i for i in intro if isinstance(i, Table)])


def _accuracy_columns(
    runs: Sequence[RunData], accuracy: Sequence[Accuracy]
) -> tuple[dict[str, dict[str, float]], dict[str, str], dict[str, str]]:
    """Table 1's accuracy inputs per model: top-1 per label set, the original labels' set, why top-1 is missing."""
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
    return top1, label_sets, missing


def _overview_section(
    runs: Sequence[RunData], shown: Sequence[ResultRow], accuracy: Sequence[Accuracy], options: ReportOptions
) -> Section:
    """Tables 1, A2 and A1: the best detectors per model and OOD set."""
    convention = convention_text(options.convention, CONVENTION)
    top1, label_sets, missing = _accuracy_columns(runs, accuracy)
    items = [
        tables.table1(shown, top1=top1, label_sets=label_sets, top1_missing=missing),
        tables.table_a2(shown),
        tables.table_a1(shown),
    ]
    if options.convention != "oodbench":
        items = [with_convention_note(t, options.convention) for t in items]
    return Section("overview", "Overview", "Best detectors per model and OOD set.\n\n" + convention, list(items))


def _model_section(shown: Sequence[ResultRow], pair: tuple[str, str], options: ReportOptions) -> Section:
    """One (model, ID set): its detectors × OOD sets table and the best detector per OOD set (Fig. 1)."""
    model, id_dataset = pair
    detectors = tables.table_detectors(
        shown,
        model,
        id_dataset,
        convention=None if options.convention == "oodbench" else options.convention,
        aupr=options.aupr,
    )
    figure = FigureItem(
        f"fig1-{slug(model)}",
        f"Best detector per OOD set for {model} (paper Fig. 1)",
        lambda: figures.fig_best_detectors(shown, model, id_dataset, tpr=options.rate),
    )
    return Section(
        f"model-{slug(model)}-{slug(id_dataset)}", f"Model {model} (ID: {id_dataset})", "", [detectors, figure]
    )


def _zeroshot_section(
    zeroshot: Sequence[ResultRow], vocabularies: Mapping[str, Any], with_supervised: bool, options: ReportOptions
) -> Section:
    """Table 2 and the vocabulary-size figure of the zero-shot models."""
    zero_pairs = list(dict.fromkeys((r.model, r.id_dataset) for r in zeroshot))
    section = Section(
        "zeroshot",
        "Zero-shot vocabularies",
        "Zero-shot models (" + ", ".join(m for m, _ in zero_pairs) + ") appear in Table 2 and the "
        "vocabulary-size figure only, not in the supervised tables, subsampling or intervals."
        + ("" if with_supervised and options.convention == "oodbench" else "\n\n" + CONVENTION),  # Table 2: oodbench's
    )
    section.items.append(tables.table2(zeroshot, vocabularies, pairs=zero_pairs))
    if figures.vocab_sweep_lines(zeroshot, vocabularies):
        section.items.append(
            FigureItem(
                "figA1-vocabulary-sweep",
                "FPR@95 against negative-vocabulary size (paper Figs. A1 and A2)",
                lambda: figures.fig_vocab_sweep(zeroshot, vocabularies),
            )
        )
    return section


def _provenance_section(runs: Sequence[RunData]) -> Section:
    """Each run's provenance tables, then the library versions of this report."""
    section = Section("provenance", "Provenance", "Models, checkpoints, dataset hashes and library versions.")
    for run in runs:
        section.items.extend(provenance_tables(run))
    section.items.append(report_versions())
    return section


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
    full, full_rows = full_spectrum_tables(runs, shown, pairs, groups, options.convention, options.rate, options.csid)
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
        content.exports.update(openood_exports(shown, full_rows, groups, accuracy, options.rate))


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
        settings = [RunProvenance.from_run(runs[i]).settings() for i in indices]
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


@dataclass(frozen=True, eq=False)  # arrays inside: identity is the only sensible equality
class _ScoredOod:
    """One (model, ID set, OOD set) with per-image scores: the supervised detectors' ID and OOD scores."""

    run: RunData
    model: str
    id_dataset: str
    ood: str
    id_scores: dict[str, np.ndarray]
    ood_scores: dict[str, np.ndarray]
    bits: AcceptanceBits  # one set of acceptance bits serves Table A6 and every point of the Fig. A4 curve
    best: str = ""  # the best detector by FPR@95 (known once its Fig. A4 curve is)

    @property
    def pair(self) -> tuple[str, str]:
        return self.model, self.id_dataset

    @property
    def total(self) -> int:
        """OOD images in the set."""
        return len(next(iter(self.ood_scores.values())))

    def ranked(self, metric: str) -> list[str]:
        """The detectors with scores, best first by `metric` in the run's results."""
        order = best_detectors(self.run, self.model, self.id_dataset, self.ood, metric, count=len(self.id_scores))
        return [d for d in order if d in self.id_scores]


def _add_score_sections(
    content: ReportContent,
    supervised: Sequence[ResultRow],
    scored: Mapping[tuple[str, str], RunData],
    pairs: Sequence[tuple[str, str]],
    options: ReportOptions,
    progress: bool,
) -> None:
    """Subsampling (Table A6, Fig. A4), intervals and DeLong, per-class acceptance, ROC curves and histograms."""
    missing = [p for p in pairs if p not in scored]
    if missing:
        content.notes.append(
            "No per-image scores for "
            + ", ".join(f"{m}/{i}" for m, i in missing)
            + ": subsampling, intervals and score figures skipped for them."
        )
    scored_pairs = [p for p in pairs if p in scored]
    if not scored_pairs:
        return
    n = _subset_size(scored, scored_pairs, options)
    with progress_bar(progress) as bar:
        items = _scored_oods(scored, scored_pairs, options)
        # One step per subsampling study and one per interval: the two costly statistics.
        task = bar.add_task("report statistics", total=2 * len(items))
        summaries, curves, notes = _subsample_studies(items, n, options, lambda: bar.advance(task))
        # The best detector by the run's FPR@95 rows; without a ranked detector that has scores, the curve's choice.
        items = [
            replace(item, best=(item.ranked("fpr95") or [curve[0].best])[0])
            for item, curve in zip(items, curves, strict=True)
        ]
        intervals = _intervals(items, options, lambda share: bar.advance(task, share))
    content.notes.extend(notes)
    content.subsample.extend(summaries)
    content.intervals.extend(intervals)
    content.comparisons.extend(c for c in (_delong(item, options) for item in items) if c is not None)
    sections = [
        _subsampling_section(items, summaries, curves, n, options),
        _uncertainty_section(content.intervals, content.comparisons, options),
        _class_section(items, options),
        _score_figure_section(items, supervised, options),
    ]
    for section in sections:
        if section.key in ("subsampling", "uncertainty") or section.items:
            if options.convention != "oodbench":  # their thresholds accept 95% of ID: oodbench's FPR@95, said so
                section.text = (section.text + "\n\n" + CONVENTION).strip()
            content.sections.append(section)


def _subset_size(
    scored: Mapping[tuple[str, str], RunData], pairs: Sequence[tuple[str, str]], options: ReportOptions
) -> int:
    """Table A6's n (options.n resolved against the OOD set sizes); one that exceeds every OOD set fails."""
    n_ood = {(r.model, r.id_dataset, r.ood_dataset): r.n_ood for run in scored.values() for r in run.rows}
    sizes = {f"{pair[0]}/{ood}": n_ood[(*pair, ood)] for pair in pairs for ood in scored[pair].ood_datasets(*pair)}
    n = resolve_n(options.n, sizes)
    if n > max(sizes.values()):
        raise AnalysisError(
            f"n={n} exceeds every OOD set ({', '.join(f'{k}: {v}' for k, v in sizes.items())}); "
            f"pass a smaller n, e.g. {max(1, min(sizes.values()) // 2)}"
        )
    return n


def _scored_oods(
    scored: Mapping[tuple[str, str], RunData], pairs: Sequence[tuple[str, str]], options: ReportOptions
) -> list[_ScoredOod]:
    """Every OOD set of the scored pairs with its supervised detectors' scores (vocabulary scores left out)."""
    thresholds: dict[tuple[str, str], dict[str, float]] = {}  # ID thresholds per (model, ID set): computed once
    items = []
    for pair in pairs:
        run = scored[pair]
        for ood in run.ood_datasets(*pair):
            id_scores, ood_scores = run.paired_scores(pair[0], pair[1], ood)
            id_scores = {d: s for d, s in id_scores.items() if tables.parse_vocabulary_score(d) is None}
            ood_scores = {d: ood_scores[d] for d in id_scores}
            bits = acceptance_bits(id_scores, ood_scores, options.rate, thresholds.setdefault(pair, {}))
            items.append(_ScoredOod(run, pair[0], pair[1], ood, id_scores, ood_scores, bits))
    return items


def _subsample_studies(
    items: Sequence[_ScoredOod], n: int, options: ReportOptions, advance: Callable[[], None]
) -> tuple[list[SubsampleSummary], list[list[SubsampleStudy]], list[str]]:
    """Table A6's rows (sets with at least n images), each set's Fig. A4 curve, and notes on the sets left out."""
    summaries: list[SubsampleSummary] = []
    curves: list[list[SubsampleStudy]] = []
    notes: list[str] = []
    for item in items:
        if n <= item.total:
            study = subsample_fpr(
                item.id_scores,
                item.ood_scores,
                n,
                draws=options.draws,
                seed=options.seed,
                tpr=options.rate,
                model=item.model,
                id_dataset=item.id_dataset,
                ood_dataset=item.ood,
                bits=item.bits,
            )
            summaries.append(study.summary())
        else:
            notes.append(f"{item.model}/{item.ood}: not subsampled, n={n} exceeds its {item.total} OOD images.")
        sizes = curve_sizes(item.total, options.curve_points, [n])
        curves.append(
            subsample_curve(
                item.id_scores,
                item.ood_scores,
                sizes,
                draws=options.curve_draws,
                seed=options.seed,
                tpr=options.rate,
                model=item.model,
                id_dataset=item.id_dataset,
                ood_dataset=item.ood,
                bits=item.bits,
            )
        )
        advance()
    return summaries, curves, notes


def _subsampling_section(
    items: Sequence[_ScoredOod],
    summaries: Sequence[SubsampleSummary],
    curves: Sequence[list[SubsampleStudy]],
    n: int,
    options: ReportOptions,
) -> Section:
    """Table A6 (the best detector's FPR@95 over draws of n OOD images) and a Fig. A4 curve per model."""
    section = Section(
        "subsampling",
        "Subsampling (paper Table A6, Fig. A4)",
        f"The best detector's FPR@95 over {options.draws} draws of n={n} OOD images without replacement.",
    )
    if summaries:
        section.items.append(tables.table_a6(list(summaries), spread_vs_noise(list(summaries))))
    per_pair: dict[tuple[str, str], dict[str, list[SubsampleStudy]]] = {}
    for item, curve in zip(items, curves, strict=True):
        per_pair.setdefault(item.pair, {})[item.ood] = curve
    for (model, _), per_ood in per_pair.items():
        section.items.append(
            FigureItem(
                f"figA4-{slug(model)}",
                f"FPR@95 over subset size n, {model} "
                f"({options.curve_draws} draws per n; band: mean ± 2σ; dashed: full ± 2·SE) (paper Fig. A4)",
                lambda c=per_ood, m=model: figures.fig_subsample_curves(c, m, tpr=options.rate),
            )
        )
    return section


def _intervals(
    items: Sequence[_ScoredOod], options: ReportOptions, advance: Callable[[float], None]
) -> list[IntervalRecord]:
    """Bootstrap intervals of each set's best detector, in one bootstrap (the sets share their ID draws)."""
    requests = [
        IntervalRequest(
            item.model, item.id_dataset, item.ood, item.best, item.id_scores[item.best], item.ood_scores[item.best]
        )
        for item in items
    ]
    return interval_records(
        requests,
        resamples=options.resamples,
        confidence=options.confidence,
        seed=options.seed,
        tpr=options.rate,
        advance=advance,
    )


def _delong(item: _ScoredOod, options: ReportOptions) -> tuple[str, str, DeLongResult] | None:
    """DeLong's test of the set's two best detectors by AUROC (None with fewer than two)."""
    top = item.ranked("auroc")[:2]
    if len(top) < 2:
        return None
    a, b = top
    result = delong_test(
        item.id_scores[a],
        item.ood_scores[a],
        item.id_scores[b],
        item.ood_scores[b],
        confidence=options.confidence,
        names=(a, b),
    )
    return item.model, item.ood, result


def _uncertainty_section(
    intervals: Sequence[IntervalRecord], comparisons: Sequence[tuple[str, str, DeLongResult]], options: ReportOptions
) -> Section:
    """The interval table of each OOD set's best detector and the DeLong table."""
    section = Section(
        "uncertainty",
        "Uncertainty",
        "Intervals of each OOD set's best detector, and DeLong's test of the two best by AUROC.",
    )
    if intervals:
        title = "Confidence intervals of the best detector per OOD set"
        section.items.append(tables.table_intervals(list(intervals), options.confidence, title=title))
    if comparisons:
        section.items.append(tables.table_delong(list(comparisons), options.confidence))
    return section


def _class_section(items: Sequence[_ScoredOod], options: ReportOptions) -> Section:
    """Per OOD class (for sets stored with class labels): the share the best detector accepts as ID."""
    section = Section(
        "ood-classes",
        "Which OOD classes pass as ID",
        "For OOD sets whose store entry carries class labels: each class's images accepted as ID by the best detector "
        "(by FPR@95) at the threshold that accepts 95% of the ID test set, most accepted first, with Wilson 95% "
        "intervals.",
    )
    for item in items:
        labelled = _ood_labels(item.run, item.model, item.ood, item.total)
        if labelled is None:
            continue
        acceptance = class_acceptance(
            item.id_scores[item.best], item.ood_scores[item.best], labelled[0], labelled[1], tpr=options.rate
        )
        section.items.append(
            tables.table_class_acceptance(
                acceptance,
                key=f"classes-{slug(item.model)}-{slug(item.ood)}",
                title=f"{item.model} on {item.ood}: acceptance per OOD class ({item.best})",
            )
        )
    return section


def _score_figure_section(
    items: Sequence[_ScoredOod], supervised: Sequence[ResultRow], options: ReportOptions
) -> Section:
    """ROC curves and score histograms per OOD set, of the chosen detectors (default: the 3 best by mean FPR@95)."""
    section = Section("scores", "ROC curves and score distributions")
    if not options.score_figures:
        return section
    for item in items:
        chosen = list(options.plot_detectors or _mean_fpr_order(supervised, item.pair, set(item.id_scores))[:3])
        ids = {d: item.id_scores[d] for d in chosen if d in item.id_scores}
        oods = {d: item.ood_scores[d] for d in ids}
        if not ids:
            continue
        label = f"{item.model}: {item.id_dataset} vs {item.ood}"
        stem = f"{slug(item.model)}-{slug(item.ood)}"
        section.items.append(
            FigureItem(
                f"roc-{stem}",
                f"ROC curves, {label}",
                lambda i=ids, o=oods, t=label: figures.fig_roc(i, o, t, options.rate),
            )
        )
        section.items.append(
            FigureItem(
                f"hist-{stem}",
                f"Score histograms, {label}",
                lambda i=ids, o=oods, t=label, lab=(item.id_dataset, item.ood): figures.fig_score_histograms(
                    i, o, t, options.rate, labels=lab
                ),
            )
        )
    return section


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
