"""`oodbench detectors` (list, `new` plugin scaffold) and `oodbench score` (a saved detector on new entries)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import OodbenchError

Plugins = Annotated[
    list[str] | None,
    typer.Option(
        "--plugin", help="Import MODULE (or a .py file) to register its detectors (repeatable); see docs/plugins.md."
    ),
]

app = typer.Typer(help="List the registered detectors (built-ins and plugins) or scaffold a plugin.")


def warn_plugin_failures() -> None:
    """Print one line per plugin that failed to load (the built-ins and other plugins still work)."""
    from . import registry

    for plugin, error in registry.plugin_failures().items():
        typer.secho(f"warning: plugin {plugin} failed to load: {error}", fg=typer.colors.YELLOW, err=True)


@app.callback(invoke_without_command=True)
def list_detectors(
    ctx: typer.Context,
    plugin: Plugins = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the docs' detector table (Markdown), plugins included.")
    ] = False,
) -> None:
    """List registered detectors with their origin, requirements, defaults and papers.

    Example: oodbench detectors

    Example: oodbench detectors --plugin my_detectors.py --markdown
    """
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from ..util.terminal import print_table
    from . import registry

    registry.load_plugins(plugin or ())
    if markdown:
        from .catalog import markdown_table

        typer.echo(markdown_table(registry.available()), nl=False)
        return
    table = Table(title="oodbench detectors (higher score = more in-distribution)")
    for column in ("name", "origin", "requires", "defaults", "paper"):
        table.add_column(column, overflow="fold")
    for name in registry.available():
        cls = registry.get_class(name)
        paper = f"{cls.paper.citation} ({cls.paper.venue})" if cls.paper else ""
        defaults = ", ".join(f"{k}={v!r}" for k, v in cls.default_params().items())
        table.add_row(name, registry.origin(name).describe(), cls.requires.describe(), defaults, paper)
    print_table(
        table,
        legend="origin: built in or the plugin that registered it; requires: the arrays it reads (features, logits, "
        "the head W/b, labels of the fit set); defaults: its parameters (change them with --param NAME.KEY=VALUE).",
    )
    failures = registry.plugin_failures()
    if failures:
        typer.echo(f"{len(failures)} plugin(s) failed to load (their detectors are not listed):")
        for plugin_name, error in failures.items():
            typer.secho(f"  {plugin_name}: {error}", fg=typer.colors.RED)


@app.command("new")
def new_plugin(
    name: Annotated[str, typer.Argument(help="Detector name, e.g. my_detector (the name users pass to -d).")],
    out: Annotated[Path | None, typer.Option("--out", help="Package directory (default: ./oodbench-NAME).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty directory.")] = False,
) -> None:
    """Scaffold a plugin package: pyproject with the entry point, a detector with its Paper, a check_detector test.

    Example: oodbench detectors new my_detector && pip install -e oodbench-my-detector
    """
    from . import registry
    from .scaffold import identifiers, scaffold

    if name in registry.available():  # the plugin, once installed, would clash with it ("registered twice")
        where = registry.origin(name).describe()
        raise OodbenchError(f"detector name {name!r} is already registered ({where}); choose another name")
    root = scaffold(name, out, force=force)
    ids = identifiers(name)
    typer.echo(f"wrote {root}: detector {ids['cls']} in src/{ids['package']}/detector.py")
    # The interpreter running oodbench, so the plugin and pytest land in oodbench's environment (a bare `pytest`
    # may be another environment's, which cannot import oodbench).
    python = sys.executable
    typer.echo(
        f"next: {python} -m pip install -e '{root}[test]' && {python} -m oodbench.cli detectors && "
        f"{python} -m pytest {root / 'tests'}"
    )


def score_command(
    detector: Annotated[
        Path, typer.Option("--detector", help="Saved detector directory (detectors.save / --save-detectors).")
    ],
    store: Annotated[Path, typer.Option("--store", help="Feature store root.")],
    dataset: Annotated[list[str], typer.Option("--dataset", help="Dataset id to score (repeatable).")],
    model: Annotated[
        str | None, typer.Option("--model", help="Model id in the store (default: the one the detector was fit on).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory for <dataset>.npy (float64 scores in row order) and <dataset>.csv."),
    ] = None,
    plugin: Plugins = None,
    ignore_versions: Annotated[
        bool, typer.Option("--ignore-versions", help="Load even if the detector's code version changed since saving.")
    ] = False,
    no_provenance_check: Annotated[
        bool,
        typer.Option(
            "--no-provenance-check",
            help="Score even when the detector or an entry records no provenance (model, checkpoint, "
            "preprocessing), so that nothing shows they match. Provenance that disagrees is still refused.",
        ),
    ] = False,
) -> None:
    """Score store entries with a saved, fitted detector; no fit set needed. Refuses entries of another
    checkpoint or preprocessing than the fit's, and (unless --no-provenance-check) entries or detectors that
    record none.

    Example: oodbench score --detector runs/resnet50/detectors/maha++ --store feats --dataset new-images --out scores
    """
    import numpy as np

    from ..core.store import Store
    from ..util.atomic import atomic_path, atomic_save_npy, unwritable
    from ..util.cli_params import refuse_inside
    from .artefact import check_provenance, load

    if not store.is_dir():
        raise OodbenchError(f"--store {store}: {'not a directory' if store.exists() else 'no such directory'}")
    refuse_inside(("--out", out), ("--store", store), ("--detector", detector))
    if out is not None:
        problem = unwritable(out)
        if problem is not None:
            raise OodbenchError(f"--out: {problem}")
    fitted = load(detector, plugins=plugin or (), check_versions=not ignore_versions)
    provenance = getattr(fitted, "fit_provenance_", None) or {}
    root = Store(store)
    model_id = model or provenance.get("model_id")
    if not model_id:
        raise OodbenchError("the saved detector does not name its model; pass --model")
    unchecked: list[str] = []
    for name in dataset:  # every entry is checked before any is scored
        unchecked += check_provenance(provenance, root, model_id, name, allow_missing=no_provenance_check)
    for line in dict.fromkeys(unchecked):
        typer.secho(f"warning: --no-provenance-check: {line}; scores unchecked", fg=typer.colors.YELLOW, err=True)
    results = {name: fitted.score(root.read(model_id, name)) for name in dataset}
    if out is not None:
        tables = {}
        for name, scores in results.items():
            arrays = root.meta(model_id, name).get("arrays", {})
            index = root.read_array(model_id, name, "index") if "index" in arrays else np.arange(len(scores))
            tables[name] = np.column_stack([index, scores])
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, table in tables.items():
                fmt = ["%d", "%.17g"]  # %.17g: the float64 scores round-trip exactly
                # Each file appears whole or not at all (a full disk leaves no truncated file behind).
                with atomic_path(out / f"{name}.csv") as tmp:
                    np.savetxt(tmp, table, fmt=fmt, delimiter=",", header="item_index,score", comments="")
                atomic_save_npy(out / f"{name}.npy", results[name])
        except OSError as exc:
            raise OodbenchError(f"--out {out}: cannot write the scores: {exc.strerror or exc}") from None
    fit_on = f"{provenance.get('model_id')}/{provenance.get('fit_dataset')}" if provenance else "unrecorded data"
    for name, scores in results.items():
        quartiles = np.percentile(scores, [25, 50, 75])
        sys.stdout.write(
            f"{name}: {len(scores)} rows scored by {fitted.name} (fit on {fit_on}); score quartiles "
            f"{quartiles[0]:.4g} / {quartiles[1]:.4g} / {quartiles[2]:.4g}\n"
        )
    if out is None:
        typer.echo("nothing written: pass --out DIR to keep the scores", err=True)
        return
    for name in results:
        typer.echo(f"scores: {out / f'{name}.npy'} (float64, row order) and {out / f'{name}.csv'} (item_index, score)")


def register(main: typer.Typer) -> None:
    """Mount `detectors` and `score` on the main CLI."""
    main.add_typer(app, name="detectors")
    main.command("score")(score_command)
