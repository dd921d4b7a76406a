"""The report in OpenOOD's conventions and layouts: the rows of a metric convention (read from the runs, or computed
from their per-image scores), the near / far group tables, the full-spectrum tables and OpenOOD's CSV files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..analysis.published import Accuracy
from ..analysis.rundata import RunData
from ..core.errors import AnalysisError
from ..core.grouped import full_spectrum_table, group_table, openood_csv
from ..core.metrics import CONVENTION_NOTES, CONVENTIONS, DEFAULT_TPR, check_convention, evaluate
from ..core.oodgroups import DEFAULT_GROUPS, OodGroups, load_groups
from ..core.results import ResultRow, convention_rows, full_spectrum_rows, rows_from_metrics
from ..core.tabular import Table

__all__ = [
    "OPENOOD_CONVENTION",
    "convention_text",
    "resolve_groups",
    "rows_in_convention",
    "with_convention_note",
    "group_tables",
    "full_spectrum_tables",
    "openood_exports",
    "csid_of",
]

OPENOOD_CONVENTION = (
    "Convention: openood, as OpenOOD v1.5 and pytorch-ood report results. A higher score means more "
    "in-distribution, and OOD is the positive class: FPR@95 is the share of ID test images flagged as OOD at the "
    "threshold that flags 95% of the OOD images (ties at the threshold count as flagged); AUROC is the probability "
    "that an ID image outscores an OOD image (ties count one half; the same number in both conventions); AUPR-In "
    "and AUPR-Out are trapezoidal areas under the precision-recall curve with ID and OOD as the positive class. "
    "Values in %."
)


def convention_text(convention: str, oodbench_text: str) -> str:
    """The paragraph that states a report's convention (`oodbench_text` is the report's own for oodbench)."""
    return OPENOOD_CONVENTION if check_convention(convention) == "openood" else oodbench_text


def resolve_groups(spec: str | None, convention: str) -> OodGroups | None:
    """The groups of a report: `spec` (a file or shipped name), else OpenOOD's with the openood convention."""
    if spec is None and check_convention(convention) == "openood":
        spec = DEFAULT_GROUPS
    return load_groups(spec) if spec is not None else None


def _run_of(runs: Sequence[RunData], pair: tuple[str, str]) -> RunData | None:
    return next((r for r in runs if not r.is_zeroshot and pair in r.pairs()), None)


def rows_in_convention(
    runs: Sequence[RunData], supervised: Sequence[ResultRow], convention: str, tpr: float
) -> list[ResultRow]:
    """The supervised rows in `convention` under plain metric names: the runs' own rows where they hold that
    convention's, else computed from the run's per-image scores (an AnalysisError when a run has neither)."""
    check_convention(convention)
    if convention == CONVENTIONS[0]:
        return convention_rows(supervised, convention)
    have = convention_rows(supervised, convention)
    done = {(r.model, r.id_dataset) for r in have}
    result = list(have)
    for pair in dict.fromkeys((r.model, r.id_dataset) for r in supervised):
        if pair in done:
            continue
        run = _run_of(runs, pair)
        if run is None or not run.path.is_dir() or not run.has_scores(*pair):
            raise AnalysisError(
                f"{pair[0]}/{pair[1]}: no {convention} rows and no per-image scores to compute them from "
                f"(evaluate it with --convention {convention}, or pass its run directory)"
            )
        detectors = run.detectors(*pair)
        for ood in run.ood_datasets(*pair):
            id_scores, ood_scores = run.paired_scores(pair[0], pair[1], ood)
            for detector in detectors:
                if detector not in id_scores:
                    continue
                values = evaluate(id_scores[detector], ood_scores[detector], tpr, convention)
                result.extend(
                    rows_from_metrics(
                        pair[0], pair[1], ood, detector, values, len(id_scores[detector]), len(ood_scores[detector])
                    )
                )
    return result


def with_convention_note(table: Table, convention: str) -> Table:
    """The table with its convention's note added (the openood convention's tables say so)."""
    return replace(table, notes=(*table.notes, CONVENTION_NOTES[check_convention(convention)]))


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


def group_tables(
    rows: Sequence[ResultRow], groups: OodGroups, pairs: Sequence[tuple[str, str]], convention: str, aupr: bool
) -> list[Table]:
    """One grouped table per (model, ID set) that has an OOD set in a group."""
    tables = []
    for model, id_dataset in pairs:
        selected = [r for r in rows if (r.model, r.id_dataset) == (model, id_dataset)]
        oods = list(dict.fromkeys(r.ood_dataset for r in selected))
        if not selected or not groups.arrange(oods).present():
            continue
        tables.append(
            group_table(
                selected,
                groups,
                convention=convention,
                aupr=aupr,
                key=f"groups-{_slug(model)}-{_slug(id_dataset)}",
                title=f"{model} (ID: {id_dataset}): OOD groups of {groups.title}",
            )
        )
    return tables


def csid_of(run: RunData, given: Sequence[str]) -> list[str]:
    """The covariate-shifted ID sets of a run: those named (`given`), else its run.json's ``csid_datasets``."""
    names = list(given) or list(run.info.get("csid_datasets") or [])
    if not all(isinstance(n, str) for n in names):
        raise AnalysisError(f"{run.path}/run.json: csid_datasets must be a list of dataset ids")
    return names


def full_spectrum_tables(
    runs: Sequence[RunData],
    rows: Sequence[ResultRow],
    pairs: Sequence[tuple[str, str]],
    groups: OodGroups | None,
    convention: str,
    tpr: float,
    given: Sequence[str] = (),
) -> tuple[list[Table], dict[tuple[str, str], list[ResultRow]]]:
    """Per (model, ID set) with covariate-shifted sets and saved scores: the full-spectrum table, and its rows."""
    tables: list[Table] = []
    full_rows: dict[tuple[str, str], list[ResultRow]] = {}
    for pair in pairs:
        run = _run_of(runs, pair)
        if run is None or not run.path.is_dir():
            continue
        csid = csid_of(run, given)
        if not csid:
            continue
        absent = [d for d in [pair[1], *csid] if not run.has_scores(pair[0], d)]
        if absent:
            raise AnalysisError(
                f"{run.path}: no saved scores of {', '.join(absent)} for {pair[0]}: evaluate with --csid to score "
                "the covariate-shifted ID sets"
            )
        oods = run.ood_datasets(*pair)
        scores = {d: run.scores(pair[0], d) for d in [pair[1], *csid, *oods]}
        detectors = [d for d in run.detectors(*pair) if all(d in per for per in scores.values())]
        full = full_spectrum_rows(pair[0], pair[1], csid, oods, detectors, scores, tpr, convention)
        standard = [r for r in rows if (r.model, r.id_dataset) == pair and r.detector in detectors]
        full_rows[pair] = full
        tables.append(
            full_spectrum_table(
                standard,
                full,
                groups,
                csid,
                detectors=detectors,
                ood_datasets=oods,
                convention=convention,
                tpr=tpr,
                key=f"full-spectrum-{_slug(pair[0])}-{_slug(pair[1])}",
                title=f"{pair[0]} (ID: {pair[1]}): full-spectrum beside standard",
            )
        )
    return tables, full_rows


def openood_exports(
    rows: Sequence[ResultRow],
    full_rows: Mapping[tuple[str, str], Sequence[ResultRow]],
    groups: OodGroups | None,
    accuracy: Sequence[Accuracy],
    tpr: float = DEFAULT_TPR,
) -> dict[str, str]:
    """OpenOOD's results layout: ``openood/<model>/ood/<detector>.csv`` (and ``fsood/`` for full-spectrum rows),
    one CSV per detector as OpenOOD's eval scripts save them; ACC is the ID top-1 on original labels; the FPR
    column states `tpr`."""
    exports: dict[str, str] = {}
    top1 = {(a.model, a.dataset): a.top1 for a in accuracy if a.labels == "original"}
    for (model, id_dataset), setting, selected in [
        *(
            (pair, "ood", [r for r in rows if (r.model, r.id_dataset) == pair])
            for pair in dict.fromkeys((r.model, r.id_dataset) for r in rows)
        ),
        *((pair, "fsood", list(full)) for pair, full in full_rows.items()),
    ]:
        # The full-spectrum ACC of OpenOOD is over the ID and covariate-shifted sets together: not known here.
        acc = top1.get((model, id_dataset)) if setting == "ood" else None
        for detector in dict.fromkeys(r.detector for r in selected):
            key = f"openood/{_slug(model)}/{setting}/{_slug(detector)}.csv"
            exports[key] = openood_csv([r for r in selected if r.detector == detector], groups, detector, acc, tpr=tpr)
    return exports
