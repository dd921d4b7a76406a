"""The Fi-ImageNet-1k paper's table layouts, built from tidy result rows (and subsampling summaries) as renderer-neutral `Table`s.

- Table 1: per model, the best FPR@95 and the best AUROC on each OOD set (and their mean), with the detector's name.
- Table A1: detector × model, mean FPR@95 / AUROC over the OOD sets.
- Table 3 / A2: OOD dataset (with n) × model, the best detector's FPR@95 / AUROC.
- Table 2: zero-shot models × vocabularies, best deployable marked.
- Table A6: the subsampling study, with the between-dataset spread versus sampling noise in the notes.

Score names follow `oodbench zeroshot evaluate`: ``<score>`` for scores without a vocabulary (supervised detectors,
zero-shot logit-space scores), ``<score>@<vocabulary>`` for vocabulary-bound scores and ``<score>@<vocabulary>[k=K]``
/ ``[m=M]`` for the points of a vocabulary-size sweep (K siblings per ID class, or the WordNet prefix size M). Rows of
zero-shot models belong to Table 2 (and the sweep figure) and are left out of the other tables. "Best" is the lowest
FPR@95 (ties: higher AUROC, then first listed) or the highest AUROC (ties: lower FPR@95, then first listed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..analysis.breakdown import ClassAcceptance
from ..analysis.delong import DeLongResult
from ..analysis.runs import IntervalRecord
from ..analysis.spread import SpreadSummary
from ..analysis.subsample import SubsampleSummary
from ..core.errors import AnalysisError
from ..core.results import ResultRow
from ..core.tabular import MISSING, Cell, Table, detector_table, percent

__all__ = [
    "ResultGrid",
    "VocabScore",
    "Vocabulary",
    "coerce_vocabularies",
    "parse_vocabulary_score",
    "zeroshot_pairs",
    "supervised_rows",
    "table1",
    "table_a1",
    "table_a2",
    "table2",
    "table_a6",
    "table_detectors",
    "table_intervals",
    "table_delong",
    "format_p",
    "table_class_acceptance",
]

_VOCAB_SCORE = re.compile(r"^(?P<method>[^@\[\]\s]+)@(?P<vocab>[^@\[\]\s]+)(?:\[(?P<param>[km])=(?P<value>\d+)\])?$")
FPR = "FPR@95 ↓"
AUROC = "AUROC ↑"
SWEEP_PARAMETERS = {"k": "siblings per ID class", "m": "WordNet prefix size M"}


class VocabScore(NamedTuple):
    """A vocabulary-bound score name taken apart: ``neglabel@wn[k=5]`` is ('neglabel', 'wn', 'k', 5)."""

    method: str
    vocabulary: str
    parameter: str | None = None  # 'k' or 'm' for a sweep point, None for the vocabulary at its own size
    value: int | None = None

    @property
    def sweep(self) -> bool:
        """Whether this is a point of a k or M sweep."""
        return self.parameter is not None

    @property
    def name(self) -> str:
        """The canonical score name."""
        suffix = f"[{self.parameter}={self.value}]" if self.parameter is not None else ""
        return f"{self.method}@{self.vocabulary}{suffix}"


def parse_vocabulary_score(detector: str) -> VocabScore | None:
    """VocabScore('neglabel', 'wn', 'k', 5) for 'neglabel@wn[k=5]'; None for a score without a vocabulary."""
    match = _VOCAB_SCORE.match(detector)
    if match:
        value = match["value"]
        return VocabScore(match["method"], match["vocab"], match["param"], int(value) if value is not None else None)
    if any(ch in detector for ch in "@[]"):
        raise AnalysisError(
            f"malformed score name {detector!r}: vocabulary-bound scores are named "
            "'<score>@<vocabulary>', sweep points '<score>@<vocabulary>[k=K]' or '[m=M]' "
            "(e.g. 'neglabel@wordnet', 'neglabel@siblings[k=5]')"
        )
    return None


def zeroshot_pairs(rows: Iterable[ResultRow]) -> list[tuple[str, str]]:
    """(model, ID set) pairs with a vocabulary-bound score: zero-shot models, when no run.json says so."""
    return list(dict.fromkeys((r.model, r.id_dataset) for r in rows if parse_vocabulary_score(r.detector)))


def supervised_rows(rows: Iterable[ResultRow], zeroshot: Iterable[tuple[str, str]] = ()) -> list[ResultRow]:
    """Rows of supervised models: (model, ID set) pairs without vocabulary-bound scores and not in `zeroshot`."""
    rows = list(rows)
    excluded = set(zeroshot_pairs(rows)) | set(zeroshot)
    return [r for r in rows if (r.model, r.id_dataset) not in excluded]


Pair = tuple[str, str]  # (model, id_dataset)


class ResultGrid:
    """Lookup of (model, id) -> ood -> detector -> {metric: value}, with orders of first appearance."""

    def __init__(self, rows: Sequence[ResultRow]) -> None:
        if not rows:
            raise AnalysisError("no result rows to tabulate")
        self.values: dict[Pair, dict[str, dict[str, dict[str, float]]]] = {}
        self.n_ood: dict[tuple[Pair, str], int] = {}
        for r in rows:
            pair = (r.model, r.id_dataset)
            self.values.setdefault(pair, {}).setdefault(r.ood_dataset, {}).setdefault(r.detector, {})[r.metric] = (
                r.value
            )
            self.n_ood[(pair, r.ood_dataset)] = r.n_ood
        self.pairs = list(self.values)
        self.oods = list(dict.fromkeys(r.ood_dataset for r in rows))
        self.detectors = list(dict.fromkeys(r.detector for r in rows))

    def label(self, pair: Pair) -> str:
        """The model name, with the ID set when the table mixes ID sets."""
        if len({p[1] for p in self.pairs}) > 1:
            return f"{pair[0]} ({pair[1]})"
        return pair[0]

    def model_pair(self, model: str, id_dataset: str | None = None) -> Pair:
        """The one (model, ID set) pair of `model` (and `id_dataset`, needed when the model has several ID sets)."""
        pairs = [p for p in self.pairs if p[0] == model and (id_dataset is None or p[1] == id_dataset)]
        if len(pairs) != 1:
            raise AnalysisError(f"expected one (model, ID set) for {model!r}; found {pairs}")
        return pairs[0]

    def metric(self, pair: Pair, ood: str, detector: str, metric: str) -> float | None:
        return self.values.get(pair, {}).get(ood, {}).get(detector, {}).get(metric)

    def best(
        self, pair: Pair, oods: Sequence[str], metric: str, among: Sequence[str] | None = None
    ) -> tuple[str, float, float | None] | None:
        """(detector, value, other metric) of the best detector by `metric` averaged over `oods` (all required).

        `among` restricts the candidates (default: every detector).
        """
        other = "auroc" if metric == "fpr95" else "fpr95"
        allowed = None if among is None else set(among)
        candidates = []
        for order, detector in enumerate(self.detectors):
            if allowed is not None and detector not in allowed:
                continue
            main = [self.metric(pair, ood, detector, metric) for ood in oods]
            if any(v is None for v in main):
                continue
            second = [self.metric(pair, ood, detector, other) for ood in oods]
            second_mean = None if any(v is None for v in second) else sum(second) / len(second)
            candidates.append((detector, sum(main) / len(main), second_mean, order))
        if not candidates:
            return None
        sign = 1.0 if metric == "fpr95" else -1.0

        # Secondary key: the other metric in its own "better" direction; missing counts as worst.
        def key(c: tuple[str, float, float | None, int]) -> tuple[float, float, int]:
            tie = c[2] if c[2] is not None else (float("inf") if metric == "auroc" else float("-inf"))
            return (sign * c[1], -sign * tie, c[3])

        detector, value, second_mean, _ = min(candidates, key=key)
        return detector, value, second_mean


def _signed(value: float, digits: int = 2) -> str:
    """+1.23 / −1.23 with a typographic minus."""
    return f"{value:+.{digits}f}".replace("-", "−")


def _select(items: Sequence[str], wanted: Sequence[str] | None, what: str) -> list[str]:
    if wanted is None:
        return list(items)
    unknown = [w for w in wanted if w not in items]
    if unknown:
        raise AnalysisError(f"unknown {what} {unknown}; present: {', '.join(items)}")
    return list(wanted)


def _bold_extreme(values: Sequence[float | None], lowest: bool) -> list[bool]:
    present = [v for v in values if v is not None]
    if not present:
        return [False] * len(values)
    target = min(present) if lowest else max(present)
    return [v is not None and v == target for v in values]


def table1(
    rows: Sequence[ResultRow],
    *,
    ood_datasets: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    mean: bool = True,
    top1: Mapping[str, Mapping[str, float]] | None = None,
    label_sets: Mapping[str, str] | None = None,
    top1_missing: Mapping[str, str] | None = None,
) -> Table:
    """Table 1: per model, the best FPR@95 and AUROC on each OOD set (and on average), with the detector's name.

    `top1` ({model: {label set: top-1 fraction}}, from the runs' accuracy.json) adds the "Top-1" (original labels) and
    "Top-1 (ReaL)" (re-annotated: ReImageNet when given, else ReaL) columns when any model has them; `label_sets`
    ({model: the classes its original labels name}) enters the caption, `top1_missing` ({model: why no Top-1}) too.
    """
    label_sets, top1_missing = label_sets or {}, top1_missing or {}
    grid = ResultGrid(supervised_rows(rows))
    oods = _select(grid.oods, ood_datasets, "OOD datasets")
    pairs = [p for p in grid.pairs if models is None or p[0] in models]
    if not pairs:
        raise AnalysisError(f"no rows for models {list(models or [])}")
    blocks = [(ood, [ood]) for ood in oods] + ([("mean", oods)] if mean and len(oods) > 1 else [])
    body: list[list[Cell]] = [[Cell(grid.label(p))] for p in pairs]
    with_top1 = any(p[0] in (top1 or {}) or p[0] in top1_missing for p in pairs)
    if with_top1:
        for line, pair in zip(body, pairs, strict=True):
            found = (top1 or {}).get(pair[0], {})
            relabelled = next((found[k] for k in ("reimagenet", "real") if k in found), None)
            line += [Cell(percent(found.get("original"))), Cell(percent(relabelled))]
    for _, block_oods in blocks:
        for metric in ("fpr95", "auroc"):
            bests = [grid.best(p, block_oods, metric) for p in pairs]
            bold = _bold_extreme([b[1] if b else None for b in bests], lowest=metric == "fpr95")
            for line, best, strong in zip(body, bests, bold, strict=False):
                line.append(Cell(percent(best[1]), best[0], strong) if best else Cell(MISSING))
    lead = ["model"] + (["Top-1", "Top-1 (ReaL)"] if with_top1 else [])
    groups = [("", len(lead))] + [(label, 2) for label, _ in blocks]
    names = lead + [name for _ in blocks for name in (FPR, AUROC)]
    notes = [
        "Best detector per model and column (its name in parentheses); best model per column in bold. Values in %."
    ]
    if with_top1:
        shown = {pair[0] for pair in pairs}
        named = sorted({label_sets[m] for m in shown if m in label_sets})
        if len(named) == 1:
            what = f"accuracy on the ID test set's original labels ({named[0]})"
        elif named:
            what = (
                "accuracy on the ID test set's original labels ("
                + "; ".join(f"{m}: {label_sets[m]}" for m in sorted(shown) if m in label_sets)
                + ")"
            )
        else:
            what = "accuracy on the ID test set's original labels"
        notes.append(
            f"Top-1: {what}; Top-1 (ReaL): multi-label top-1 on re-annotated labels (ReImageNet when the run gives "
            "it, else ReaL), from each run's accuracy.json."
        )
        notes.extend(f"Top-1 of {m} not computed: {top1_missing[m]}." for m in sorted(shown) if m in top1_missing)
    if mean and len(oods) > 1:
        notes.append(f"mean: the detector with the best mean over {len(oods)} OOD sets.")
    return Table(
        "table1",
        "Best FPR@95 and AUROC per model and OOD set (paper Table 1)",
        tuple(names),
        tuple(tuple(r) for r in body),
        tuple(groups),
        notes=tuple(notes),
    )


def table_a1(
    rows: Sequence[ResultRow], *, ood_datasets: Sequence[str] | None = None, detectors: Sequence[str] | None = None
) -> Table:
    """Table A1: detector × model, mean FPR@95 / AUROC over the OOD sets, the best detector per model in bold."""
    grid = ResultGrid(supervised_rows(rows))
    oods = _select(grid.oods, ood_datasets, "OOD datasets")
    names = _select(grid.detectors, detectors, "detectors")
    cells: dict[tuple[str, Pair], tuple[float, float] | None] = {}
    for pair in grid.pairs:
        have = [o for o in oods if o in grid.values[pair]]
        for detector in names:
            fprs = [grid.metric(pair, o, detector, "fpr95") for o in have]
            aucs = [grid.metric(pair, o, detector, "auroc") for o in have]
            ok = have and all(v is not None for v in fprs + aucs)
            cells[(detector, pair)] = (sum(fprs) / len(fprs), sum(aucs) / len(aucs)) if ok else None
    bold = {}
    for pair in grid.pairs:
        flags = _bold_extreme([cells[(d, pair)][0] if cells[(d, pair)] else None for d in names], lowest=True)
        bold.update({(d, pair): f for d, f in zip(names, flags, strict=False)})
    body = []
    for detector in names:
        line = [Cell(detector)]
        for pair in grid.pairs:
            value = cells[(detector, pair)]
            line.append(
                Cell(f"{percent(value[0])} / {percent(value[1])}", bold=bold[(detector, pair)])
                if value
                else Cell(MISSING)
            )
        body.append(tuple(line))
    columns = ("detector",) + tuple(grid.label(p) for p in grid.pairs)
    note = (
        f"Cells: FPR@95 / AUROC (%) averaged over the OOD sets of each model ({', '.join(oods)}); "
        "lowest mean FPR@95 per model in bold."
    )
    return Table(
        "tableA1",
        "Every detector on every model, mean over the OOD sets (paper Table A1)",
        columns,
        tuple(body),
        notes=(note,),
    )


def table_a2(rows: Sequence[ResultRow], *, ood_datasets: Sequence[str] | None = None) -> Table:
    """Table 3 / A2: OOD dataset (with n) × model, the best detector's FPR@95 / AUROC, the best model per dataset in bold."""
    grid = ResultGrid(supervised_rows(rows))
    oods = _select(grid.oods, ood_datasets, "OOD datasets")
    body = []
    for ood in oods:
        sizes = sorted({grid.n_ood[(p, ood)] for p in grid.pairs if (p, ood) in grid.n_ood})
        n_text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
        bests = [grid.best(p, [ood], "fpr95") if ood in grid.values[p] else None for p in grid.pairs]
        bold = _bold_extreme([b[1] if b else None for b in bests], lowest=True)
        line = [Cell(ood), Cell(n_text)]
        for best, strong in zip(bests, bold, strict=False):
            line.append(Cell(f"{percent(best[1])} / {percent(best[2])}", best[0], strong) if best else Cell(MISSING))
        body.append(tuple(line))
    columns = ("OOD dataset", "n") + tuple(grid.label(p) for p in grid.pairs)
    note = "Cells: FPR@95 / AUROC (%) of each model's best detector by FPR@95 (in parentheses); best model per dataset in bold."
    return Table(
        "tableA2", "Best detector per OOD set and model (paper Tables 3 and A2)", columns, tuple(body), notes=(note,)
    )


_VOCAB_FIELDS = ("label", "size", "deployable", "family", "classes", "k", "m")


def _count(key: str, name: str, value: object) -> int | None:
    """A non-negative integer field of vocabulary metadata (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AnalysisError(f"vocabulary {key!r}: {name} must be a non-negative integer; got {value!r}")
    return value


@dataclass(frozen=True)
class Vocabulary:
    """How a vocabulary key (the part after '@' in ``neglabel@key``) is shown in Table 2 and the sweep figure."""

    label: str
    size: int | None = None
    deployable: bool = True
    family: str | None = None  # vocabularies of one family at several sizes form a line in the sweep
    classes: int | None = None  # ID classes with sibling lists: a k sweep point holds k siblings for each
    k: int | None = None  # the vocabulary's own siblings per class (its default k), when it has per-class lists
    m: int | None = None  # its own WordNet prefix size (its default M), when it has a WordNet ranking

    @classmethod
    def coerce(cls, key: str, value: Vocabulary | Mapping[str, object] | int | str | None) -> Vocabulary:
        """From a Vocabulary, a dict (label/size/deployable/family/classes/k/m), a size, a label, or None."""
        if isinstance(value, Vocabulary):
            return value
        if value is None:
            return cls(key)
        if isinstance(value, bool):
            raise AnalysisError(f"vocabulary {key!r}: expected a label, a size or a mapping; got {value!r}")
        if isinstance(value, int):
            return cls(key, size=_count(key, "size", value))
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(_VOCAB_FIELDS))
            if unknown:
                raise AnalysisError(f"vocabulary {key!r}: unknown keys {unknown} (use {', '.join(_VOCAB_FIELDS)})")
            deployable = value.get("deployable", True)
            if not isinstance(deployable, bool):
                raise AnalysisError(f"vocabulary {key!r}: deployable must be true or false; got {deployable!r}")
            family = value.get("family")
            return cls(
                str(value.get("label", key)),
                _count(key, "size", value.get("size")),
                deployable,
                None if family is None else str(family),
                _count(key, "classes", value.get("classes")),
                _count(key, "k", value.get("k")),
                _count(key, "m", value.get("m")),
            )
        raise AnalysisError(f"vocabulary {key!r}: expected a label, a size or a mapping; got {type(value).__name__}")

    def sweep_size(self, parameter: str, value: int) -> int | None:
        """Nominal label count at a sweep point (before de-duplication and ID-name filtering); None if unknown.

        As the zero-shot vocabularies select labels: a k point holds k siblings per ID class (plus, for a union, the
        WordNet prefix at its own M); an M point holds the top M WordNet labels (plus, for a union, its own k
        siblings per class).
        """
        if parameter == "k":
            return None if self.classes is None else value * self.classes + (self.m or 0)
        if parameter == "m":
            if self.k is None:
                return value
            return None if self.classes is None else value + self.k * self.classes
        raise AnalysisError(f"unknown sweep parameter {parameter!r}; expected k or m")

    def is_default(self, parameter: str, value: int) -> bool:
        """Whether a sweep point is the vocabulary at its own size (its default k or M, when known)."""
        own = self.k if parameter == "k" else self.m if parameter == "m" else None
        return own is not None and own == value


def coerce_vocabularies(vocabularies: Mapping[str, object] | None) -> dict[str, Vocabulary]:
    """{key: Vocabulary} from a mapping of Vocabulary objects, dicts, sizes or labels."""
    if vocabularies is not None and not isinstance(vocabularies, Mapping):
        raise AnalysisError(
            f"vocabularies must be a mapping {{key: {{label, size, ...}}}}; got {type(vocabularies).__name__}"
        )
    return {key: Vocabulary.coerce(key, value) for key, value in (vocabularies or {}).items()}


def _table2_candidates(detectors: Iterable[str], vocabs: Mapping[str, Vocabulary]) -> dict[str, dict[str, str]]:
    """Per vocabulary key, {detector: cell note} of its Table-2 candidates.

    Every score at the vocabulary's own size; for a (score, vocabulary) evaluated only at sweep points, its default
    point (the vocabulary's own k or M, when the metadata gives them), else its largest.
    """
    grouped: dict[str, dict[str, list[VocabScore]]] = {}
    for detector in detectors:
        parsed = parse_vocabulary_score(detector)
        if parsed:
            grouped.setdefault(parsed.vocabulary, {}).setdefault(parsed.method, []).append(parsed)
    result: dict[str, dict[str, str]] = {}
    for key, methods in grouped.items():
        vocab = vocabs.get(key) or Vocabulary(key)
        chosen: dict[str, str] = {}
        for method, points in methods.items():
            own = [p for p in points if not p.sweep]
            if own:
                chosen[own[0].name] = method
                continue
            defaults = [p for p in points if vocab.is_default(p.parameter, p.value)]  # type: ignore[arg-type]
            pick = (
                defaults[0]
                if defaults
                else max(points, key=lambda p: (vocab.sweep_size(p.parameter, p.value) or 0, p.value))
            )  # type: ignore[arg-type]
            chosen[pick.name] = f"{method}, {pick.parameter}={pick.value}"
        result[key] = chosen
    return result


def table2(
    rows: Sequence[ResultRow],
    vocabularies: Mapping[str, object] | None = None,
    *,
    ood_datasets: Sequence[str] | None = None,
    metric: str = "fpr95",
    pairs: Sequence[Pair] | None = None,
) -> Table:
    """Table 2: zero-shot models × (best logit-space score, each vocabulary); best deployable one per model in bold.

    `pairs` are the (model, ID set) pairs of the zero-shot models (default: those with vocabulary-bound scores). A
    vocabulary cell is its best score at the vocabulary's own size; sweep points stand in only for a vocabulary that
    has no other score. Vocabularies with the same label (e.g. each model's own WordNet list) share a column.
    """
    if metric not in ("fpr95", "auroc"):
        raise AnalysisError(f"Table 2 shows fpr95 or auroc; got {metric!r}")
    wanted = list(dict.fromkeys(pairs)) if pairs is not None else zeroshot_pairs(rows)
    if not wanted:
        raise AnalysisError(
            "no zero-shot rows: Table 2 needs scores named like 'neglabel@wordnet' "
            '(or rows of runs whose run.json says "kind": "zeroshot")'
        )
    selected = [r for r in rows if (r.model, r.id_dataset) in set(wanted)]
    if not selected:
        raise AnalysisError(f"no result rows for the zero-shot models {wanted}")
    grid = ResultGrid(selected)
    row_pairs = [p for p in wanted if p in grid.values]
    oods = _select(grid.oods, ood_datasets, "OOD datasets")
    given = coerce_vocabularies(vocabularies)
    present = list(dict.fromkeys(p.vocabulary for d in grid.detectors if (p := parse_vocabulary_score(d))))
    keys = [k for k in given if k in present] + [k for k in present if k not in given]
    vocabs = {k: given.get(k, Vocabulary(k)) for k in keys}
    # Non-deployable vocabularies (lower bounds) go last.
    keys.sort(key=lambda k: not vocabs[k].deployable)
    columns: dict[tuple[str, bool], list[str]] = {}
    for key in keys:
        columns.setdefault((vocabs[key].label, vocabs[key].deployable), []).append(key)
    lowest = metric == "fpr95"
    stand_ins = False
    body = []
    for pair in row_pairs:
        detectors = [d for d in grid.detectors if any(d in per for per in grid.values[pair].values())]
        candidates = _table2_candidates(detectors, vocabs)
        line = [Cell(grid.label(pair))]
        logit = grid.best(pair, oods, metric, among=[d for d in detectors if parse_vocabulary_score(d) is None])
        line.append(Cell(percent(logit[1]), logit[0]) if logit else Cell(MISSING))
        cells: list[tuple[float, str] | None] = []
        for members in columns.values():
            notes = {d: note for key in members for d, note in candidates.get(key, {}).items()}
            best = grid.best(pair, oods, metric, among=list(notes)) if notes else None
            cells.append((best[1], notes[best[0]]) if best else None)
            stand_ins = stand_ins or bool(best and parse_vocabulary_score(best[0]).sweep)  # type: ignore[union-attr]
        deployable = [cell[0] if cell and flag else None for cell, (_, flag) in zip(cells, columns, strict=False)]
        for cell, strong in zip(cells, _bold_extreme(deployable, lowest=lowest), strict=False):
            line.append(Cell(percent(cell[0]), cell[1], strong) if cell else Cell(MISSING))
        body.append(tuple(line))
    headers = ["model", "best logit score"]
    for (label, deployable), members in columns.items():
        sizes = sorted({vocabs[k].size for k in members if vocabs[k].size is not None})  # type: ignore[misc]
        size = "" if not sizes else f" ({sizes[0]:,})" if len(sizes) == 1 else f" ({sizes[0]:,}–{sizes[-1]:,})"
        headers.append(label + size + ("" if deployable else "†"))
    name = "FPR@95" if lowest else "AUROC"
    notes = [
        f"{name} (%) averaged over {', '.join(oods)}; the scoring method in parentheses; vocabulary sizes in the "
        "header. The best deployable vocabulary per model is in bold."
    ]
    if stand_ins:
        notes.append("k=…/m=…: a vocabulary scored only at sweep points shows its default point (or its largest).")
    shared = [f"{label}: {', '.join(members)}" for (label, _), members in columns.items() if len(members) > 1]
    if shared:
        notes.append("Columns joining several vocabularies (each model's own): " + "; ".join(shared) + ".")
    if any(not v.deployable for v in vocabs.values()):
        notes.append("† not deployable (built from the benchmark's own OOD labels): a lower bound, not a method.")
    return Table(
        "table2",
        f"Zero-shot {name} by negative vocabulary (paper Table 2)",
        tuple(headers),
        tuple(body),
        notes=tuple(notes),
    )


def table_a6(summaries: Sequence[SubsampleSummary], spreads: Sequence[SpreadSummary] = ()) -> Table:
    """Table A6: the subsampling study per (model, OOD set), the spread-versus-noise summaries as notes."""
    if not summaries:
        raise AnalysisError("no subsampling results to tabulate")
    multi_model = len({(s.model, s.id_dataset) for s in summaries}) > 1
    body = []
    for s in summaries:
        line = ([Cell(s.model)] if multi_model else []) + [
            Cell(s.ood_dataset),
            Cell(f"{s.n_total:,}"),
            Cell(f"{s.n:,}"),
            Cell(s.detector),
            Cell(percent(s.full, 2)),
            Cell(percent(s.mean, 2)),
            Cell(_signed(100 * s.bias)),
            Cell(percent(s.std, 2)),
            Cell(percent(s.se, 2)),
            Cell(f"{s.spearman:.3f}" if s.spearman == s.spearman else MISSING),
        ]
        body.append(tuple(line))
    columns = (("model",) if multi_model else ()) + (
        "OOD dataset",
        "N",
        "n",
        "best detector",
        "full",
        "mean",
        "bias",
        "std",
        "SE",
        "mean ρ",
    )
    draws = sorted({s.draws for s in summaries})
    notes = [
        f"FPR@95 (%) of the best detector on the full set, over {'/'.join(map(str, draws))} draws of n OOD images "
        "without replacement (ID threshold fixed). SE = √(p(1−p)/n)·√((N−n)/(N−1)); "
        "mean ρ: Spearman correlation of all detectors' ranking per draw with the full-set ranking."
    ]
    for sp in spreads:
        notes.append(
            f"{sp.model}: spread of the best FPR@95 across {len(sp.datasets)} OOD sets = {100 * sp.spread:.2f} pp "
            f"(range {100 * sp.range:.2f} pp) vs mean sampling std {100 * sp.sampling_std:.2f} pp at n={sp.n}: "
            f"ratio {sp.ratio:.1f}."
        )
    align = ("l",) * (2 if multi_model else 1) + ("r", "r", "l") + ("r",) * 6
    return Table(
        "tableA6",
        "FPR@95 on random subsets of the OOD sets (paper Table A6)",
        columns,
        tuple(body),
        align=align,
        notes=tuple(notes),
    )


def table_detectors(
    rows: Sequence[ResultRow],
    model: str,
    id_dataset: str | None = None,
    ood_datasets: Sequence[str] | None = None,
    *,
    convention: str | None = None,
    aupr: bool = False,
) -> Table:
    """One model's detectors × OOD sets (the core `detector_table`), for a model of a multi-model result set."""
    supervised = supervised_rows(rows)
    grid = ResultGrid(supervised)
    pair = grid.model_pair(model, id_dataset)
    oods = [o for o in _select(grid.oods, ood_datasets, "OOD datasets") if o in grid.values[pair]]
    detectors = [d for d in grid.detectors if any(d in grid.values[pair][o] for o in oods)]
    selected = [r for r in supervised if (r.model, r.id_dataset) == pair and r.ood_dataset in oods]
    return detector_table(
        selected,
        detectors,
        oods,
        key=f"detectors-{model}",
        title=f"{grid.label(pair)}: detectors × OOD sets",
        convention=convention,
        aupr=aupr,
    )


def _flat_bootstrap_note(records: Sequence[IntervalRecord]) -> str | None:
    """Why a bootstrap FPR@95 interval of zero width sits beside a wider Wilson one (None when no row has one)."""
    flat = []
    for r in records:
        wilson = r.intervals.get("fpr95/wilson")
        boots = [r.intervals.get(f"fpr95/{m}") for m in ("percentile", "bca")]
        # Only at an estimate of 0 or 100 % does every resample agree: no OOD image (or every one) is accepted.
        at_edge = wilson is not None and wilson.estimate in (0.0, 1.0)
        if at_edge and wilson.high > wilson.low and any(b and b.high == b.low for b in boots):
            flat.append((r, wilson))
    if not flat:
        return None
    r, wilson = flat[0]
    if wilson.estimate == 0.0:
        edge, unseen, end = "0 %", "a few accepted images", f"upper end {percent(wilson.high)} %"
    else:
        edge, unseen, end = "100 %", "a few rejected images", f"lower end {percent(wilson.low)} %"
    rows = ", ".join(f"{x.ood_dataset}/{x.detector}" for x, _ in flat[:3]) + (", …" if len(flat) > 3 else "")
    return (
        f"A bootstrap FPR@95 interval of zero width beside a wider Wilson interval ({rows}): the estimate is {edge}, "
        "so every bootstrap resample of the images gives the same rate and the bootstrap has no spread to show; it "
        "can only re-weigh what was observed. Wilson's interval asks which true rates could have produced the "
        f"observed count, and {unseen} in a set of this size cannot be ruled out ({r.ood_dataset}/{r.detector}: "
        f"{r.n_ood} OOD images, {end}). Read these rows by Wilson or Clopper–Pearson."
    )


def table_intervals(
    records: Sequence[IntervalRecord],
    confidence: float = 0.95,
    *,
    title: str = "Confidence intervals per OOD set and detector",
) -> Table:
    """Point estimates with confidence intervals (FPR@95: Wilson, Clopper–Pearson, bootstrap; AUROC: DeLong, bootstrap)."""
    if not records:
        raise AnalysisError("no interval records to tabulate")
    methods = [
        ("fpr95", "wilson", "Wilson"),
        ("fpr95", "clopper-pearson", "Clopper–Pearson"),
        ("fpr95", "percentile", "bootstrap"),
        ("fpr95", "bca", "BCa"),
        ("auroc", "delong", "DeLong"),
        ("auroc", "percentile", "bootstrap"),
        ("auroc", "bca", "BCa"),
    ]
    methods = [m for m in methods if any(f"{m[0]}/{m[1]}" in r.intervals for r in records)]
    multi_model = len({r.model for r in records}) > 1
    body = []
    for r in records:
        line = ([Cell(r.model)] if multi_model else []) + [Cell(r.ood_dataset), Cell(r.detector)]
        for metric in ("fpr95", "auroc"):
            estimate = next((iv.estimate for k, iv in r.intervals.items() if k.startswith(metric + "/")), None)
            if any(m[0] == metric for m in methods):
                line.append(Cell(percent(estimate)))
            for m_metric, method, _ in methods:
                if m_metric != metric:
                    continue
                iv = r.intervals.get(f"{metric}/{method}")
                line.append(Cell(f"[{percent(iv.low)}, {percent(iv.high)}]") if iv else Cell(MISSING))
        body.append(tuple(line))
    lead = (["model"] if multi_model else []) + ["OOD dataset", "detector"]
    columns, groups = list(lead), [("", len(lead))]
    for metric, heading in (("fpr95", "FPR@95"), ("auroc", "AUROC")):
        names = [label for m, _, label in methods if m == metric]
        if names:
            columns += ["estimate"] + names
            groups.append((heading, len(names) + 1))
    note = (
        f"{100 * confidence:g}% intervals (%). Wilson and Clopper–Pearson hold the ID threshold fixed; the bootstrap "
        "resamples ID and OOD images (percentile and BCa); DeLong is the normal approximation of the AUROC U-statistic."
    )
    align = ("l",) * len(lead) + ("r",) * (len(columns) - len(lead))
    flat = _flat_bootstrap_note(records)
    return Table(
        "intervals", title, tuple(columns), tuple(body), tuple(groups), align, (note,) + ((flat,) if flat else ())
    )


def table_class_acceptance(
    rows: Sequence[ClassAcceptance], *, key: str = "classes", title: str = "Acceptance per OOD class", limit: int = 30
) -> Table:
    """Per OOD class: images, accepted as ID, rate and Wilson interval (%), most accepted first (the first `limit`)."""
    if not rows:
        raise AnalysisError("no OOD classes to tabulate")
    shown = list(rows)[:limit]
    body = tuple(
        (
            Cell(r.name),
            Cell(f"{r.n:,}"),
            Cell(f"{r.accepted:,}"),
            Cell(percent(r.rate)),
            Cell(f"[{percent(r.low)}, {percent(r.high)}]"),
        )
        for r in shown
    )
    notes = ["Rate and 95% Wilson interval in %; the threshold accepts 95% of the ID test images."]
    if len(rows) > limit:
        notes.append(f"The {limit} most accepted of {len(rows)} classes.")
    return Table(
        key,
        title,
        ("OOD class", "images", "accepted", "rate", "95% CI"),
        body,
        align=("l", "r", "r", "r", "r"),
        notes=tuple(notes),
    )


# DeLong's z and p when neither AUROC varies over the images (see `oodbench.analysis.delong.delong_test`).
UNDEFINED = "undefined"


def format_p(p: float) -> str:
    """A p-value at the precision of the table's other numbers: three decimals, "< 0.001" below that, and
    "undefined" for NaN (a test that has no variance to compare the difference with)."""
    if p != p:
        return UNDEFINED
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def table_delong(results: Sequence[tuple[str, str, DeLongResult]], confidence: float = 0.95) -> Table:
    """Paired DeLong comparisons: (model, OOD set, DeLongResult) per line."""
    if not results:
        raise AnalysisError("no comparisons to tabulate")
    multi_model = len({m for m, _, _ in results}) > 1
    body = []
    for model, ood, r in results:
        significant = r.p_value < 1 - confidence
        line = ([Cell(model)] if multi_model else []) + [
            Cell(ood),
            Cell(r.detector_a),
            Cell(r.detector_b),
            Cell(percent(r.auroc_a, 2)),
            Cell(percent(r.auroc_b, 2)),
            Cell(_signed(100 * r.difference)),
            Cell(f"[{_signed(100 * r.low)}, {_signed(100 * r.high)}]"),
            Cell(UNDEFINED if r.z != r.z else f"{r.z:.2f}".replace("-", "−")),
            Cell(format_p(r.p_value), bold=significant),
        ]
        body.append(tuple(line))
    columns = (("model",) if multi_model else ()) + (
        "OOD dataset",
        "A",
        "B",
        "AUROC A",
        "AUROC B",
        "A − B",
        f"{100 * confidence:g}% CI",
        "z",
        "p",
    )
    align = ("l",) * (4 if multi_model else 3) + ("r",) * 6
    notes = [f"DeLong's paired test on the same ID and OOD images; p < {1 - confidence:.2g} in bold. AUROC in %."]
    if any(r.p_value != r.p_value for _, _, r in results):
        notes.append(
            f"z and p {UNDEFINED}: neither AUROC varies over the images (both separate them perfectly, e.g. two "
            "AUROCs of 100%), so the test has no variance to weigh the difference against."
        )
    return Table("delong", "Paired AUROC comparisons (DeLong)", columns, tuple(body), align=align, notes=tuple(notes))
