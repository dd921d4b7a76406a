"""`oodbench …` commands. Thin: parse arguments, call the library, print."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .cli_params import parse_params
from .errors import OodbenchError

app = typer.Typer(
    name="oodbench",
    help="Out-of-distribution detection research at ImageNet scale: extract, evaluate, analyse, audit, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@app.command()
def evaluate(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    fit: str = typer.Option(..., "--fit", help="Dataset id of the ID fit set (e.g. the train split)."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID test set."),
    ood: list[str] = typer.Option(..., "--ood", help="Dataset id of an OOD set (repeat for several)."),
    detectors: str | None = typer.Option(
        None, "--detectors", "-d", help="Comma-separated names; default: all registered."
    ),
    param: list[str] | None = typer.Option(
        None, "--param", "-p", help="Detector hyper-parameter DETECTOR.PARAM=VALUE (repeatable)."
    ),
    out: Path = typer.Option(
        Path("oodbench-run"), "--out", help="Run directory for results.parquet, scores, table.md, run.json."
    ),
    tpr: float = typer.Option(0.95, help="ID acceptance rate of the FPR threshold."),
    strict: bool = typer.Option(False, help="Fail (instead of skip) when a detector's requirements are not met."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Fit detectors on the fit set, score ID test and OOD sets, write tidy results and a table.

    Example:
      oodbench evaluate --store feats --model resnet50.tv_in1k --fit imagenet-train --id imagenet-val \\
          --ood ninco --ood ssb-hard -d msp,energy,knn -p knn.k=1000 --out runs/resnet50
    """
    from . import detectors as registry
    from .evaluation import evaluate_store

    try:
        names = [d.strip() for d in detectors.split(",") if d.strip()] if detectors else registry.available()
        overrides = parse_params(param)
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise typer.BadParameter(f"--param names detectors that are not evaluated: {', '.join(unknown)}")
        plan = {name: overrides.get(name, {}) for name in names}
        result = evaluate_store(
            store, model, fit, id_dataset, ood, plan, out_dir=out, tpr=tpr, strict=strict, progress=progress
        )
    except OodbenchError as exc:
        _fail(exc)
    sys.stdout.write(result.table_markdown)
    for name, reason in result.skipped.items():
        typer.secho(f"skipped {name}: {reason}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"results: {out / 'results.parquet'}  table: {out / 'table.md'}")


@app.command("detectors")
def list_detectors() -> None:
    """List registered detectors with their requirements, defaults and papers.

    Example:
      oodbench detectors
    """
    from rich.console import Console
    from rich.table import Table

    from . import detectors as registry

    table = Table(title="oodbench detectors (higher score = more in-distribution)")
    for column in ("name", "requires", "defaults", "paper"):
        table.add_column(column, overflow="fold")
    for name in registry.available():
        cls = registry.get_class(name)
        paper = f"{cls.paper.citation} ({cls.paper.venue})" if cls.paper else ""
        defaults = ", ".join(f"{k}={v!r}" for k, v in cls.default_params().items())
        table.add_row(name, cls.requires.describe(), defaults, paper)
    Console(width=200).print(table)


@app.command()
def demo(
    out: Path = typer.Option(Path("oodbench-demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Random seed (training and data split)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Run the embedded end-to-end demo on scikit-learn's digits (offline, ~1 minute on 2 cores).

    Example:
      oodbench demo --out oodbench-demo
    """
    from .demo.run import print_summary, run_demo

    try:
        result = run_demo(out, seed, progress=progress)
    except OodbenchError as exc:
        _fail(exc)
    print_summary(result)


store_app = typer.Typer(help="Inspect a feature store.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command("ls")
def store_ls(store: Path = typer.Option(..., "--store", help="Feature store root.")) -> None:
    """List models and datasets in a store with their sizes and completeness.

    Example:
      oodbench store ls --store oodbench-demo/store
    """
    from .store import Store

    root = Store(store)
    for model_id in root.models():
        head = " (head)" if root.has_head(model_id) else ""
        typer.echo(f"{model_id}{head}")
        for dataset in root.datasets(model_id):
            meta = root.meta(model_id, dataset)
            status = "complete" if meta.get("complete") else "incomplete"
            shapes = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in meta.get("arrays", {}).items())
            skipped = len(meta.get("skipped", []))
            typer.echo(f"  {dataset}: {status}; {shapes}" + (f"; {skipped} skipped items" if skipped else ""))


# Each pipeline area owns its commands and adds them here.
from . import accuracy_cli as _accuracy_cli  # noqa: E402
from .analysis import cli as _analysis_cli  # noqa: E402
from .audit import cli as _audit_cli  # noqa: E402
from .construct import cli as _construct_cli  # noqa: E402
from .extract import cli as _extract_cli  # noqa: E402
from .report import cli as _report_cli  # noqa: E402
from .runner import cli as _runner_cli  # noqa: E402
from .zeroshot import cli as _zeroshot_cli  # noqa: E402

for _area in (
    _extract_cli,
    _accuracy_cli,
    _zeroshot_cli,
    _analysis_cli,
    _report_cli,
    _audit_cli,
    _construct_cli,
    _runner_cli,
):
    _area.register(app)


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
