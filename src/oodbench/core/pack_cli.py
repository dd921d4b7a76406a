"""`oodbench pack …`: export store entries as a feature pack, import, verify and list packs, push and pull them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import typer

__all__ = ["pack_app", "register"]

pack_app = typer.Typer(
    help="Feature packs: store entries as files a lab publishes once and anyone evaluates against.",
    no_args_is_help=True,
)


@contextlib.contextmanager
def _bar(enabled: bool, what: str, total: int) -> Iterator[Callable[[int], None]]:
    from ..util.progress import progress_bar

    with progress_bar(enabled, rate_unit="MB", transient=True) as bar:
        task = bar.add_task(f"{what} (MB)", total=round(total / 1e6, 1))
        yield lambda n: bar.advance(task, n / 1e6)


def _rate(nbytes: int, seconds: float) -> str:
    from .cli import nbytes_text

    rate = f", {nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 and nbytes > 2**20 else ""
    return f"{nbytes_text(nbytes)} in {seconds:.2f} s{rate}"


@pack_app.command("export")
def pack_export(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    to: Path = typer.Option(..., "--to", help="The pack folder to write (new, or empty)."),
    model: list[str] | None = typer.Option(None, "--model", help="Model id to export (repeatable; default: all)."),
    dataset: list[str] | None = typer.Option(
        None, "--dataset", help="Dataset id to export (repeatable; default: every complete one)."
    ),
    float16: bool = typer.Option(
        False, "--float16", help="Store floating arrays as float16 (half the size; not byte-exact; not importable)."
    ),
    heads: bool = typer.Option(True, "--heads/--no-heads", help="Include each model's linear head."),
    title: str | None = typer.Option(None, "--title", help="Title of the dataset card."),
    license: str = typer.Option("other", "--license", help="Licence identifier written to the dataset card."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Write store entries as a pack: safetensors arrays, manifest.json, README.md (streamed, checksums checked).

    Example:
      oodbench pack export --store feats --to packs/resnet50 --model resnet50.tv_in1k
    """
    from .cli import _open_store
    from .errors import StoreError
    from .pack import export_pack

    root = _open_store(store)
    models = model or root.models()
    for name in models:
        if name not in root.models():
            raise StoreError(
                f"--model {name!r}: no such model in {store} (models: {', '.join(root.models()) or 'none'})"
            )
    entries = []
    for name in models:
        known = [d for d in root.datasets(name) if root.exists(name, d)]
        for wanted in dataset or []:
            if wanted not in root.datasets(name) and len(models) == 1:
                raise StoreError(f"--dataset {wanted!r}: no entry {name}/{wanted} (datasets: {', '.join(known)})")
        entries += [(name, d) for d in (dataset or known) if d in known]
    total = sum(p.stat().st_size for m, d in entries for p in root.entry_path(m, d).glob("*.npy"))
    with _bar(progress, "exporting", total) as advance:
        summary = export_pack(
            root, to, entries, heads=heads, float16=float16, title=title, license=license, advance=advance
        )
    typer.echo(f"exported {len(summary.entries)} entries and heads to {to} ({_rate(summary.nbytes, summary.seconds)})")


@pack_app.command("import")
def pack_import(
    pack: Path = typer.Argument(..., help="The pack folder."),
    store: Path = typer.Option(..., "--store", help="Feature store root to import into (created if absent)."),
    model: list[str] | None = typer.Option(None, "--model", help="Model id to import (repeatable; default: all)."),
    dataset: list[str] | None = typer.Option(None, "--dataset", help="Dataset id to import (repeatable)."),
    allow_different: bool = typer.Option(
        False,
        "--allow-different",
        help="Import even when the store holds the model with other weights, preprocessing or image lists.",
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Copy a pack's entries into a store: every byte verified before any entry enters the store; resumable.

    Example:
      oodbench pack import packs/resnet50 --store feats
    """
    from .pack import Pack, _selection, import_pack

    opened = Pack(pack)
    chosen = _selection(opened, model or (), dataset or ())
    total = sum(opened.files[n]["size"] for key in chosen for n in opened.files_of(*key))
    with _bar(progress, "importing", total) as advance:
        summary = import_pack(
            pack, store, models=model or (), datasets=dataset or (), allow_different=allow_different, advance=advance
        )
    for key in summary.skipped:
        typer.echo(f"{key}: already in {store}, skipped")
    typer.echo(
        f"imported {len(summary.entries)} entries and heads into {store} ({_rate(summary.nbytes, summary.seconds)})"
    )


@pack_app.command("verify")
def pack_verify(
    pack: Path = typer.Argument(..., help="The pack folder."),
    against: Path | None = typer.Option(
        None, "--against", help="A store to compare with: weights, preprocessing and image lists must agree."
    ),
    allow_different: bool = typer.Option(False, "--allow-different", help="Report differences from --against only."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Check every file of a pack against the SHA-256 and size its manifest records (exit status 2 if damaged).

    Example:
      oodbench pack verify packs/resnet50
    """
    from .errors import StoreError
    from .pack import Pack, check_comparable, verify_pack

    opened = Pack(pack)
    total = sum(record["size"] for record in opened.files.values())
    with _bar(progress, "verifying", total) as advance:
        _, summary, absent = verify_pack(pack, advance=advance)
    for problem in summary.problems:
        typer.echo(f"damaged: {problem}")
    if absent:
        typer.echo(f"{len(absent)} entries listed but not pulled: {', '.join(absent)}")
    if against is not None:
        from .cli import _open_store

        for line in check_comparable(opened, _open_store(against), sorted(opened.models), allow=allow_different):
            typer.echo(f"differs: {line}")
    line = f"checked {len(summary.entries)} entries and heads ({_rate(summary.nbytes, summary.seconds)})"
    if summary.problems:
        raise StoreError(f"{line}: {len(summary.problems)} files damaged (listed above); pull or export them again")
    typer.echo(line + ": all intact")


@pack_app.command("ls")
def pack_ls(pack: Path = typer.Argument(..., help="The pack folder.")) -> None:
    """List a pack's models (weights tag, preprocessing) and datasets (rows, arrays), marking those not pulled.

    Example:
      oodbench pack ls packs/resnet50
    """
    import json

    from .cli import nbytes_text
    from .pack import HEAD, Pack

    opened = Pack(pack)
    manifest = opened.manifest
    typer.echo(
        f"{pack}: pack format {manifest['format_version']}, oodbench {manifest['oodbench_version']}"
        + (", float16" if opened.float16 else "")
    )
    for model_id, model in sorted(opened.models.items()):
        head = ""
        if model.get("head") is not None:
            head = " (head)" if opened.present(model_id, HEAD) else " (head not pulled)"
        typer.echo(
            f"{model_id}{head}: weights {model.get('weights')}; preprocessing {json.dumps(model.get('preprocessing'), sort_keys=True)}"
        )
        for dataset_id, entry in sorted(model["datasets"].items()):
            size = sum(opened.files[n]["size"] for n in opened.files_of(model_id, dataset_id))
            state = "" if opened.present(model_id, dataset_id) else "; not pulled"
            shapes = ", ".join(
                f"{n} {tuple(s['shape'])}" for n, s in sorted(entry["arrays"].items()) if not n.startswith("extra.")
            )
            extras = sum(n.startswith("extra.") for n in entry["arrays"])
            typer.echo(
                f"  {dataset_id}: {entry['rows']:,} rows; {shapes}"
                + (f"; {extras} extras" if extras else "")
                + f"; {nbytes_text(size)}{state}"
            )


@pack_app.command("push")
def pack_push(
    pack: Path = typer.Argument(..., help="The pack folder (complete; verified before upload)."),
    repo: str = typer.Argument(..., help="Hugging Face dataset repository, e.g. my-lab/resnet50-ood-features."),
    revision: str | None = typer.Option(None, "--revision", help="Branch to commit to (default: main)."),
    private: bool | None = typer.Option(None, "--private/--public", help="Visibility if the repository is created."),
    message: str | None = typer.Option(None, "--message", help="Commit message."),
) -> None:
    """Upload a verified pack to a Hugging Face dataset repository (token from huggingface_hub's usual place).

    Example:
      oodbench pack push packs/resnet50 my-lab/resnet50-ood-features
    """
    from .packhub import push_pack

    url = push_pack(pack, repo, revision=revision, private=private, message=message)
    typer.echo(f"pushed {pack} to {repo}: {url}")


@pack_app.command("pull")
def pack_pull(
    repo: str = typer.Argument(..., help="Hugging Face dataset repository holding a pack."),
    to: Path = typer.Option(..., "--to", help="Folder to download into (a partial pack; rerun to resume)."),
    model: list[str] | None = typer.Option(None, "--model", help="Model id to pull (repeatable; default: all)."),
    dataset: list[str] | None = typer.Option(None, "--dataset", help="Dataset id to pull (repeatable; default: all)."),
    revision: str | None = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
) -> None:
    """Download only the chosen entries of a pack (and their models' heads), each file checked; resumes.

    Example:
      oodbench pack pull my-lab/resnet50-ood-features --to packs/r50 --model resnet50.tv_in1k --dataset ninco
    """
    from .packhub import pull_pack

    summary = pull_pack(repo, to, models=model or (), datasets=dataset or (), revision=revision)
    typer.echo(
        f"pulled {len(summary.entries)} entries and heads from {repo} into {to} ({_rate(summary.nbytes, summary.seconds)})"
    )


def register(main: typer.Typer) -> None:
    """Add `oodbench pack …` to the main CLI."""
    main.add_typer(pack_app, name="pack")
