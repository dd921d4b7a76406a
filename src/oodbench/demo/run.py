"""The demo's main job: prepare the store, evaluate every detector, write results and a report."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..evaluation.evaluate import EvaluationResult, evaluate_store
from ..util.atomic import atomic_write_text
from ..util.progress import console
from . import DemoSetup, demo_detector_params, prepare


@dataclass
class DemoResult:
    """What the demo produced."""

    setup: DemoSetup
    evaluation: EvaluationResult
    report_path: Path
    html_path: Path | None
    battery: Any = None


def run_demo(out: str | os.PathLike[str] = "oodbench-demo", seed: int = 0, *, progress: bool = True) -> DemoResult:
    """Run the whole demo under `out`: store, evaluation run directory, Markdown (and HTML) report."""
    out = Path(out)
    setup = prepare(out, seed, verbose=progress)
    fit_meta = setup.store.meta(setup.model_id, setup.fit_dataset)
    fit_size, num_features = fit_meta["num_rows"], fit_meta["arrays"]["features"]["shape"][1]
    num_classes = fit_meta["arrays"]["logits"]["shape"][1]
    run_dir = out / "run"
    evaluation = evaluate_store(
        setup.store,
        setup.model_id,
        setup.fit_dataset,
        setup.id_dataset,
        list(setup.ood_datasets),
        demo_detector_params(fit_size, num_features, num_classes),
        out_dir=run_dir,
        progress=progress,
    )
    battery = _audit_battery(setup, out / "audit", progress)
    report_path = out / "report.md"
    atomic_write_text(report_path, _markdown_report(setup, evaluation, battery))
    html_path = _html_report(run_dir, out / "report.html", _context(setup, battery))
    return DemoResult(setup, evaluation, report_path, html_path, battery)


def _audit_battery(setup: DemoSetup, out: Path, progress: bool) -> Any:
    """The controlled leak battery on the demo model (leaked and clean splits with known answers)."""
    from ..audit.battery import battery_from_store, run_battery
    from ..audit.config import AuditConfig
    from ..audit.render import use_html_renderer
    from ..audit.report import battery_document, write_document
    from ..report.html_report import render_audit_html

    use_html_renderer(render_audit_html)
    from . import EXTRA_SETS

    config = AuditConfig()
    # Trained digits 0-5, never-learned digits 6-9 (fit-only leaks), the far sets.
    splits = battery_from_store(
        setup.store,
        setup.model_id,
        setup.fit_dataset,
        setup.id_dataset,
        extra_train=EXTRA_SETS[0],
        extra_test="digits-6to9",
        far=[d for d in setup.ood_datasets if d != "digits-6to9"],
        config=config,
    )
    result = run_battery(splits, config, progress=progress)
    document = battery_document(
        result, config, f"the digits demo ({setup.store.root})", f"oodbench audit battery: {setup.model_id}"
    )
    write_document(document, out, "battery")
    return result


def _html_report(run_dir: Path, path: Path, intro: tuple[Any, ...] = ()) -> Path | None:
    """The self-contained HTML report, when the report package provides it, opening with the demo's context."""
    try:
        from ..report.html_report import write_html_report
    except ImportError:
        return None
    write_html_report(run_dir, path, intro=intro)
    return path


def _context(setup: DemoSetup, battery: Any) -> tuple[Any, ...]:
    """What report.md says before the results, for the HTML report: the model, the datasets, the audit battery."""
    from ..core.tabular import Cell, Table

    info, sizes = setup.info, setup.info.get("sizes", {})
    roles = [
        (setup.fit_dataset, "fit (train split, digits 0-5)"),
        (setup.id_dataset, "ID test (test split, digits 0-5)"),
        ("digits-6to9", "near-OOD (test split, digits 6-9)"),
        ("lfw-faces", "far-OOD (scikit-image LFW subset, resized)"),
        ("noise", "far-OOD (uniform noise)"),
    ]
    datasets = Table(
        "demo-datasets",
        "The demo's datasets",
        ("set", "role", "images"),
        tuple((Cell(name), Cell(role), Cell(str(sizes.get(name, "?")))) for name, role in roles),
        align=("l", "l", "r"),
    )
    leaked = sum(a.meta["kind"] == "leaked" for a in battery.audits)
    return (
        "A small CNN trained on the CPU on scikit-learn's digits 0-5 (real 8x8 scans); ID test accuracy "
        f"{100 * info.get('test_accuracy', float('nan')):.1f}%.",
        f"Leak audit battery: {leaked} leaked and {len(battery.audits) - leaked} clean splits of the digits model with "
        f"known answers: sensitivity {battery.sensitivity:.2f}, specificity {battery.specificity:.2f} (the firing rule "
        f"alone: {battery.rule_sensitivity:.2f} / {battery.rule_specificity:.2f}); per-split verdicts in "
        "audit/battery.md.",
        datasets,
    )


def _markdown_report(setup: DemoSetup, evaluation: EvaluationResult, battery: Any) -> str:
    info = setup.info
    sizes = info.get("sizes", {})
    lines = [
        "# oodbench demo report",
        "",
        "A small CNN trained on the CPU on scikit-learn's digits 0-5 (real 8x8 scans); "
        f"ID test accuracy **{100 * info.get('test_accuracy', float('nan')):.1f}%**.",
        "",
        "| set | role | images |",
        "|---|---|---:|",
        f"| {setup.fit_dataset} | fit (train split, digits 0-5) | {sizes.get(setup.fit_dataset, '?')} |",
        f"| {setup.id_dataset} | ID test (test split, digits 0-5) | {sizes.get(setup.id_dataset, '?')} |",
        f"| digits-6to9 | near-OOD (test split, digits 6-9) | {sizes.get('digits-6to9', '?')} |",
        f"| lfw-faces | far-OOD (scikit-image LFW subset, resized) | {sizes.get('lfw-faces', '?')} |",
        f"| noise | far-OOD (uniform noise) | {sizes.get('noise', '?')} |",
        "",
        evaluation.table_markdown,  # its own note says what the cells are
    ]
    if evaluation.skipped:
        lines += ["Skipped detectors (requirements not met by the demo's arrays):", ""]
        lines += [f"- `{name}`: {reason}" for name, reason in evaluation.skipped.items()]
        lines.append("")
    leaked = sum(a.meta["kind"] == "leaked" for a in battery.audits)
    lines += [
        "## Leak audit battery",
        "",
        f"{leaked} leaked and {len(battery.audits) - leaked} clean splits of the digits model with known answers: "
        f"sensitivity **{battery.sensitivity:.2f}**, specificity **{battery.specificity:.2f}** "
        f"(the firing rule alone: {battery.rule_sensitivity:.2f} / {battery.rule_specificity:.2f}). "
        "Per-split verdicts: `audit/battery.md`.",
        "",
        battery.scope_statement(),
        "",
        f"The numbers depend on the seed and on what trained the CNN: torch {info.get('torch', '?')}, CPU kernels "
        f"for {info.get('cpu_capability', '?')}, {info.get('train_threads', '?')} threads (pinned); another torch "
        "build or instruction set rounds differently and can move a borderline battery verdict.",
        "",
        "Results (tidy rows): `run/results.parquet`; per-image scores: `run/scores/`; HTML report: `report.html`.",
        "",
    ]
    return "\n".join(lines)


def plugin_note(setup: DemoSetup) -> str | None:
    """The line under the demo's table naming installed plugin detectors (the table holds the built-in set only)."""
    from .. import detectors

    plugins = [name for name in detectors.available() if not detectors.origin(name).builtin]
    if not plugins:
        return None
    names = ",".join(plugins)
    command = (
        f"oodbench evaluate --store {setup.store.root} --model {setup.model_id} --fit {setup.fit_dataset} "
        f"--id {setup.id_dataset} {' '.join(f'--ood {o}' for o in setup.ood_datasets)} -d {names} "
        f"--out {setup.root / 'plugins'}"
    )
    which = "plugin detector" + ("s" if len(plugins) > 1 else "")
    return f"not in this table (the built-in set): installed {which} {', '.join(plugins)}; evaluate on the demo's store: {command}"


def print_summary(result: DemoResult) -> None:
    """Print the table, a line naming installed plugin detectors (not in the table), and where the outputs went."""
    sys.stdout.write(result.evaluation.table_markdown)
    sys.stdout.flush()
    note = plugin_note(result.setup)
    if note is not None:
        console.print(note, soft_wrap=True, highlight=False, markup=False)
    battery = result.battery
    console.print(
        f"leak audit battery: sensitivity {battery.sensitivity:.2f}, specificity {battery.specificity:.2f} "
        f"over {len(battery.audits)} splits (details: {result.setup.root / 'audit' / 'battery.md'})"
    )
    console.print(f"report: {result.report_path}" + (f" and {result.html_path}" if result.html_path else ""))
