"""`oodbench report RUN_DIR… --out DIR`: the paper's tables (Markdown, LaTeX, HTML), figures and one HTML report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import AnalysisError

RunDirs = Annotated[
    list[Path], typer.Argument(help="Evaluation run directories (one per model), or results .parquet files.")
]
Out = Annotated[
    Path | None,
    typer.Option("--out", help="Output directory (default: RUN_DIR/report for one run; several runs need --out)."),
]
SubsetSize = Annotated[
    str, typer.Option("--n", help="Subset size of Table A6; 'auto' = 655 capped at half the smallest OOD set.")
]
PlotDetectors = Annotated[
    list[str] | None,
    typer.Option("--plot-detector", help="Detectors in ROC curves and histograms (repeatable; default: the 3 best)."),
]
ScoreFigures = Annotated[
    bool, typer.Option("--score-figures/--no-score-figures", help="ROC curves and histograms per (model, OOD set).")
]
Against = Annotated[
    str | None,
    typer.Option(
        "--against",
        help="Put a published set beside the run's numbers: 'fi-imagenet-1k' (the Fi-ImageNet-1k paper's "
        "Tables 1, 2, 3, A1–A7), with Δ and a verdict per cell: reproduced, within sampling error or differs.",
    ),
]
Convention = Annotated[
    str,
    typer.Option(
        "--convention",
        help="Metric convention of the result tables: oodbench (ID positive), or openood (OOD-positive FPR@95, "
        "trapezoidal AUPR; OpenOOD v1.5's near / far groups and its CSV files under OUT/openood/).",
    ),
]
Groups = Annotated[
    str | None,
    typer.Option("--groups", help="OOD groups: a groups TOML file or a shipped name (openood-v1.5-imagenet)."),
]
Csid = Annotated[
    list[str] | None,
    typer.Option(
        "--csid",
        help="Covariate-shifted ID set with saved scores (repeatable; default: each run's own from "
        "`evaluate --csid`): adds the full-spectrum table.",
    ),
]
Quiet = Annotated[bool, typer.Option("--no-progress/--progress", "--quiet", help="Hide the progress bar.")]


def report_command(
    run_dirs: RunDirs,
    out: Out = None,
    format: Annotated[str, typer.Option("--format", help="Comma-separated: md, tex, html.")] = "md,tex,html",
    figure_format: Annotated[str, typer.Option("--figure-format", help="Comma-separated: png, pdf, svg.")] = "png,pdf",
    n: SubsetSize = "auto",
    draws: Annotated[int, typer.Option(help="Draws per subset size.")] = 1000,
    curve_draws: Annotated[int, typer.Option(help="Draws per point of the Fig. A4 curves.")] = 300,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples of the interval table.")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    plot_detector: PlotDetectors = None,
    score_figures: ScoreFigures = True,
    vocab: Annotated[
        Path | None, typer.Option(help="JSON {key: {label, size, deployable, family}} for Table 2.")
    ] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "oodbench report",
    against: Against = None,
    convention: Convention = "oodbench",
    aupr: Annotated[
        bool, typer.Option("--aupr", help="AUPR-In and AUPR-Out in the detector and group tables.")
    ] = False,
    groups: Groups = None,
    csid: Csid = None,
    quiet: Quiet = False,
) -> None:
    """Render the Fi-ImageNet-1k paper's Tables 1, A1, 3/A2, 2 and A6 and Figs. 1 and A4 for your runs, ROC curves,
    histograms and per-OOD-class acceptance, and one self-contained report.html.

    Example: oodbench report runs/resnet50   (writes runs/resnet50/report/)

    Example: oodbench report runs/resnet50 runs/vit-b16 --out report/ --format md,tex,html

    Example: oodbench report runs/fi-imagenet-1k/* --out report/ --against fi-imagenet-1k

    Example: oodbench report runs/resnet50 --out report/ --convention openood --aupr
    """
    from .build import ReportOptions, build_report
    from .output import parse_formats, write_report

    out = out if out is not None else default_out(run_dirs)
    formats = parse_formats(format)
    figure_formats = [f.strip().lower() for f in figure_format.split(",") if f.strip()]
    vocabularies = None if vocab is None else read_vocabularies(vocab)
    options = ReportOptions(
        n=n,
        draws=draws,
        curve_draws=curve_draws,
        resamples=resamples,
        seed=seed,
        plot_detectors=tuple(plot_detector) if plot_detector else None,
        score_figures=score_figures,
        vocabularies=vocabularies,
        title=title,
        against=against,
        convention=convention,
        aupr=aupr,
        groups=groups,
        csid=tuple(csid or ()),
    )
    content = build_report(run_dirs, options, progress=not quiet)
    written = write_report(content, out, formats, figure_formats)
    for note in content.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"{len(written['tables'])} table files, {len(written['figures'])} figure files in {out}")
    if content.published:
        from .published import verdict_line

        typer.echo(f"against {against}: {verdict_line(content.published)}")
    for path in written["reports"]:
        typer.echo(f"wrote {path}")


def read_vocabularies(path: Path) -> dict[str, object]:
    """The vocabulary metadata file of `--vocab`: a JSON object {key: {label, size, deployable, family}}."""
    try:
        vocabularies = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise AnalysisError(f"cannot read vocabulary file {path}: {exc}") from exc
    if not isinstance(vocabularies, dict):
        raise AnalysisError(f"{path} must hold a JSON object {{key: {{label, size, deployable, family}}}}")
    return vocabularies


def default_out(run_dirs: list[Path]) -> Path:
    """Where a report goes without --out: `report/` inside the one run directory (beside a results file)."""
    if len(run_dirs) != 1:
        raise AnalysisError(
            f"{len(run_dirs)} runs: give --out for their joint report (one run's report goes to RUN_DIR/report)"
        )
    run = run_dirs[0]
    return (run if run.is_dir() else run.parent) / "report"


def register(app: typer.Typer) -> None:
    """Mount `report` on the main CLI."""
    app.command("report")(report_command)
