"""`oodbench store …`: list a feature store's entries and verify every byte against its checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

__all__ = ["nbytes_text", "register", "store_app"]


store_app = typer.Typer(help="Inspect a feature store.", no_args_is_help=True)


@store_app.command("ls")
def store_ls(store: Path = typer.Option(..., "--store", help="Feature store root.")) -> None:
    """List models and datasets in a store with their sizes and completeness.

    An unfinished entry says what it holds and how to finish it; an entry whose meta.json is damaged is listed
    with the problem (and the exit status is 2).

    Example:
      oodbench store ls --store oodbench-demo/store
    """
    from .errors import StoreError

    root = _open_store(store)
    if not root.models():
        typer.echo(f"{store}: no models in this store")
    _refuse_foreign_folders(root, store)
    unreadable = []
    for model_id in root.models():
        head = " (head)" if root.has_head(model_id) else ""
        typer.echo(f"{model_id}{head}")
        for dataset in root.datasets(model_id):
            try:
                meta = root.meta(model_id, dataset)
                if not meta.get("complete"):
                    typer.echo(f"  {dataset}: incomplete: {root.describe_incomplete(model_id, dataset)}")
                    continue
            except StoreError as exc:
                unreadable.append(f"{model_id}/{dataset}")
                typer.echo(f"  {dataset}: unreadable: {exc}")
                continue
            skipped = len(meta.get("skipped", []))
            if not meta["num_rows"]:
                typer.echo(
                    f"  {dataset}: complete, but holds no rows" + (f" ({skipped} items skipped)" if skipped else "")
                )
                continue
            shapes = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in meta["arrays"].items())
            typer.echo(f"  {dataset}: complete; {shapes}" + (f"; {skipped} skipped items" if skipped else ""))
    if unreadable:
        raise StoreError(f"{len(unreadable)} store entries are unreadable (listed above): {', '.join(unreadable)}")


@store_app.command("verify")
def store_verify(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str | None = typer.Option(None, "--model", help="Check only this model id (default: every model)."),
    dataset: list[str] | None = typer.Option(
        None, "--dataset", help="Check only this dataset id of --model (repeatable; default: all, and the head)."
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Check every byte of every complete entry and head against the checksums recorded when it was written.

    Lists each entry as ok, damaged (which array, which rows) or unfinished, then one summary line; the exit
    status is 2 when anything is damaged.

    Example:
      oodbench store verify --store oodbench-demo/store
    """
    import time

    from ..util.progress import progress_bar
    from .errors import StoreError

    root = _open_store(store)
    if dataset and model is None:
        raise typer.BadParameter("--dataset needs --model (the model whose dataset to check)")
    models = root.models()
    if not models:
        raise StoreError(f"--store {store}: nothing to verify: it holds no models")
    _refuse_foreign_folders(root, store)
    if model is not None and model not in models:
        raise StoreError(f"--model {model!r}: no such model in {store} (models: {', '.join(models) or 'none'})")
    targets = []
    for model_id in [model] if model is not None else models:
        known = root.datasets(model_id)
        for name in dataset or []:
            if name not in known:
                raise StoreError(f"--dataset {name!r}: no entry {model_id}/{name} (datasets: {', '.join(known)})")
        targets += [(model_id, "dataset", name) for name in dataset or known]
        if not dataset and root.has_head(model_id):
            targets.append((model_id, "head", "head"))
    total = sum(p.stat().st_size for m, _, name in targets for p in (store / m / name).glob("*.npy"))
    started, nbytes, checked, damaged, legacy = time.perf_counter(), 0, 0, [], []
    with progress_bar(progress, rate_unit="MB", transient=True) as bar:
        task = bar.add_task("verifying (MB)", total=round(total / 1e6, 1))
        advance = lambda n: bar.advance(task, n / 1e6)  # noqa: E731
        for model_id, kind, name in targets:
            key = f"{model_id}/{name}"
            try:
                if kind == "dataset" and not root.meta(model_id, name).get("complete"):
                    typer.echo(f"{key}: unfinished, not checked: {root.describe_incomplete(model_id, name)}")
                    continue
                result = (
                    root.verify_head(model_id, advance=advance)
                    if kind == "head"
                    else root.verify(model_id, name, advance=advance)
                )
            except StoreError as exc:
                damaged.append(key)
                typer.echo(f"{key}: damaged: {exc}")
                continue
            checked += 1
            nbytes += result.nbytes
            for problem in result.problems:
                typer.echo(f"{key}: damaged: {problem}")
            if result.problems:
                damaged.append(key)
            elif not result.checksums:
                legacy.append(key)
                typer.echo(f"{key}: no checksums recorded (written by an older oodbench); sizes and headers ok")
            else:
                typer.echo(f"{key}: ok ({nbytes_text(result.nbytes)})")
    seconds = time.perf_counter() - started
    rate = f", {nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 and nbytes > 2**20 else ""
    summary = f"checked {checked} entries and heads ({nbytes_text(nbytes)}) in {seconds:.2f} s{rate}"
    if damaged:
        raise StoreError(f"{summary}: {len(damaged)} damaged ({', '.join(damaged)}); extract them again")
    typer.echo(summary + (": all intact" if not legacy else f": intact; {len(legacy)} without checksums"))


def nbytes_text(nbytes: int) -> str:
    """A byte count for people: 950 B, 12.3 kB, 4.5 MB, 10.2 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _refuse_foreign_folders(root: Any, store: Path) -> None:
    """Refuse a folder that holds folders but no store entry or head in any of them (an image tree, say)."""
    from .errors import StoreError

    models = root.models()
    if models and not any(root.datasets(m) or root.has_head(m) for m in models):
        shown = ", ".join(models[:3]) + (", ..." if len(models) > 3 else "")
        raise StoreError(
            f"--store {store}: not a feature store: none of its folders ({shown}) holds an entry "
            "(<model>/<dataset>/meta.json) or a head"
        )


def _open_store(store: Path) -> Any:
    """The Store at `store` (an expected error when it is not a directory)."""
    from .errors import StoreError
    from .store import Store

    if not store.is_dir():
        raise StoreError(f"--store {store}: {'not a directory' if store.exists() else 'no such directory'}")
    return Store(store)


def register(main: typer.Typer) -> None:
    """Add `oodbench store …` to the main CLI."""
    main.add_typer(store_app, name="store")
