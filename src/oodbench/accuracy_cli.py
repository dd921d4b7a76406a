"""`oodbench accuracy`: top-1 of a stored model on a labelled dataset (original, re-annotated, zero-shot)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .errors import OodbenchError

__all__ = ["register", "accuracy_command"]

console = Console(stderr=True)


def accuracy_command(
    store: Path = typer.Option(..., "--store", "-s", help="Feature store root."),
    model_id: str = typer.Option(..., "--model-id", "-m", help="Store model id."),
    dataset: str = typer.Option(..., "--dataset", help="Labelled dataset id (e.g. the ID test set)."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Write/merge accuracy.json into this run directory."),
    labels: list[str] = typer.Option(
        [], "--labels", help="Re-annotation NAME=FILE (ReaL's JSON format or {image: [classes]}), repeatable."
    ),
    real: bool = typer.Option(True, "--real/--no-real", help="Also score timm's ImageNet-ReaL labels."),
    zero_shot: bool = typer.Option(
        False, "--zero-shot", help="VLM: predict from image embeddings and the cached class text embeddings."
    ),
    classes: str = typer.Option("imagenet1k", "--classes", help="Zero-shot ID classes (as in `oodbench zeroshot`)."),
) -> None:
    """Top-1 on the original labels, on re-annotated labels (multi-label rule) and zero-shot for VLMs.

    Example: oodbench accuracy --store store --model-id resnet50.a1_in1k --dataset imagenet-1k-val --run-dir runs/r50
    """
    from .accuracy import class_text_embeddings, load_multilabels, real_labels_path, record_accuracy
    from .store import Store

    try:
        sources = {}
        if real:
            sources["real"] = load_multilabels(real_labels_path())
        for spec in labels:
            name, sep, file = spec.partition("=")
            if not sep or not name or not file:
                raise OodbenchError(f"--labels takes NAME=FILE; got {spec!r}")
            sources[name] = load_multilabels(file)
        opened = Store(store)
        text = class_text_embeddings(opened, model_id, classes) if zero_shot else None
        rows = record_accuracy(run_dir, opened, model_id, dataset, multilabels=sources, text_embeddings=text)
    except OodbenchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if not rows:
        console.print(f"[yellow]{model_id}/{dataset} has no labels to score[/yellow]")
    for row in rows:
        value = f"top1={row.top1:.4f}" if not row.reason else f"top1 not computed: {row.reason}"
        typer.echo(
            f"{model_id}\t{row.dataset}\t{row.labels}{' (zero-shot)' if zero_shot else ''}\t"
            f"{value}\tn={row.n}\texcluded={row.n_excluded}"
            + (f"\tlabel set: {row.label_set}" if row.label_set else "")
        )


def register(main: typer.Typer) -> None:
    """Add `oodbench accuracy` to the main CLI."""
    main.command("accuracy")(accuracy_command)
