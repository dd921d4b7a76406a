"""`oodbench run EXPERIMENT.toml`: plan, then run what is not cached (or print the plan with --dry-run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def run_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment file (TOML), e.g. configs/demo.toml.")],
    engine: Annotated[
        str, typer.Option("--engine", help="local (this process) or ray (tasks on a Ray cluster).")
    ] = "local",
    only: Annotated[
        str | None,
        typer.Option("--only", help="Run one stage: extract, score (fits too), metrics, analysis or report."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan (units, sizes, what is cached) and exit.")
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Work directory; overrides experiment.workdir.")] = None,
    set_values: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a key: KEY=VALUE (e.g. paths.data=/mnt/ood); repeatable."),
    ] = None,
    device: Annotated[str, typer.Option(help="Device for models: auto, cpu, cuda, cuda:1 …")] = "auto",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Ray cluster address (default: engine.ray_address, else a local instance)."),
    ] = None,
    summary: Annotated[bool, typer.Option("--summary", help="With --dry-run: stage totals only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as JSON.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bars per stage.")] = True,
) -> None:
    """Run an experiment: extract → fit → score → metrics → analysis → report, skipping what is already done.

    Example: oodbench run configs/demo.toml

    Example: oodbench run configs/fi-imagenet-1k.toml --dry-run --set paths.imagenet=/data/imagenet --set paths.ood=/data/ood

    Example: oodbench run configs/fi-imagenet-1k.toml --engine ray --only extract
    """
    from .config import load_config
    from .executor import run_experiment
    from .plan import STAGES, build_plan, format_plan, plan_json

    config = load_config(experiment, overrides=set_values or (), workdir=out)
    if dry_run:
        plan = build_plan(config)
        sys.stdout.write(plan_json(plan) + "\n" if as_json else format_plan(plan, units=not summary))
        return
    from .plan import skip_line

    for model, reason in config.skipped_models:
        typer.secho(f"skipping {model.display_name}: {skip_line(model, reason)}", fg=typer.colors.YELLOW, err=True)
    report = run_experiment(config, engine=engine, only=only, progress=progress, device=device, ray_address=ray_address)
    # The results first: each model's detector table (from its run directory), then what ran.
    from ..core.rundir import RunDir
    from .plan import layout

    for model_id in [m.id for m in config.classifiers] + list(config.zeroshot.models if config.zeroshot else ()):
        table = RunDir(layout(config).run_dir(model_id)).table_path
        if table.is_file():
            typer.echo(f"## {model_id}\n\n{table.read_text(encoding='utf-8').strip()}\n")
            typer.echo("cells: FPR@95 / AUROC in % (ID positive; lower FPR and higher AUROC are better)\n")
    for stage in STAGES:
        ran, cached = len(report.executed[stage]), len(report.cached[stage])
        if ran or cached:
            typer.echo(f"{stage:<9} ran {ran:>6}   cached {cached:>6}")
    if report.skipped:
        reasons = sorted(set(report.skipped.values()))
        typer.secho(
            f"{len(report.skipped)} score units skipped (requirements not met): {'; '.join(reasons)}",
            fg=typer.colors.YELLOW,
            err=True,
        )
    if report.total_executed == 0:
        typer.echo("everything cached: nothing to do")
    for path in report.outputs:
        typer.echo(f"report: {path}")


def register(app: typer.Typer) -> None:
    """Add `oodbench run` to the main CLI."""
    app.command("run")(run_command)
