"""`oodbench evaluate` (detectors fitted and scored on a store) and `oodbench accuracy` (top-1 of a stored model)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from ..core.errors import OodbenchError
from ..util.cli_params import parse_params, refuse_inside
from .options import (
    Aupr,
    Convention,
    Csid,
    Detectors,
    GramDtype,
    Groups,
    Param,
    Plugin,
    SaveDetectors,
    SmallFitSet,
    Tpr,
    Verify,
    joined_selection,
)

if TYPE_CHECKING:
    from .spec import EvaluationSpec

__all__ = [
    "SOME_FAILED",
    "accuracy_command",
    "build_spec",
    "check_output_dir",
    "evaluate_command",
    "print_accuracy",
    "register",
    "report_detectors",
    "skipped_lines",
]

console = Console(stderr=True)


def accuracy_command(
    store: Path = typer.Option(..., "--store", "-s", help="Feature store root."),
    model_id: str = typer.Option(..., "--model-id", "-m", help="Store model id."),
    dataset: str = typer.Option(..., "--dataset", help="Labelled dataset id (e.g. the ID test set)."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Write/merge accuracy.json into this run directory."),
    labels: list[str] = typer.Option(
        [], "--labels", help="Re-annotation NAME=FILE (ReaL's JSON format or {image: [classes]}), repeatable."
    ),
    real: bool | None = typer.Option(
        None,
        "--real/--no-real",
        help="Also score timm's ImageNet-ReaL labels (default: when the entry records its images, which ReaL matches).",
    ),
    zero_shot: bool = typer.Option(
        False, "--zero-shot", help="VLM: predict from image embeddings and the cached class text embeddings."
    ),
    classes: str = typer.Option("imagenet1k", "--classes", help="Zero-shot ID classes (as in `oodbench zeroshot`)."),
) -> None:
    """Top-1 on the original labels, on re-annotated labels (multi-label rule) and zero-shot for VLMs.

    Example: oodbench accuracy --store store --model-id resnet50.a1_in1k --dataset imagenet-1k-val --run-dir runs/r50
    """
    from ..core.store import Store
    from .accuracy import (
        AccuracyError,
        class_text_embeddings,
        entry_items,
        load_multilabels,
        real_labels_path,
        record_accuracy,
    )

    try:
        sources = {}
        if real is None:  # by default ReaL is scored where it can be matched, and its absence said otherwise
            try:
                entry_items(Store(store), model_id, dataset)
                real = True
            except AccuracyError as exc:
                console.print(f"[yellow]ReaL labels not scored: {exc}[/yellow]")
                real = False
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


def evaluate_command(
    store: Path | None = typer.Option(None, "--store", help="Feature store root (or a pack folder)."),
    pack: str | None = typer.Option(
        None,
        "--pack",
        help="A feature pack instead of --store: its folder, or a Hugging Face dataset repository (owner/name) "
        "from which only this model's --fit, --id, --ood and --csid entries are pulled (docs/packs.md).",
    ),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    fit: str = typer.Option(..., "--fit", help="Dataset id of the ID fit set (e.g. the train split)."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID test set."),
    ood: list[str] = typer.Option(..., "--ood", help="Dataset id of an OOD set (repeat for several)."),
    detectors: Detectors = None,
    param: Param = None,
    out: Path = typer.Option(
        Path("oodbench-run"), "--out", help="Run directory for results.parquet, scores, table.md, run.json."
    ),
    tpr: Tpr = 0.95,
    strict: bool = typer.Option(False, help="Fail (instead of skip) when a detector's requirements are not met."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    plugin: Plugin = None,
    save_detectors: SaveDetectors = None,
    gram_dtype: GramDtype = "float64",
    convention: Convention = "oodbench",
    aupr: Aupr = False,
    groups: Groups = None,
    csid: Csid = None,
    small_fit_set: SmallFitSet = "fail",
    verify: Verify = False,
) -> None:
    """Fit detectors on the fit set, score ID test and OOD sets, write tidy results and a table.

    Example:
      oodbench evaluate --store feats --model resnet50.tv_in1k --fit imagenet-train --id imagenet-val \\
          --ood ninco --ood ssb-hard -d msp,energy,knn -p knn.k=1000 --out runs/resnet50
    """
    from .. import detectors as registry
    from ..detectors.cli import warn_plugin_failures
    from .evaluate import evaluate_spec

    registry.load_plugins(plugin or ())
    warn_plugin_failures()
    if (store is None) == (pack is None):
        raise typer.BadParameter("give --store (a feature store) or --pack (a feature pack), one of them")
    spec = build_spec(
        detectors,
        param,
        fit=fit,
        id=id_dataset,
        ood=ood,
        csid=csid or (),
        tpr=tpr,
        convention=convention,
        aupr=aupr,
        groups=groups,
        small_fit_set=small_fit_set,
        gram_dtype=gram_dtype,
        strict=strict,
        verify=verify,
    )
    # Where results and kept detectors go is checked before any work (a pack's pull included), not after the
    # detectors ran.
    check_output_dir("--out", out)
    check_output_dir("--save-detectors", save_detectors)
    if pack is not None:  # the options are checked before a repository's entries are pulled
        from ..core.packhub import resolve_pack

        store = resolve_pack(pack, model, [fit, id_dataset, *ood, *(csid or ())])
    assert store is not None
    if not store.is_dir():
        raise typer.BadParameter(f"--store {store}: {'not a directory' if store.exists() else 'no such directory'}")
    refuse_inside(("--out", out), ("--store", store))
    refuse_inside(("--save-detectors", save_detectors), ("--store", store))
    result = evaluate_spec(store, model, spec, out_dir=out, progress=progress, save_detectors=save_detectors)
    if result.verification:
        typer.echo(result.verification, err=True)
    sys.stdout.write(result.table_markdown)
    print_accuracy(result.accuracy)
    report_detectors(result.skipped, result.failed, result.adapted, extract=_extract_with)
    typer.echo(f"results: {out / 'results.parquet'}  table: {out / 'table.md'}")
    if result.failed:
        raise typer.Exit(SOME_FAILED)


def check_output_dir(option: str, directory: Path | None) -> None:
    """Refuse, naming `option`, an output directory that cannot be created or written (a file, a read-only place);
    creates nothing."""
    from ..util.atomic import unwritable

    problem = None if directory is None else unwritable(directory)
    if problem is not None:
        raise OodbenchError(f"{option}: {problem}")


def build_spec(detectors: str | list[str] | None, param: list[str] | None, **options: Any) -> EvaluationSpec:
    """The evaluation's `EvaluationSpec` from command-line options (-d selection, -p DETECTOR.PARAM=VALUE and the
    rest by name), validated once; a problem is one line naming the option (exit status 2)."""
    from ..core.errors import DetectorError
    from .spec import EvaluationSpec, select_detectors

    if isinstance(detectors, list):
        detectors = joined_selection(detectors)
    try:
        names = select_detectors(detectors, option="--detectors")
        overrides = parse_params(param)
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise DetectorError(f"--param names detectors that are not evaluated: {', '.join(unknown)}")
        return EvaluationSpec.build({name: overrides.get(name, {}) for name in names}, **options)
    except OodbenchError as exc:
        raise typer.BadParameter(_as_option(str(exc), options)) from None


def _as_option(text: str, options: Mapping[str, Any]) -> str:
    """A spec error naming its field ("gram_dtype: …", or "gram_dtype must …" from a detector's check) as the
    command line names the option ("--gram-dtype: …"); other errors as they are."""
    field, sep, rest = text.partition(": ")
    if not (sep and field in options):
        field, sep, rest = text.partition(" must ")
        rest = f"must {rest}"
    if sep and field in options:
        return f"--{field.replace('_', '-')}: {rest}"
    return text


SOME_FAILED = 3  # exit status of a run whose other detectors' results are written but some detectors failed


def print_accuracy(rows: list) -> None:
    """The Top-1 lines of a run (or why Top-1 is not computed), after its table."""
    from ..evaluation.accuracy import describe_row

    for row in rows:
        typer.echo(describe_row(row))


def _extract_with(settings: Sequence[str], them: str) -> str:
    """How `oodbench evaluate` gets a network-time detector's arrays: the store's entries extracted with --net."""
    return f"extract {them} with `oodbench extract {' '.join(f'--net {s}' for s in settings)}`"


def skipped_lines(
    skipped: Mapping[str, str], extract: Callable[[Sequence[str], str], str] = _extract_with
) -> list[str]:
    """One line per skipped detector, but one line in all for the network-time detectors skipped only because
    their arrays are not extracted: it names them and, through `extract` (given their --net settings and "it" or
    "them"), how the front end extracts those arrays."""
    from ..detectors.network import net_setting

    settings = {name: setting for name, reason in skipped.items() if (setting := net_setting(reason)) is not None}
    lines = []
    if settings:
        names = ", ".join(settings)
        if len(settings) == 1:
            said = f"skipped network-time detector {names}: its arrays are not extracted"
        else:
            said = f"skipped {len(settings)} network-time detectors ({names}): their arrays are not extracted"
        them = "it" if len(settings) == 1 else "them"
        lines.append(f"{said}; {extract(list(dict.fromkeys(settings.values())), them)}")
    return lines + [f"skipped {name}: {reason}" for name, reason in skipped.items() if name not in settings]


def report_detectors(
    skipped: dict[str, str],
    failed: dict[str, str],
    adapted: dict | None = None,
    *,
    extract: Callable[[Sequence[str], str], str] = _extract_with,
) -> None:
    """On stderr: the parameters adapted to a small fit set, the skipped detectors (`skipped_lines`: `extract`
    words how the front end extracts network-time arrays) and one line per failed detector (the caller exits
    `SOME_FAILED` for failures)."""
    if adapted:
        from ..detectors.fitsize import describe_changes

        typer.secho(f"adapted to the small fit set: {describe_changes(adapted)}", err=True)
    for line in skipped_lines(skipped, extract):
        typer.secho(line, fg=typer.colors.YELLOW, err=True)
    for name, reason in failed.items():
        typer.secho(f"failed {name}: {reason}", fg=typer.colors.RED, err=True)
    if failed:
        typer.secho(
            f"{len(failed)} detector(s) failed; the others' results, scores and table are written "
            "(rerun the same command to retry only the failed ones)",
            fg=typer.colors.RED,
            err=True,
        )


def register(main: typer.Typer) -> None:
    """Add `oodbench evaluate` and `oodbench accuracy` to the main CLI."""
    main.command("evaluate")(evaluate_command)
    main.command("accuracy")(accuracy_command)
