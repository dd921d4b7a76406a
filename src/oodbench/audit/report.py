"""Audit reports: renderer-neutral tables per split, battery and suite scan, written as Markdown (and HTML when
the report package's machinery is installed) plus the full numbers as JSON."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.tabular import MISSING, Cell, Table, render_markdown
from ..util.atomic import atomic_write_text
from .battery import CLEAN_KIND, LEAKED, BatteryResult
from .config import AuditConfig
from .render import html_renderer
from .scan import RELATIONS, SuiteScan, suite_scope
from .split import SplitAudit
from .suites import SuiteManifest

__all__ = [
    "AuditDocument",
    "split_sections",
    "battery_sections",
    "battery_document",
    "scan_sections",
    "definitions_text",
    "write_document",
]


def _f(value: float | None, digits: int = 3) -> str:
    return MISSING if value is None or value != value else f"{value:.{digits}f}"


@dataclass
class DocSection:
    """A titled part of an audit report: paragraphs, then tables."""

    key: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


@dataclass
class AuditDocument:
    """A whole audit report: title, sections, and the JSON payload written beside it."""

    title: str
    sections: list[DocSection]
    payload: dict[str, Any]
    subject: str = ""

    def markdown(self) -> str:
        """The report as GitHub-flavoured Markdown."""
        lines = [f"# {self.title}", ""]
        if self.subject:
            lines += [self.subject, ""]
        for section in self.sections:
            lines += [f"## {section.title}", ""]
            for paragraph in section.paragraphs:
                lines += [paragraph, ""]
            for table in section.tables:
                lines += [render_markdown(table), ""]
        return "\n".join(lines).rstrip() + "\n"

    def html(self) -> str | None:
        """The report as one self-contained HTML page, or None when no renderer was handed in (see `audit.render`)."""
        renderer = html_renderer()
        if renderer is None:
            return None
        sections = [(s.key, s.title, "\n\n".join(s.paragraphs), list(s.tables)) for s in self.sections]
        return renderer(self.title, sections, self.subject or "audit")


def definitions_text(config: AuditConfig) -> str:
    """One paragraph stating the rule and thresholds the verdicts used."""
    identity = (
        ""
        if config.identity_threshold is None
        else f" A recovery whose OOD set is linearly separable from the excluded fit data "
        f"(OracleLDA >= {config.identity_threshold:.2f}) is inconclusive."
    )
    return (
        f"Firing rule: out-of-fold OracleLDA ({config.folds}-fold, shrinkage LDA) >= {config.oracle_threshold:.2f} and "
        f"best unsupervised pool AUROC < {config.collapse_threshold:.2f}. Contrast: refit the pool without the suspect "
        f"data; recovery means best AUROC >= {config.recovery_threshold:.2f} (collapse + {config.recovery_margin:.2f}). "
        "When the suspects are found automatically (by proximity), a recovery is a leak only if the OOD images are "
        "indistinguishable from the nearest excluded class's own fit rows: their OracleLDA must not exceed the mean + "
        f"{config.identity_null_z:g} sd of {config.identity_permutations} label permutations (else hard-clean: a close "
        "neighbour was excluded). "
        "Verdicts: leak = fires and recovers; hard-clean = fires, no recovery; clean = does not fire; "
        f"inconclusive = partial recovery, no contrast, or the oracle's fold range straddling its threshold.{identity} "
        "Logit-based AUROCs (†) depend on the head and are reported beside the rule, never in it."
    )


def split_sections(
    audits: Sequence[SplitAudit], config: AuditConfig, *, prefix: str = "splits", definitions: bool = True
) -> list[DocSection]:
    """Fingerprint, pool, contrast and leave-class-out tables for a list of split audits.

    `definitions=False` leaves out the rule's paragraph, for documents that state it before these sections.
    """
    if not audits:
        return []
    fp_rows = []
    for a in audits:
        fp = a.fingerprint
        overlap = a.overlap
        fp_rows.append(
            (
                Cell(a.name),
                Cell(_f(fp.oracle.auroc), note=f"±{fp.oracle.std:.3f}, {_f(fp.oracle.low)}–{_f(fp.oracle.high)}"),
                Cell(_f(fp.best_auroc), note=fp.best_detector),
                Cell("yes" if fp.fires else "no", bold=fp.fires),
                Cell(
                    MISSING if overlap is None else _f(overlap.value),
                    note="" if overlap is None else f"{overlap.relative:.2f}× chance",
                ),
                Cell(a.verdict.label, bold=a.verdict.label == "leak"),
            )
        )
    fingerprint_table = Table(
        f"{prefix}-fingerprint",
        "Fingerprint per split",
        ("split", "OracleLDA (out-of-fold)", "best unsupervised AUROC", "fires", f"L_{config.overlap_k}", "verdict"),
        tuple(fp_rows),
        align=("l", "r", "r", "l", "r", "l"),
        notes=(
            f"n per split: fit/ID/OOD rows are in the JSON payload; L_k with k={config.overlap_k} "
            "on ID test ∪ OOD (0 = separated, chance = fully mixed).",
        ),
    )
    pool_names = sorted({n for a in audits for n in a.fingerprint.pool_aurocs})
    logit_names = sorted({n for a in audits for n in a.fingerprint.logit_aurocs})
    pool_rows = []
    for a in audits:
        fp = a.fingerprint
        cells = [Cell(a.name)]
        cells += [Cell(_f(fp.pool_aurocs.get(n)), bold=n == fp.best_detector) for n in pool_names]
        cells += [Cell(_f(fp.logit_aurocs.get(n))) for n in logit_names]
        pool_rows.append(tuple(cells))
    skipped = sorted({f"{k}: {v}" for a in audits for k, v in a.fingerprint.pool_skipped.items()})
    pool_table = Table(
        f"{prefix}-pool",
        "AUROC of every pool detector (bold: best) and of the head-dependent logit detectors (†)",
        ("split", *pool_names, *(f"{n} †" for n in logit_names)),
        tuple(pool_rows),
        notes=tuple(
            ["† head-dependent: reported beside the rule, never part of it."]
            + ([f"pool members not used: {'; '.join(skipped)}"] if skipped else [])
        ),
    )
    sections = [
        DocSection(
            f"{prefix}-fingerprint",
            "Fingerprint",
            [definitions_text(config)] if definitions else [],
            [fingerprint_table, pool_table],
        )
    ]
    contrasted = [a for a in audits if a.contrast is not None]
    if contrasted:
        rows = []
        for a in contrasted:
            c = a.contrast
            what = (
                ", ".join(f"{s} ({c.suspect_shares[s]:.0%})" if s in c.suspect_shares else str(s) for s in c.suspects)
                if c.mode == "label"
                else "nearest fit rows"
            )
            rows.append(
                (
                    Cell(a.name),
                    Cell(c.mode),
                    Cell(what, note="auto" if c.suspects_auto else ""),
                    Cell(str(c.removed_rows)),
                    Cell(_f(c.best_before)),
                    Cell(_f(c.best_after), note=c.best_after_detector),
                    Cell(
                        "yes"
                        if c.recovered
                        else "partial"
                        if c.partial
                        else "n/a (not collapsed)"
                        if c.best_before >= config.collapse_threshold
                        else "no",
                        bold=c.recovered,
                    ),
                    Cell(MISSING if c.identity is None else _f(c.identity.auroc)),
                )
            )
        contrast_table = Table(
            f"{prefix}-contrast",
            "Fit-set-exclusion contrast",
            (
                "split",
                "mode",
                "excluded",
                "fit rows removed",
                "best before",
                "best after",
                "recovered",
                "OOD vs excluded fit data (OracleLDA)",
            ),
            tuple(rows),
            align=("l", "l", "l", "r", "r", "r", "l", "r"),
            notes=(
                f"Recovery: best AUROC after refitting >= {config.recovery_threshold:.2f}. The last column reads "
                "the OOD images against the excluded classes' own fit rows out-of-fold: ≈0.5 (or below: the "
                "negative bias of cross-validation under the null) means indistinguishable, ≈1 a distinct class.",
            ),
        )
        sections.append(DocSection(f"{prefix}-contrast", "Exclusion contrast", [], [contrast_table]))
    lco = [a for a in audits if a.leave_class_out is not None]
    if lco:
        names = sorted({n for a in lco for n in (*a.leave_class_out.before, *a.leave_class_out.after)})
        rows = []
        for a in lco:
            r = a.leave_class_out
            cells = [
                Cell(a.name),
                Cell(", ".join(map(str, r.excluded))),
                Cell(_f(r.probe_accuracy)),
                Cell(str(r.probe_rows)),
            ]
            cells += [Cell(f"{_f(r.before.get(n))} → {_f(r.after.get(n))}") for n in names]
            rows.append(tuple(cells))
        lco_table = Table(
            f"{prefix}-lco",
            "Leave-class-out head retraining (cached features): logit-detector AUROC, original → retrained head",
            ("split", "excluded", "probe accuracy (ID test)", "probe rows", *names),
            tuple(rows),
            align=("l", "l", "r", "r", *("r",) * len(names)),
        )
        sections.append(DocSection(f"{prefix}-lco", "Leave-class-out", [], [lco_table]))
    reasons = [
        f"- **{a.name}: {a.verdict.label}**. " + " ".join(r.rstrip(".") + "." for r in a.verdict.reasons)
        for a in audits
    ]
    sections.append(DocSection(f"{prefix}-verdicts", "Verdicts", ["\n".join(reasons)]))
    return sections


def battery_sections(result: BatteryResult) -> list[DocSection]:
    """Summary, per-split verdicts and the scope statement of a battery."""
    leaked = [a for a in result.audits if a.meta.get("kind") == LEAKED]
    clean = [a for a in result.audits if a.meta.get("kind") == CLEAN_KIND]
    summary = Table(
        "battery-summary",
        "Sensitivity and specificity",
        ("", "sensitivity (leaks caught)", "specificity (clean spared)"),
        (
            (Cell("firing rule alone"), Cell(_f(result.rule_sensitivity)), Cell(_f(result.rule_specificity))),
            (
                Cell("rule + contrast, suspects found automatically"),
                Cell(_f(result.sensitivity)),
                Cell(_f(result.specificity)),
            ),
            (
                Cell("rule + contrast, designated class excluded"),
                Cell(_f(result.designated_sensitivity)),
                Cell(_f(result.designated_specificity)),
            ),
        ),
        notes=(
            f"{len(leaked)} leaked and {len(clean)} clean splits. Adjudicated sensitivity counts only 'leak' "
            "verdicts; specificity counts every verdict but 'leak'. The automatic path finds the suspect classes by "
            "proximity and requires the OOD images to be indistinguishable from the excluded class (identity reading "
            "within its permutation null); the designated path excludes the class the benchmark designates.",
        ),
    )
    counts = Table(
        "battery-counts",
        "Verdicts by ground truth",
        ("truth", "leak", "hard-clean", "clean", "inconclusive"),
        tuple(
            (
                Cell(kind),
                *(
                    Cell(str(result.counts.get(kind, {}).get(v, 0)))
                    for v in ("leak", "hard-clean", "clean", "inconclusive")
                ),
            )
            for kind in (LEAKED, CLEAN_KIND)
        ),
    )
    rows = []
    for a in result.audits:
        fp = a.fingerprint
        truth = a.meta.get("kind")
        right = (truth == LEAKED) == (a.verdict.label == "leak")
        rows.append(
            (
                Cell(a.name),
                Cell(str(truth)),
                Cell(_f(fp.oracle.auroc)),
                Cell(_f(fp.best_auroc), note=fp.best_detector),
                Cell("yes" if fp.fires else "no"),
                Cell(MISSING if a.contrast is None else _f(a.contrast.best_after)),
                Cell(_identity_cell(a)),
                Cell(a.verdict.label, bold=not right),
                Cell(result.designated_label(a), bold=(truth == LEAKED) != (result.designated_label(a) == "leak")),
            )
        )
    per_split = Table(
        "battery-splits",
        "Per-split verdicts (bold: verdict disagrees with the truth)",
        (
            "split",
            "truth",
            "OracleLDA",
            "best unsupervised",
            "fires",
            "best after exclusion",
            "identity (limit)",
            "verdict (automatic)",
            "verdict (designated)",
        ),
        tuple(rows),
        align=("l", "l", "r", "r", "l", "r", "r", "l", "l"),
    )
    return [
        DocSection("battery", "Controlled battery", [definitions_text(result.config)], [summary, counts, per_split]),
        DocSection("battery-scope", "Scope: where the rule held", [result.scope_statement()]),
    ]


def _identity_cell(audit: SplitAudit) -> str:
    """The automatic contrast's identity reading and, when computed, its permutation-null limit."""
    contrast = audit.contrast
    if contrast is None or contrast.identity is None:
        return MISSING
    limit = "" if contrast.identity_limit is None else f" ({_f(contrast.identity_limit)})"
    return _f(contrast.identity.auroc) + limit


def battery_document(result: BatteryResult, config: AuditConfig, subject: str, title: str) -> AuditDocument:
    """The battery's report document (summary, per-split details), ready for `write_document`."""
    return AuditDocument(
        title,
        # The battery section states the rule once; the per-split details do not repeat it.
        battery_sections(result) + split_sections(result.audits, config, prefix="battery-detail", definitions=False),
        result.to_dict(),
        subject=subject,
    )


def scan_sections(
    scans: Sequence[SuiteScan], suites: Sequence[SuiteManifest], *, details: bool = False
) -> list[DocSection]:
    """Overlap of each suite's OOD classes with each label space, the suite-level scope, and the sources."""
    spaces = list(dict.fromkeys(s.label_space for s in scans))
    by_key = {(s.suite, s.label_space): s for s in scans}
    scope = suite_scope(scans, *(spaces[:2] if len(spaces) >= 2 else (spaces[0], "imagenet-21k")))
    rows = []
    for suite in suites:
        cells = [Cell(suite.name), Cell(str(suite.num_classes) if suite.available else MISSING)]
        for space in spaces:
            scan = by_key.get((suite.name, space))
            if scan is None or not scan.available:
                cells += [Cell(MISSING)] * 4 + [Cell("no class list")]
                continue
            cells += [Cell(str(scan.count(r))) for r in ("exact", "hyponym", "hypernym", "lemma")]
            cells.append(Cell(scan.verdict, bold=scan.verdict == "leaks"))
        cells.append(Cell(scope.get(suite.name, "")))
        rows.append(tuple(cells))
    groups = (("", 2), *((space, 5) for space in spaces), ("", 1))
    columns = (
        "suite",
        "OOD classes",
        *[c for _ in spaces for c in ("exact", "hyponym", "hypernym", "lemma", "verdict")],
        "scope",
    )
    table = Table(
        "scan",
        "OOD classes of published suites against training label spaces (WordNet 3.0)",
        columns,
        tuple(rows),
        groups=groups,
        align=("l", "r", *[a for _ in spaces for a in ("r", "r", "r", "r", "l")], "l"),
        notes=(
            "exact: the OOD class is a training class; hyponym: it is a kind of one; hypernym: a training class is "
            "a kind of it; lemma: a shared name without taxonomic link. Each OOD class is counted once, under its "
            "strongest relation.",
        ),
    )
    sources = Table(
        "scan-sources",
        "Where each class list comes from",
        ("suite", "paper", "source", "licence"),
        tuple(
            (
                Cell(s.name),
                Cell(s.paper),
                Cell(
                    f"{s.source.get('repository', '')} @ {str(s.source.get('commit', ''))[:12]} : {s.source.get('path', '')}"
                ),
                Cell(str(s.source.get("licence", ""))),
            )
            for s in suites
        ),
        align=("l", "l", "l", "l"),
    )
    sections = [DocSection("scan", "Class-list scan", [], [table])]
    notes = [f"**{s.name}**: {s.notes}" for s in suites if s.notes]
    sections.append(DocSection("scan-sources", "Sources", notes, [sources]))
    if details:
        for scan in scans:
            # Classes with a relation, and those whose authors' annotation relates (shown as evidence only).
            found = [f for f in scan.findings if f.relation != "none" or f.evidence]
            if not found:
                continue
            detail_rows = tuple(
                (
                    Cell(f.name, note=f.ood if f.ood != f.name else ""),
                    Cell(f.relation),
                    Cell(str(f.distance) if f.distance else ""),
                    Cell(", ".join(f.matches[:6]) + (" …" if len(f.matches) > 6 else "")),
                    Cell(f.via if f.relation != "none" else ""),
                    Cell("; ".join(f.evidence)),
                )
                for f in sorted(found, key=lambda f: (RELATIONS.index(f.relation), f.name))
            )
            sections.append(
                DocSection(
                    f"scan-{scan.suite}-{scan.label_space}",
                    f"{scan.suite} vs {scan.label_space}",
                    [],
                    [
                        Table(
                            f"scan-{scan.suite}-{scan.label_space}",
                            f"{scan.suite}: related OOD classes",
                            (
                                "OOD class",
                                "relation",
                                "links",
                                f"{scan.label_space} classes",
                                "via",
                                "authors' annotation (its own relation)",
                            ),
                            detail_rows,
                            align=("l", "l", "r", "l", "l", "l"),
                        )
                    ],
                )
            )
    return sections


def write_document(document: AuditDocument, out_dir: str | os.PathLike[str], stem: str) -> dict[str, Path]:
    """Write `<stem>.md`, `<stem>.json` and (when renderable) `<stem>.html` under `out_dir`; returns the paths."""
    out = Path(out_dir)
    paths = {"markdown": out / f"{stem}.md", "json": out / f"{stem}.json"}
    atomic_write_text(paths["markdown"], document.markdown())
    atomic_write_text(
        paths["json"], json.dumps(document.payload, indent=2, sort_keys=True, default=_json_default) + "\n"
    )
    html = document.html()
    if html is not None:
        paths["html"] = out / f"{stem}.html"
        atomic_write_text(paths["html"], html)
    return paths


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)
