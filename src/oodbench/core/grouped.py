"""OpenOOD v1.5's layouts of results: OOD sets in groups (near / far) with group means, the full-spectrum setting
beside the standard one, and the per-detector CSV files OpenOOD's evaluation scripts write.

A core module: `oodbench evaluate` writes these tables into ``table.md`` and the report renders them. The rows are
one convention's (`results.convention_rows`) and one (model, ID set)'s; the groups are data (`oodgroups`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from .errors import AnalysisError
from .metrics import DEFAULT_TPR, convention_note, relabel_fpr
from .oodgroups import OodGroups
from .tabular import MISSING, Cell, MetricRow, Table, detector_table, percent, render_markdown

__all__ = [
    "group_columns",
    "group_table",
    "full_spectrum_table",
    "openood_csv",
    "openood_label",
    "OPENOOD_CSV_COLUMNS",
    "run_tables_markdown",
    "relabel_table",
]

OPENOOD_CSV_COLUMNS = ("FPR@95", "AUROC", "AUPR_IN", "AUPR_OUT", "ACC")
_CSV_METRICS = ("fpr95", "auroc", "aupr_in", "aupr_out")

Column = tuple[str, str, tuple[str, ...]]  # (header group, column label, OOD sets averaged: one set or a group)


def group_columns(groups: OodGroups | None, ood_datasets: Sequence[str]) -> tuple[list[Column], list[str]]:
    """Columns in group order: each present group's sets then its mean, then the ungrouped sets; and notes on
    groups that are only partly present (their mean is not OpenOOD's)."""
    if groups is None:
        return [("", o, (o,)) for o in ood_datasets], []
    arrangement = groups.arrange(list(ood_datasets))
    columns: list[Column] = []
    notes: list[str] = []
    for name, present, missing in arrangement.present():
        columns.extend((name, o, (o,)) for o in present)
        columns.append((name, f"{name} mean", present))
        if missing:
            notes.append(
                f"The {name} mean covers {len(present)} of the {len(present) + len(missing)} sets of "
                f"{groups.title} ({', '.join(missing)} not in the run)."
            )
    columns.extend(("other" if columns else "", o, (o,)) for o in arrangement.ungrouped)
    return columns, notes


def relabel_table(table: Table, tpr: float) -> Table:
    """`table` with every FPR@95 label, note and header restated at `tpr` (the same table at 0.95)."""
    if tpr == DEFAULT_TPR:
        return table
    return replace(
        table,
        title=relabel_fpr(table.title, tpr),
        columns=tuple(relabel_fpr(c, tpr) for c in table.columns),
        groups=tuple((relabel_fpr(label, tpr), span) for label, span in table.groups),
        notes=tuple(relabel_fpr(n, tpr) for n in table.notes),
    )


def _values(rows: Sequence[MetricRow]) -> dict[tuple[str, str, str], float]:
    pairs = {(r.model, r.id_dataset) for r in rows}
    if len(pairs) > 1:
        raise AnalysisError(f"a grouped table shows one (model, ID set); got {sorted(pairs)}")
    return {(r.detector, r.ood_dataset, r.metric): r.value for r in rows}


def _mean(
    values: Mapping[tuple[str, str, str], float], detector: str, sets: Sequence[str], metric: str
) -> float | None:
    found = [values.get((detector, o, metric)) for o in sets]
    if not found or any(v is None for v in found):
        return None
    return sum(found) / len(found)  # type: ignore[arg-type]


def _header_groups(columns: Sequence[Column], lead: int) -> tuple[tuple[str, int], ...]:
    spans: list[tuple[str, int]] = [("", lead)]
    for label, *_ in columns:
        if spans[-1][0] == label:
            spans[-1] = (label, spans[-1][1] + 1)
        else:
            spans.append((label, 1))
    return tuple(spans)


def group_table(
    rows: Sequence[MetricRow],
    groups: OodGroups | None,
    *,
    detectors: Sequence[str] | None = None,
    ood_datasets: Sequence[str] | None = None,
    convention: str,
    aupr: bool = False,
    key: str = "groups",
    title: str = "Detectors × OOD groups",
    tpr: float = DEFAULT_TPR,
) -> Table:
    """Detectors × OOD sets in groups with each group's mean: cells FPR@95 / AUROC (and AUPR-In / AUPR-Out) in %;
    the lowest FPR@95 per column in bold (labels state `tpr`, the rate the rows' FPR was taken at)."""
    values = _values(rows)
    detectors = list(detectors) if detectors is not None else list(dict.fromkeys(r.detector for r in rows))
    oods = list(ood_datasets) if ood_datasets is not None else list(dict.fromkeys(r.ood_dataset for r in rows))
    columns, notes = group_columns(groups, oods)
    shown = ("fpr95", "auroc", "aupr_in", "aupr_out") if aupr else ("fpr95", "auroc")
    cells = {
        (d, label): tuple(_mean(values, d, sets, m) for m in shown) for d in detectors for _, label, sets in columns
    }
    best = {}
    for _, label, _sets in columns:
        fprs = [cells[(d, label)][0] for d in detectors if cells[(d, label)][0] is not None]
        best[label] = min(fprs) if fprs else None
    body = []
    for detector in detectors:
        line = [Cell(detector)]
        for _, label, _sets in columns:
            cell = cells[(detector, label)]
            if any(v is None for v in cell):
                line.append(Cell(MISSING))
            else:
                line.append(Cell(" / ".join(percent(v) for v in cell), bold=cell[0] == best[label]))
        body.append(tuple(line))
    what = "FPR@95 / AUROC / AUPR-In / AUPR-Out" if aupr else "FPR@95 / AUROC"
    lead = f"Cells: {what} (%); a group's mean is the mean over its sets, as OpenOOD v1.5 reports it"
    if groups is not None:
        lead += f"; groups: {groups.title} ({groups.source})"
    table = Table(
        key,
        title,
        ("detector",) + tuple(label for _, label, _ in columns),
        tuple(body),
        groups=_header_groups(columns, 1),
        notes=(lead + ".", *notes, convention_note(convention)),
    )
    return relabel_table(table, tpr)


def full_spectrum_table(
    standard: Sequence[MetricRow],
    full: Sequence[MetricRow],
    groups: OodGroups | None,
    csid_datasets: Sequence[str],
    *,
    detectors: Sequence[str] | None = None,
    ood_datasets: Sequence[str] | None = None,
    convention: str,
    key: str = "full-spectrum",
    title: str = "Full-spectrum and standard setting",
    tpr: float = DEFAULT_TPR,
) -> Table:
    """Per OOD set and group mean, the standard setting's FPR@95 / AUROC beside the full-spectrum one's (the
    covariate-shifted sets counted as ID, as OpenOOD v1.5's FSOOD results); labels state `tpr`."""
    std_values, fs_values = _values(standard), _values(full)
    detectors = list(detectors) if detectors is not None else list(dict.fromkeys(r.detector for r in standard))
    oods = list(ood_datasets) if ood_datasets is not None else list(dict.fromkeys(r.ood_dataset for r in standard))
    columns, notes = group_columns(groups, oods)
    doubled: list[Column] = []
    for _group, label, sets in columns:
        doubled.append((label, "standard", sets))
        doubled.append((label, "full-spectrum", sets))
    body = []
    for detector in detectors:
        line = [Cell(detector)]
        for _label, setting, sets in doubled:
            source = std_values if setting == "standard" else fs_values
            fpr, auc = _mean(source, detector, sets, "fpr95"), _mean(source, detector, sets, "auroc")
            line.append(Cell(MISSING) if fpr is None or auc is None else Cell(f"{percent(fpr)} / {percent(auc)}"))
        body.append(tuple(line))
    shift = ", ".join(csid_datasets)
    table = Table(
        key,
        title,
        ("detector",) + tuple(setting for _, setting, _ in doubled),
        tuple(body),
        groups=_header_groups(doubled, 1),
        notes=(
            f"Cells: FPR@95 / AUROC (%). Standard: the ID test set alone is ID. Full-spectrum: the covariate-shifted "
            f"sets ({shift}) count as ID too, their images joined to the ID test set's, as OpenOOD v1.5's "
            "full-spectrum (FSOOD) results.",
            *notes,
            convention_note(convention),
        ),
    )
    return relabel_table(table, tpr)


def openood_csv(
    rows: Sequence[MetricRow],
    groups: OodGroups | None,
    detector: str,
    accuracy: float | None = None,
    *,
    tpr: float = DEFAULT_TPR,
) -> str:
    """One detector's results in the layout of OpenOOD v1.5's ``eval_ood`` CSV: a row per OOD set of a group,
    then the group's mean named ``<group>ood`` (``nearood``, ``farood``), ungrouped sets last; columns FPR@95,
    AUROC, AUPR_IN, AUPR_OUT, ACC in %, two decimals. ACC is the ID top-1 accuracy, empty when unknown. At a `tpr`
    other than 0.95 the first column says its rate (``FPR@80``): OpenOOD's own files are always FPR@95.

    Rows carry OpenOOD's labels (`openood_label`): ``ssb_hard``, ``openimage_o``, whatever name the store uses."""
    values = _values(rows)
    oods = list(dict.fromkeys(r.ood_dataset for r in rows if r.detector == detector))
    if not oods:
        raise AnalysisError(f"no rows of detector {detector!r} to export")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(("", relabel_fpr(OPENOOD_CSV_COLUMNS[0], tpr), *OPENOOD_CSV_COLUMNS[1:]))
    acc = "" if accuracy is None else f"{100 * accuracy:.2f}"

    def line(name: str, sets: Sequence[str]) -> None:
        found = [_mean(values, detector, sets, m) for m in _CSV_METRICS]
        writer.writerow((name, *("" if v is None else f"{100 * v:.2f}" for v in found), acc))

    columns, _ = group_columns(groups, oods)
    for group, label, sets in columns:
        line(f"{group}ood" if label == f"{group} mean" else openood_label(label, groups), sets)
    return buffer.getvalue()


def openood_label(dataset: str, groups: OodGroups | None = None) -> str:
    """The row label OpenOOD's evaluator gives an OOD set: its group member id (through the groups' aliases) with
    underscores for hyphens, as the keys of OpenOOD's ``evaluation_api/datasets.py`` (``ssb_hard``, ``openimage_o``)."""
    member = groups.member(dataset) if groups is not None else None
    return (member or dataset).replace("-", "_")


def run_tables_markdown(
    rows: Sequence[MetricRow],
    detectors: Sequence[str],
    ood_datasets: Sequence[str],
    *,
    convention: str,
    aupr: bool = False,
    groups: OodGroups | None = None,
    csid_datasets: Sequence[str] = (),
    scores: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    tpr: float = 0.95,
) -> str:
    """``table.md`` of an evaluation: the detector table in `convention`, then (with `groups`) the grouped table
    and (with covariate-shifted sets and their `scores`) the full-spectrum table; every label states `tpr`.

    `rows` name the FPR ``fpr95`` whatever `tpr` (as `metrics.evaluate` returns it)."""
    from .results import convention_rows, full_spectrum_rows

    view = convention_rows(rows, convention)  # type: ignore[arg-type]
    table = detector_table(view, detectors, ood_datasets, convention=convention, aupr=aupr)
    parts = [render_markdown(relabel_table(table, tpr), title=False)]
    if groups is not None and groups.arrange(list(ood_datasets)).present():
        table = group_table(
            view, groups, detectors=detectors, ood_datasets=ood_datasets, convention=convention, aupr=aupr, tpr=tpr
        )
        parts.append(render_markdown(table))
    if csid_datasets and scores is not None and view:
        first = view[0]
        full = full_spectrum_rows(
            first.model, first.id_dataset, csid_datasets, ood_datasets, detectors, scores, tpr, convention
        )
        table = full_spectrum_table(
            view,
            full,
            groups,
            csid_datasets,
            detectors=detectors,
            ood_datasets=ood_datasets,
            convention=convention,
            tpr=tpr,
        )
        parts.append(render_markdown(table))
    return "\n".join(parts)
