"""`oodbench run EXPERIMENT.toml`: plan, then run what is not cached (or print the plan with --dry-run)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ..evaluation.options import (
    Aupr,
    Convention,
    Csid,
    Detectors,
    GramDtype,
    Groups,
    Param,
    Plugin,
    SmallFitSet,
    Strict,
    Tpr,
    Verify,
    joined_selection,
)

_SaveDetectors = Annotated[
    bool,
    typer.Option("--save-detectors", help="Keep each fitted detector under <workdir>/detectors (detectors.save)."),
]


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
    detectors: Detectors = None,
    param: Param = None,
    tpr: Tpr = None,
    convention: Convention = None,
    aupr: Aupr = False,
    groups: Groups = None,
    csid: Csid = None,
    small_fit_set: SmallFitSet = None,
    strict: Strict = False,
    verify: Verify = False,
    gram_dtype: GramDtype = None,
    plugin: Plugin = None,
    save_detectors: _SaveDetectors = False,
) -> None:
    """Run an experiment: extract → fit → score → metrics → analysis → report, skipping what is already done.

    Example: oodbench run configs/demo.toml

    Example: oodbench run configs/fi-imagenet-1k.toml --dry-run --set paths.imagenet=/data/imagenet --set paths.ood=/data/ood

    Example: oodbench run configs/fi-imagenet-1k.toml --engine ray --only extract
    """
    from .config import load_config
    from .executor import run_experiment
    from .plan import build_plan, format_plan, plan_json

    check_run_options(only=only, dry_run=dry_run, summary=summary, as_json=as_json)
    options = evaluation_overrides(
        detectors=joined_selection(detectors),
        param=param,
        tpr=tpr,
        convention=convention,
        aupr=aupr,
        groups=groups,
        csid=csid,
        small_fit_set=small_fit_set,
        strict=strict,
        verify=verify,
        gram_dtype=gram_dtype,
        save_detectors=save_detectors,
    )
    config = load_config(experiment, overrides=[*options, *(set_values or ())], workdir=out, plugins=plugin or ())
    if dry_run:
        plan = build_plan(config)
        sys.stdout.write(plan_json(plan) + "\n" if as_json else format_plan(plan, units=not summary))
        return
    from .plan import skip_line

    for model, reason in config.skipped_models:
        typer.secho(f"skipping {model.display_name}: {skip_line(model, reason)}", fg=typer.colors.YELLOW, err=True)
    report = run_experiment(config, engine=engine, only=only, progress=progress, device=device, ray_address=ray_address)
    _print_run(config, report)


def check_run_options(*, only: str | None, dry_run: bool, summary: bool, as_json: bool) -> None:
    """Refuse, before reading the file, options that would be ignored or a stage `--only` cannot run."""
    from ..core.errors import ConfigError
    from .executor import check_only

    for flag, given in (("--json", as_json), ("--summary", summary)):
        if given and not dry_run:
            raise ConfigError(f"{flag} needs --dry-run (it formats the plan; a run prints its tables)")
    check_only(only)


def _print_run(config: Any, report: Any) -> None:
    """The results first: each model's detector table (from its run directory); then what ran, skipped, the report."""
    from ..core.metrics import fpr_label
    from ..core.rundir import RunDir
    from .plan import STAGES, layout

    positive = "OOD positive, OpenOOD's convention" if config.evaluation.convention == "openood" else "ID positive"
    fpr = fpr_label(config.tpr)
    for model_id in [m.id for m in config.classifiers] + list(config.zeroshot.models if config.zeroshot else ()):
        table = RunDir(layout(config).run_dir(model_id)).table_path
        if table.is_file():
            typer.echo(f"## {model_id}\n\n{table.read_text(encoding='utf-8').strip()}\n")
            typer.echo(f"cells: {fpr} / AUROC in % ({positive}; lower FPR and higher AUROC are better)\n")
    for stage in STAGES:
        ran, cached = len(report.executed[stage]), len(report.cached[stage])
        if ran or cached:
            typer.echo(f"{stage:<9} ran {ran:>6}   cached {cached:>6}")
    for line in _skipped_lines(report.skipped):
        typer.secho(line, fg=typer.colors.YELLOW, err=True)
    if report.total_executed == 0:
        typer.echo("everything cached: nothing to do")
    for path in report.outputs:
        typer.echo(f"report: {path}")


def _network_table(settings: Sequence[str], them: str) -> str:
    """How an experiment gets a network-time detector's arrays: the model table's `network` list."""
    return f"add network = [{', '.join(json.dumps(setting) for setting in settings)}] to the model's table to extract {them}"


def _skipped_lines(skipped: Mapping[str, str]) -> list[str]:
    """The skipped score units (unit id -> reason): one line for the network-time detectors whose arrays are not
    extracted (`skipped_lines`), one for the rest with their distinct reasons."""
    from ..detectors.network import net_setting
    from ..evaluation.cli import skipped_lines

    # A score unit's id is score:MODEL/DETECTOR/DATASET (names hold no slash).
    network = {unit.split("/")[-2]: reason for unit, reason in skipped.items() if net_setting(reason)}
    rest = {unit: reason for unit, reason in skipped.items() if not net_setting(reason)}
    lines = skipped_lines(network, _network_table)
    if rest:
        reasons = "; ".join(sorted(set(rest.values())))
        lines.append(f"{len(rest)} score units skipped (requirements not met): {reasons}")
    return lines


def evaluation_overrides(
    *,
    detectors: str | None = None,
    param: list[str] | None = None,
    tpr: float | None = None,
    convention: str | None = None,
    aupr: bool = False,
    groups: str | None = None,
    csid: list[str] | None = None,
    small_fit_set: str | None = None,
    strict: bool = False,
    verify: bool = False,
    gram_dtype: str | None = None,
    save_detectors: bool = False,
) -> list[str]:
    """`oodbench evaluate`'s options as the experiment file's keys (``--set`` overrides, applied before the user's
    own ``--set``); the file's validation then checks them once, with everything else."""
    import json

    from ..util.cli_params import parse_params

    def value(v: object) -> str:
        return json.dumps(v)  # strings, numbers, booleans and lists of them: the same text in TOML

    overrides = []
    if detectors is not None:
        overrides += [f"detectors.include={value(detectors)}", "detectors.exclude=[]"]
    for name, given in parse_params(param).items():
        overrides += [f"detectors.params.{name}.{key}={value(v)}" for key, v in given.items()]
    if tpr is not None:
        overrides.append(f"experiment.tpr={value(tpr)}")
    for key, given in (("convention", convention), ("groups", groups), ("small_fit_set", small_fit_set)):
        if given is not None:
            overrides.append(f"evaluation.{key}={value(given)}")
    for key, flag in (("aupr", aupr), ("strict", strict), ("verify", verify)):
        if flag:
            overrides.append(f"evaluation.{key}=true")
    if csid:
        overrides.append(f"id.csid={value(list(csid))}")
    if gram_dtype is not None:
        overrides.append(f"detectors.gram_dtype={value(gram_dtype)}")
    if save_detectors:
        overrides.append("detectors.save=true")
    return overrides


def register(app: typer.Typer) -> None:
    """Add `oodbench run` to the main CLI."""
    app.command("run")(run_command)
