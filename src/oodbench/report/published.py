"""The Fi-ImageNet-1k paper's tables in their printed layouts, each published cell beside its reproduction.

Every cell shows the reproduced value (or "–" where the run lacks it), then in parentheses the run's detector, the
published value with the paper's detector, and Δ = reproduced − published. A reproduced cell carries no mark; a cell
only within sampling error is marked ≈, one that differs ‡ (see `oodbench.analysis.published` for the verdicts).
The summary table counts the verdicts per published table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..analysis.published import (
    ALL_MODELS,
    APPENDIX_E_EXCLUDED,
    DIFFERS,
    FI,
    MEAN_OOD,
    MEAN_SUPERVISED,
    MEAN_VLM,
    NOT_IN_RUN,
    NUMERICAL_TOLERANCE,
    REPRODUCED,
    VERDICTS,
    WITHIN,
    Accuracy,
    Comparison,
    PublishedCell,
    detector_labels,
    published_models,
)
from ..core.tabular import MISSING, Cell, Table

__all__ = ["MARKS", "published_tables", "summary_table", "verdict_line", "comparison_records", "TITLES"]

MARKS = {REPRODUCED: "", WITHIN: "≈", DIFFERS: "‡", NOT_IN_RUN: ""}
TITLES = {
    "1": "Best detector per model on Fi-ImageNet-1k, with Top-1 (paper Table 1)",
    "2": "Zero-shot VLMs with negative vocabularies, FPR@95 (paper Table 2)",
    "3": "EVA02-L-448 on Fi-ImageNet-1k and popular OOD sets (paper Table 3)",
    "A1": "All post-hoc detectors on Fi-ImageNet-1k, FPR@95 / AUROC (paper Table A1)",
    "A2": "Every supervised model on every OOD set, best FPR@95 / AUROC (paper Table A2)",
    "A3": "Full OOD sets and NINCO's cleaned sub-samples, EVA02-L-448 (paper Table A3)",
    "A4": "EOE's three prompts across OOD sets, FPR@95 mean over the VLMs (paper Table A4)",
    "A5": "Negative vocabularies across OOD sets, FPR@95 mean over the VLMs (paper Table A5)",
    "A6": "Sub-sampling the OOD sets to 655 images, EVA02-L-448 (paper Table A6)",
    "A7": "All 30 supervised classifiers on Fi-ImageNet-1k (paper Table A7)",
}
LEGEND = (
    "Each cell: the reproduced value (– where the run lacks it); in parentheses the run's detector, the published "
    "value and detector, and Δ = reproduced − published. No mark: reproduced (|Δ| at most half a unit of the "
    f"published value's last printed digit, plus {NUMERICAL_TOLERANCE:g}; a mean, Δ, closed-form SE or ρ also allows "
    "what rounding its inputs to their printed digits can change). ≈: within sampling error (the published value lies "
    "in the reproduced value's 95% interval: Wilson on the OOD acceptance count for FPR@95 and on the correct count "
    "for Top-1, DeLong for AUROC when the run has per-image scores; a best-of-pool cell takes the Bonferroni bound over "
    "the pool's detectors, a mean or Δ over its parts). ‡: differs. Values in %."
)


def _label(detector: str) -> str:
    return detector_labels().get(detector, detector)


def _number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}".replace("-", "−")


def _signed(value: float, digits: int) -> str:
    """+1.2 / −1.2; a difference that rounds to zero is shown as 0.0, without a sign."""
    if round(value, digits) == 0:
        return f"{0:.{digits}f}"
    return f"{value:+.{digits}f}".replace("-", "−")


def _digits(cell: PublishedCell) -> int:
    return cell.digits


def _aside(comp: Comparison, digits: int) -> list[str]:
    return [f"{label}: {_number(value, digits)}" for label, value in comp.aside]


def _cell(comp: Comparison | None, *, detectors: bool = True) -> Cell:
    """One comparison as a Cell; None (no published cell here) as an empty one."""
    if comp is None:
        return Cell("")
    pub = comp.cell
    digits = _digits(pub)
    published = _number(pub.value, digits) if pub.metric != "n" else f"{int(pub.value):,}"
    pub_det = f" {_label(pub.detector)}" if detectors and pub.detector and pub.best else ""
    if comp.reproduced is None:
        return Cell(MISSING, "; ".join([f"paper {published}{pub_det}", *_aside(comp, digits)]))
    text = _number(comp.reproduced, digits) if pub.metric != "n" else f"{int(comp.reproduced):,}"
    parts = []
    if detectors and comp.detector and pub.best:
        parts.append(_label(comp.detector))
    parts.append(f"paper {published}{pub_det}")
    parts.append(f"Δ {_signed(comp.delta, digits)}")  # type: ignore[arg-type]
    if comp.span is not None and abs(comp.delta) > pub.half_unit:  # type: ignore[arg-type]
        low, high = comp.span
        parts.append(f"its inputs' printed rounding allows {_number(low, digits + 1)} to {_number(high, digits + 1)}")
    parts += _aside(comp, digits)
    return Cell(text, "; ".join(parts), mark=MARKS[comp.verdict])


def _pair(fpr: Comparison | None, auroc: Comparison | None) -> Cell:
    """FPR@95 / AUROC in one cell (Tables A1, A2): reproduced values, then the published pair and the Δ pair."""
    if fpr is None and auroc is None:
        return Cell("")
    comps = [c for c in (fpr, auroc)]
    text = " / ".join(MISSING if c is None or c.reproduced is None else _number(c.reproduced, 1) for c in comps)
    note = "paper " + " / ".join(MISSING if c is None else _number(c.cell.value, 1) for c in comps)
    if any(c is not None and c.reproduced is not None for c in comps):
        note += "; Δ " + " / ".join(MISSING if c is None or c.delta is None else _signed(c.delta, 1) for c in comps)
    return Cell(text, note, mark=_worst(c for c in comps if c is not None))


def _worst(comps: Iterable[Comparison]) -> str:
    """The mark of the worst verdict among the cells shown together."""
    verdicts = {c.verdict for c in comps}
    for verdict in (DIFFERS, WITHIN):
        if verdict in verdicts:
            return MARKS[verdict]
    return ""


class _Index:
    def __init__(self, comparisons: Sequence[Comparison]) -> None:
        self.by_key = {
            (c.cell.table, c.cell.model, c.cell.dataset, c.cell.subset, c.cell.detector, c.cell.metric): c
            for c in comparisons
        }
        # Without a detector: the first comparison of the cell, as a scan of by_key in order would find it.
        self.first: dict[tuple[str, str, str, str, str], Comparison] = {}
        for (table, model, dataset, subset, _, metric), c in self.by_key.items():
            self.first.setdefault((table, model, dataset, subset, metric), c)
        self.tables = {c.cell.table for c in comparisons}

    def get(
        self, table: str, model: str, dataset: str, metric: str, detector: str | None = None, subset: str = ""
    ) -> Comparison | None:
        if detector is not None:
            return self.by_key.get((table, model, dataset, subset, detector, metric))
        return self.first.get((table, model, dataset, subset, metric))

    def rows(self, table: str, attribute: str) -> list[str]:
        return list(dict.fromkeys(getattr(c.cell, attribute) for c in self.by_key.values() if c.cell.table == table))


def _top1_original(accuracy: Sequence[Accuracy], run_model: str) -> Cell:
    rows = [a for a in accuracy if a.model == run_model and a.labels == "original"]
    return Cell(_number(100 * rows[0].top1, 1), f"n={rows[0].n:,}") if rows else Cell(MISSING)


def _model_rows(index: _Index, table: str, accuracy: Sequence[Accuracy], with_pretraining: bool) -> Table:
    models = published_models()
    names = [m for m in index.rows(table, "model") if m != ALL_MODELS]
    body, rules = [], []
    previous_kind = None
    for name in names:
        info = models[name]
        kind = "zeroshot" if info.kind == "zeroshot" else "supervised"
        if previous_kind is not None and kind != previous_kind:
            rules.append(len(body) - 1)
        previous_kind = kind
        top1 = index.get(table, name, FI, "top1")
        fpr = index.get(table, name, FI, "fpr95")
        run_model = next((c.run_model for c in (top1, fpr) if c is not None and c.run_model), "")
        printed = (top1 or fpr).cell.printed if (top1 or fpr) else name  # type: ignore[union-attr]
        label = printed + ("†" if info.kind == "probe" else "")
        line = [Cell(label, name if printed != name else "")]
        if with_pretraining:
            line.append(Cell(info.pretraining))
        line.append(Cell(info.params))
        line.append(_top1_original(accuracy, run_model) if run_model else Cell(MISSING))
        line += [_cell(top1), _cell(fpr), _cell(index.get(table, name, FI, "auroc"))]
        body.append(tuple(line))
    rho = index.get(table, ALL_MODELS, FI, "spearman_top1_fpr95")
    if rho is not None:
        rules.append(len(body) - 1)
        width = 7 if with_pretraining else 6
        label = "Spearman ρ (Top-1 (ReaL), best FPR@95), Appendix E's 26 models"
        body.append((Cell(label), *[Cell("")] * (width - 2), _cell(replace(rho, aside=()))))
        for text, value in rho.aside:
            body.append(
                (Cell(f"Spearman ρ {text}"), *[Cell("")] * (width - 2), Cell(_number(value, 2), "no published value"))
            )
    columns = ["model"] + (["pre-training"] if with_pretraining else []) + ["params", "Top-1", "Top-1 (ReaL)"]
    columns += ["FPR@95 ↓", "AUROC ↑"]
    notes = [
        LEGEND,
        "Top-1: on the original ImageNet-1k labels (no published value). Top-1 (ReaL): multi-label top-1 on the "
        "re-annotated labels of accuracy.json (ReImageNet when given, else ReaL); the paper's Top-1 is on ReImageNet, "
        "so Δ against ReaL includes the label sets' difference. VLMs: zero-shot top-1.",
        "†: linear probe on a frozen backbone. Names in parentheses: the Table A8 model a short name stands for.",
    ]
    if rho is not None:
        notes.append(
            "ρ: Spearman correlation (average ranks for ties) between Top-1 (ReaL) and best FPR@95. The paper's −0.61 "
            "(Appendix E) is over its 26 models: Table A7 without "
            + ", ".join(APPENDIX_E_EXCLUDED)
            + "; the row below it, shown when the run has three or more supervised models, is over all of them (from "
            "Table A7's own 30 rows: −0.71; no published value)."
        )
    align = ("l",) * (3 if with_pretraining else 2) + ("r",) * 4
    return Table(
        f"paper-table{table}",
        TITLES[table],
        tuple(columns),
        tuple(body),
        align=align,
        notes=tuple(notes),
        rules_after=tuple(rules),
    )


def _table2(index: _Index) -> Table:
    columns = [
        ("", "logit-sp."),
        ("eoe@eoe", "EOE"),
        ("neglabel@wordnet", "WN"),
        ("neglabel@siblings", "GPT"),
        ("neglabel@wn-siblings", "WN+GPT"),
        ("neglabel@oracle", "oracle"),
    ]
    body = []
    for model in index.rows("2", "model"):
        line = [Cell("mean" if model == MEAN_VLM else model)]
        for detector, _ in columns:
            line.append(_cell(index.get("2", model, FI, "fpr95", detector)))
        body.append(tuple(line))
    return Table(
        "paper-table2",
        TITLES["2"],
        ("model",) + tuple(c for _, c in columns),
        tuple(body),
        notes=(LEGEND, "logit-sp.: the best of the seven logit-space scores. oracle: a lower bound, not deployable."),
        rules_after=(len(body) - 2,),
    )


def _table3(index: _Index) -> Table:
    body = []
    for dataset in index.rows("3", "dataset"):
        model = "EVA02-L-448"
        body.append(
            (
                Cell(dataset),
                _cell(index.get("3", model, dataset, "n")),
                _cell(index.get("3", model, dataset, "fpr95")),
                _cell(index.get("3", model, dataset, "auroc")),
            )
        )
    return Table(
        "paper-table3",
        TITLES["3"],
        ("OOD dataset", "n", "FPR@95 ↓", "AUROC ↑"),
        tuple(body),
        notes=(LEGEND, "Best of the post-hoc detectors per dataset and metric."),
        rules_after=(10, 13),
    )


def _table_a1(index: _Index) -> Table:
    models = index.rows("A1", "model")
    body = []
    for detector in index.rows("A1", "detector"):
        line = [Cell(_label(detector))]
        for model in models:
            line.append(
                _pair(index.get("A1", model, FI, "fpr95", detector), index.get("A1", model, FI, "auroc", detector))
            )
        body.append(tuple(line))
    printed = {c.cell.model: c.cell.printed for c in index.by_key.values() if c.cell.table == "A1"}
    return Table(
        "paper-tableA1",
        TITLES["A1"],
        ("detector",) + tuple(printed[m] for m in models),
        tuple(body),
        notes=(LEGEND, _short_names_note()),
    )


def _short_names_note() -> str:
    pairs = [
        f"{m.table1_name} = {m.model}"
        for m in published_models().values()
        if m.table1_name and m.table1_name != m.model
    ]
    return (
        "Short names as printed in the paper's Tables 1, A1 and A2: "
        + ", ".join(pairs)
        + " (ImageNet-21k checkpoints)."
    )


def _table_a2(index: _Index) -> Table:
    models = index.rows("A2", "model")
    body = []
    for dataset in index.rows("A2", "dataset"):
        line = [Cell("mean" if dataset == MEAN_OOD else dataset)]
        for model in models:
            line.append(_pair(index.get("A2", model, dataset, "fpr95"), index.get("A2", model, dataset, "auroc")))
        body.append(tuple(line))
    printed = {c.cell.model: c.cell.printed for c in index.by_key.values() if c.cell.table == "A2"}
    columns = ("OOD dataset",) + tuple("mean" if m == MEAN_SUPERVISED else printed[m] for m in models)
    return Table(
        "paper-tableA2",
        TITLES["A2"],
        columns,
        tuple(body),
        notes=(LEGEND, _short_names_note()),
        rules_after=(10, 13, 14),
    )


def _table_a3(index: _Index) -> Table:
    body = []
    model = "EVA02-L-448"
    for dataset in index.rows("A3", "dataset"):
        line = [Cell(dataset)]
        for subset in ("full", "clean"):
            line.append(_cell(index.get("A3", model, dataset, "n", subset=subset)))
            if subset == "clean":
                line.append(_cell(index.get("A3", model, dataset, "fraction", subset=subset)))
            line.append(_cell(index.get("A3", model, dataset, "fpr95", subset=subset)))
            line.append(_cell(index.get("A3", model, dataset, "auroc", subset=subset)))
        line.append(_cell(index.get("A3", model, dataset, "fpr95_delta", subset="clean-full")))
        line.append(_cell(index.get("A3", model, dataset, "auroc_delta", subset="clean-full")))
        body.append(tuple(line))
    columns = ("OOD dataset", "n", "FPR@95 ↓", "AUROC ↑", "n", "%", "FPR@95 ↓", "AUROC ↑", "Δ FPR", "Δ AUROC")
    groups = (("", 1), ("full dataset", 3), ("cleaned sub-sample (NINCO)", 4), ("clean − full", 2))
    return Table(
        "paper-tableA3",
        TITLES["A3"],
        columns,
        tuple(body),
        groups,
        notes=(LEGEND, "A run's cleaned sub-sample is the dataset named <dataset>-clean."),
    )


def _table_a4(index: _Index) -> Table:
    columns = [("mcm", "MCM"), ("eoe@eoe-far", "far-OOD"), ("eoe@eoe-near", "near-OOD"), ("eoe@eoe", "fine-grained")]
    body = []
    for dataset in index.rows("A4", "dataset"):
        line = [Cell(dataset)]
        for detector, _ in columns:
            mean = index.get("A4", MEAN_VLM, dataset, "fpr95", detector)
            cell = _cell(mean)
            std = index.get("A4", MEAN_VLM, dataset, "fpr95_std", detector)
            if std is not None:
                spread = f"paper ± {_number(std.cell.value, std.cell.digits)} over its generations"
                if std.reproduced is not None:
                    spread = f"± {_number(std.reproduced, std.cell.digits)} over the run's generations; " + spread
                cell = Cell(cell.text, f"{cell.note}; {spread}", mark=_worst(c for c in (mean, std) if c is not None))
            line.append(cell)
        body.append(tuple(line))
    return Table(
        "paper-tableA4",
        TITLES["A4"],
        ("OOD dataset",) + tuple(c for _, c in columns),
        tuple(body),
        notes=(
            LEGEND,
            "Means over the eight VLMs: reproduced only when the run has all eight. Runs name the "
            "prompts' vocabularies eoe-far, eoe-near and eoe (fine-grained). A run with several generations of a "
            "vocabulary, named <vocabulary>.g1, <vocabulary>.g2, …, is averaged over them, and ± is the standard "
            "deviation (ddof = 1) over the generations of the mean over the VLMs, as the paper's caption defines it.",
        ),
    )


def _table_a5(index: _Index) -> Table:
    columns = [
        ("neglabel@wordnet", "WN"),
        ("neglabel@siblings", "GPT"),
        ("neglabel@wn-siblings", "WN+GPT"),
        ("neglabel@oracle", "oracle"),
    ]
    body = []
    for dataset in index.rows("A5", "dataset"):
        line = [Cell("mean" if dataset == MEAN_OOD else dataset), _cell(index.get("A5", MEAN_VLM, dataset, "n"))]
        line += [_cell(index.get("A5", MEAN_VLM, dataset, "fpr95", d)) for d, _ in columns]
        body.append(tuple(line))
    return Table(
        "paper-tableA5",
        TITLES["A5"],
        ("OOD dataset", "n") + tuple(c for _, c in columns),
        tuple(body),
        notes=(LEGEND, "Means over the eight VLMs: reproduced only when the run has all eight."),
        rules_after=(len(body) - 3,),
    )


def _table_a6(index: _Index) -> Table:
    metrics = [
        ("n", "N"),
        ("fraction", "655/N (%)"),
        ("fpr95", "full"),
        ("draw_mean", "mean"),
        ("draw_bias", "bias"),
        ("draw_std", "std"),
        ("closed_form_se", "closed form"),
        ("spearman", "ρ"),
    ]
    body = []
    for dataset in index.rows("A6", "dataset"):
        line = [Cell(dataset)]
        line += [_cell(index.get("A6", "EVA02-L-448", dataset, m)) for m, _ in metrics]
        body.append(tuple(line))
    return Table(
        "paper-tableA6",
        TITLES["A6"],
        ("OOD dataset",) + tuple(c for _, c in metrics),
        tuple(body),
        notes=(
            LEGEND,
            "Reproduced from the run's rows (N, full); the draws' columns come from the report's "
            "Table A6 when its subset size is 655 and EVA02-L-448 is in the run.",
        ),
    )


def published_tables(comparisons: Sequence[Comparison], accuracy: Sequence[Accuracy] = ()) -> list[Table]:
    """Every published table's layout with the comparisons in its cells, in the paper's order."""
    index = _Index(comparisons)
    builders = {
        "1": lambda: _model_rows(index, "1", accuracy, with_pretraining=False),
        "2": lambda: _table2(index),
        "3": lambda: _table3(index),
        "A1": lambda: _table_a1(index),
        "A2": lambda: _table_a2(index),
        "A3": lambda: _table_a3(index),
        "A4": lambda: _table_a4(index),
        "A5": lambda: _table_a5(index),
        "A6": lambda: _table_a6(index),
        "A7": lambda: _model_rows(index, "A7", accuracy, with_pretraining=True),
    }
    # Cells carry long notes (paper value, detector, Δ): wrap them so a table fits the page instead of scrolling.
    return [replace(build(), wrap=True) for table, build in builders.items() if table in index.tables]


def summary_table(comparisons: Sequence[Comparison]) -> Table:
    """Per published table: its cells, how many get each verdict, and the mean and largest |Δ| of the measured ones."""
    body = []
    totals = dict.fromkeys(VERDICTS, 0)
    for table in TITLES:
        comps = [c for c in comparisons if c.cell.table == table]
        if not comps:
            continue
        counts = {v: sum(c.verdict == v for c in comps) for v in VERDICTS}
        for verdict, count in counts.items():
            totals[verdict] += count
        done = [c for c in comps if c.reproduced is not None and c.cell.metric in ("fpr95", "auroc", "top1")]
        deltas = [abs(c.delta) for c in done]  # type: ignore[arg-type]
        body.append(
            (
                Cell(TITLES[table]),
                Cell(str(len(comps))),
                *(Cell(str(counts[v])) for v in VERDICTS),
                Cell(f"{sum(deltas) / len(deltas):.2f}" if deltas else MISSING),
                Cell(f"{max(deltas):.2f}" if deltas else MISSING),
            )
        )
    body.append(
        (
            Cell("all tables"),
            Cell(str(sum(totals.values()))),
            *(Cell(str(totals[v])) for v in VERDICTS),
            Cell(""),
            Cell(""),
        )
    )
    return Table(
        "paper-summary",
        "Reproduction against the Fi-ImageNet-1k paper: verdicts per published table",
        ("published table", "cells", *VERDICTS, "mean |Δ|", "max |Δ|"),
        tuple(body),
        notes=(
            LEGEND,
            "|Δ| in points over the reproduced FPR@95, AUROC and Top-1 cells. 'not in the run': cells the run has no "
            "value for (a model, dataset, detector or vocabulary it lacks, or a mean missing a part).",
        ),
        rules_after=(len(body) - 2,),
    )


def verdict_line(comparisons: Sequence[Comparison]) -> str:
    """'4 reproduced, 2 within sampling error, 62 differ, 1205 not in the run (of 1273 published cells)'."""
    counts = {v: sum(c.verdict == v for c in comparisons) for v in VERDICTS}
    words = {DIFFERS: "differ"}
    parts = ", ".join(f"{counts[v]} {words.get(v, v)}" for v in VERDICTS)
    return f"{parts} (of {len(comparisons)} published cells)"


def comparison_records(comparisons: Sequence[Comparison]) -> list[dict[str, object]]:
    """Tidy records (one per published cell) for the comparison CSV."""
    records = []
    for c in comparisons:
        cell = c.cell
        tolerance = c.tolerance
        records.append(
            {
                "table": cell.table,
                "model": cell.model,
                "printed_model": cell.printed_model,
                "dataset": cell.dataset,
                "subset": cell.subset,
                "detector": cell.detector,
                "best": int(cell.best),
                "metric": cell.metric,
                "published": cell.value,
                "reproduced": c.reproduced,
                "delta": c.delta,
                "run_model": c.run_model,
                "run_detector": c.detector,
                "low": c.low,
                "high": c.high,
                "interval": c.method,
                "verdict": c.verdict,
                "reproduced_if_within_low": tolerance[0] if tolerance else None,
                "reproduced_if_within_high": tolerance[1] if tolerance else None,
                "aside": "; ".join(f"{label}: {value:.6g}" for label, value in c.aside),
                "note": c.note,
            }
        )
    return records
