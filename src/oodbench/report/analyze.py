"""`oodbench analyze …`: subsampling study, confidence intervals and paired DeLong tests on an evaluation run.

The statistics are `oodbench.analysis`'s; this command renders them with the report's tables and figures, so it
lives in the report package (analysis never imports report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..util.atomic import atomic_write_json

app = typer.Typer(
    help="Statistics on an evaluation run directory: subsampling (Table A6), confidence intervals, "
    "DeLong's paired test.",
    no_args_is_help=True,
)

RunDir = Annotated[Path, typer.Argument(help="Evaluation run directory (written by `oodbench evaluate --out DIR`).")]
Datasets = Annotated[list[str] | None, typer.Option("--dataset", help="Only these OOD datasets (repeatable).")]
Detectors = Annotated[list[str] | None, typer.Option("--detector", help="Only these detectors (repeatable).")]
Quiet = Annotated[bool, typer.Option("--no-progress/--progress", "--quiet", help="Hide the progress bar.")]
Convention = Annotated[
    str,
    typer.Option(
        "--convention", help="Metric convention: oodbench (ID positive) or openood (OOD-positive FPR@95, as OpenOOD)."
    ),
]

SubsetSizes = Annotated[
    list[str] | None,
    typer.Option(
        "--n",
        help="Subset size(s); 'auto' = 655 capped at half the smallest "
        "OOD set. Several --n give one table each and the Fig. A4 curve.",
    ),
]


def _convention(convention: str) -> str:
    from ..core.metrics import CONVENTIONS

    if convention not in CONVENTIONS:
        raise typer.BadParameter(f"--convention: must be one of {', '.join(CONVENTIONS)}; got {convention!r}")
    return convention


FIGURE_FORMATS = ("png", "pdf", "svg")  # what report.figures.save_figure writes


def _figure_format(figure: Path | None) -> str | None:
    """--figure's format, from its suffix (none: png); a BadParameter before any work when it is not one drawn."""
    if figure is None:
        return None
    fmt = figure.suffix.lstrip(".").lower() or "png"
    if fmt not in FIGURE_FORMATS:
        raise typer.BadParameter(f"--figure {figure}: unsupported format {fmt!r}; end it in .png, .pdf or .svg")
    from ..util.atomic import unwritable

    problem = unwritable(figure.parent)
    if problem is not None:
        raise typer.BadParameter(f"--figure {figure}: {problem}")
    return fmt


def _write_json(target: Path, payload: dict[str, object]) -> None:
    atomic_write_json(target, payload)
    typer.echo(f"wrote {target}", err=True)


@app.command("subsample")
def subsample_command(
    run_dir: RunDir,
    n: SubsetSizes = None,
    draws: Annotated[int, typer.Option(help="Draws per subset size (R).")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    tpr: Annotated[float, typer.Option(help="ID acceptance rate of the threshold.")] = 0.95,
    dataset: Datasets = None,
    detector: Detectors = None,
    out: Annotated[Path | None, typer.Option(help="JSON output (default RUN_DIR/analysis/subsample.json).")] = None,
    figure: Annotated[
        Path | None, typer.Option(help="Also draw Fig. A4 over the --n list (.png, .pdf or .svg).")
    ] = None,
    quiet: Quiet = False,
    convention: Convention = "oodbench",
) -> None:
    """Subsampling study: the best detector's FPR@95 over R draws of n OOD images (Table A6), plus spread vs noise.

    Example: oodbench analyze subsample runs/resnet50 --n 655 --draws 1000
    """
    if _convention(convention) != "oodbench":
        # Table A6 holds the ID threshold fixed while OOD subsets vary; an OOD-positive threshold moves with each draw.
        raise typer.BadParameter(
            "--convention: the subsampling study (Table A6) is defined in the oodbench convention only: its "
            "threshold accepts 95% of the ID test set, which no OOD subsample changes"
        )
    fmt = _figure_format(figure)  # before the study runs and its JSON is written
    from ..analysis.rundata import load_run
    from ..analysis.spread import spread_vs_noise
    from ..analysis.subsample import subsample_run
    from ..core.tabular import render_markdown
    from .tables import table_a6

    run = load_run(run_dir)
    requested = n or ["auto"]
    results: list[dict[str, object]] = []
    per_n = []
    for value in requested:
        studies, notes = subsample_run(
            run,
            value,
            draws=draws,
            seed=seed,
            tpr=tpr,
            ood_datasets=dataset,
            detectors=detector,
            progress=not quiet,
            skip_too_large=len(requested) > 1,  # one n too large for every set must not cost the others
        )
        if not studies:
            typer.echo(f"note: {notes[0]}", err=True)
            continue
        summaries = [s.summary() for s in studies]
        spreads = spread_vs_noise(summaries)
        per_n.append(studies)
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        if str(value).lower() == "auto":
            typer.echo(f"note: n=auto resolved to n={studies[0].n}", err=True)
        typer.echo(render_markdown(table_a6(summaries, spreads)))
        results.append(
            {
                "n": studies[0].n,
                "requested": str(value),
                "notes": notes,
                "summaries": [s.as_dict() for s in summaries],
                "spread": [s.as_dict() for s in spreads],
            }
        )
    if not results:
        raise typer.BadParameter(f"--n: every size ({', '.join(requested)}) exceeds every OOD set")
    target = out or run_dir / "analysis" / "subsample.json"
    _write_json(target, {"run": str(run_dir), "draws": draws, "seed": seed, "tpr": tpr, "results": results})
    if figure is not None and fmt is not None:
        _write_curves(per_n, figure, fmt)


def _write_curves(per_n: list[list], figure: Path, fmt: str) -> None:
    """Fig. A4 over the studied sizes (one curve per model and OOD set), as FIGURE in format `fmt`."""
    from .figures import fig_subsample_curves, save_figure

    curves: dict[str, list] = {}
    for studies in per_n:
        for study in studies:
            curves.setdefault(f"{study.model}/{study.ood_dataset}", []).append(study)
    (path,) = save_figure(fig_subsample_curves(curves), figure.parent, figure.stem, [fmt])
    typer.echo(f"wrote {path}", err=True)  # FIGURE without a suffix is written as FIGURE.png


@app.command("ci")
def ci_command(
    run_dir: RunDir,
    dataset: Datasets = None,
    detector: Detectors = None,
    method: Annotated[
        list[str] | None,
        typer.Option("--method", help="wilson, clopper-pearson, delong, percentile, bca (repeatable; default all)."),
    ] = None,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples.")] = 2000,
    confidence: Annotated[float, typer.Option(help="Confidence level.")] = 0.95,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Also write the intervals as JSON.")] = None,
    quiet: Quiet = False,
    convention: Convention = "oodbench",
) -> None:
    """Confidence intervals of FPR@95 (Wilson, Clopper–Pearson, bootstrap) and AUROC (DeLong, bootstrap), for
    every detector of the run on every OOD set (or those named with --detector and --dataset).

    Example: oodbench analyze ci runs/resnet50 --detector knn --detector energy --resamples 2000

    Example: oodbench analyze ci runs/resnet50 --convention openood
    """
    _convention(convention)
    from ..analysis.rundata import load_run
    from ..analysis.runs import INTERVAL_METHODS, intervals_for_run
    from ..core.tabular import render_markdown
    from .tables import table_intervals

    records = intervals_for_run(
        load_run(run_dir),
        detectors=detector,
        ood_datasets=dataset,
        methods=tuple(method or INTERVAL_METHODS),
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        progress=not quiet,
        convention=convention,
    )
    chosen = "the detectors named" if detector else "every detector"
    title = f"Confidence intervals of {chosen} on {'the OOD sets named' if dataset else 'every OOD set'}"
    table = table_intervals(records, confidence, title=title)
    if convention == "openood":
        from dataclasses import replace

        from ..core.metrics import CONVENTION_NOTES

        note = (
            f"{100 * confidence:g}% intervals (%). Wilson and Clopper–Pearson hold the OOD threshold fixed (the ID "
            "images flagged as OOD are the binomial count); the bootstrap resamples ID and OOD images (percentile and "
            "BCa); DeLong is the normal approximation of the AUROC U-statistic."
        )
        table = replace(table, notes=(note, CONVENTION_NOTES["openood"]))
    typer.echo(render_markdown(table))
    if out is not None:
        _write_json(
            out,
            {
                "run": str(run_dir),
                "resamples": resamples,
                "seed": seed,
                "convention": convention,
                "records": [r.as_dict() for r in records],
            },
        )


@app.command("compare")
def compare_command(
    run_dir: RunDir,
    a: Annotated[str, typer.Option("--a", help="First detector.")],
    b: Annotated[str, typer.Option("--b", help="Second detector.")],
    dataset: Datasets = None,
    confidence: Annotated[float, typer.Option(help="Confidence level of the difference's interval.")] = 0.95,
    out: Annotated[Path | None, typer.Option(help="Also write the results as JSON.")] = None,
) -> None:
    """Is detector A really better than B? DeLong's paired test of their AUROCs on the same images, per OOD set.

    Example: oodbench analyze compare runs/resnet50 --a knn --b energy
    """
    from ..analysis.rundata import load_run
    from ..analysis.runs import compare_in_run
    from ..core.tabular import render_markdown
    from .tables import table_delong

    results = compare_in_run(load_run(run_dir), a, b, ood_datasets=dataset, confidence=confidence)
    typer.echo(render_markdown(table_delong(results, confidence)))
    if out is not None:
        _write_json(
            out,
            {
                "run": str(run_dir),
                "results": [{"model": m, "ood_dataset": o, **r.as_dict()} for m, o, r in results],
            },
        )


def register(main: typer.Typer) -> None:
    """Mount `analyze` on the main CLI."""
    main.add_typer(app, name="analyze")
