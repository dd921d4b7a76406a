"""`oodbench evaluate-model MODEL --fit [NAME=]DIR --id [NAME=]DIR --ood NAME=DIR`: extract (cached by name and
content), fit, score in one command; `oodbench evaluate`'s options, with --csid taking folders and --net the
network-time detectors' arrays to extract."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..evaluation.cli import SOME_FAILED, check_output_dir, print_accuracy, report_detectors
from ..evaluation.options import (
    Aupr,
    Convention,
    Detectors,
    GramDtype,
    Groups,
    Param,
    Plugin,
    SaveDetectors,
    SmallFitSet,
    Strict,
    Tpr,
    Verify,
)
from ..util.cli_params import refuse_inside

if TYPE_CHECKING:
    from .quick import ModelEvaluation

__all__ = ["SOME_FAILED", "evaluate_model_command", "register", "print_accuracy", "report_detectors"]


def _named(values: list[str], option: str = "--ood", example: str = "textures=data/dtd") -> dict[str, Path]:
    """--ood (or --csid) NAME=DIR pairs, in the order given."""
    named: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise typer.BadParameter(f"{option} {value!r}: expected NAME=DIR (e.g. {option} {example})")
        if name.strip() in named:
            raise typer.BadParameter(f"{option}: the name {name.strip()!r} is given twice")
        named[name.strip()] = Path(path.strip())
    return named


def _net(values: Sequence[str]) -> list[str]:
    """--net values, checked as `oodbench extract --net` checks them (before any model loads)."""
    from ..core.errors import OodbenchError
    from ..extract.posthoc_net import parse_specs

    try:
        parse_specs(values)
    except OodbenchError as exc:
        raise typer.BadParameter(f"--net: {exc}") from None
    return list(values)


def _maybe_named(value: str, default: str) -> tuple[str, Path]:
    """--fit / --id as NAME=DIR or a bare DIR (named `default`); a path that exists is a path, even with a '='."""
    name, sep, path = value.partition("=")
    if sep and name.strip() and path.strip() and "/" not in name and os.sep not in name and not Path(value).exists():
        return name.strip(), Path(path.strip())
    return default, Path(value)


# The command's options, declared once here so that the command reads as what it does.
_Model = Annotated[str, typer.Argument(help="timm model name, e.g. resnet50.a1_in1k.")]
_Fit = Annotated[
    str,
    typer.Option(
        "--fit",
        help="ID fit images as [NAME=]DIR, a folder with one sub-folder per class (default name: fit); the store "
        "keeps each set under its name.",
    ),
]
_IdData = Annotated[
    str,
    typer.Option(
        "--id",
        help="ID test images as [NAME=]DIR, a folder with one sub-folder per class (default name: id); another "
        "ID folder in the same store takes another name (--id imnet=DIR).",
    ),
]
_Ood = Annotated[list[str], typer.Option("--ood", help="OOD images as NAME=DIR (repeat for several sets).")]
_Csid = Annotated[
    list[str] | None,
    typer.Option(
        "--csid",
        help="Covariate-shifted ID images as NAME=DIR (e.g. imagenet-v2=data/v2; repeatable): extracted and "
        "scored, and counted as ID in a full-spectrum table beside the standard one.",
    ),
]
_Net = Annotated[
    list[str] | None,
    typer.Option(
        "--net",
        help="Also extract a network-time detector's arrays: METHOD[:KEY=VALUE,...] as `oodbench extract --net` "
        "takes it (odin, rankfeat, gram, mds; repeatable), stored under the model id MODEL+net-….",
    ),
]
_Store = Annotated[
    Path | None, typer.Option("--store", help="Feature store to extract into and reuse (default: a temporary one).")
]
_Out = Annotated[
    Path | None, typer.Option("--out", help="Run directory for results.parquet, scores, table.md, run.json.")
]
_Pretrained = Annotated[
    bool, typer.Option("--pretrained/--no-pretrained", help="Hub weights, or seeded random ones (tests).")
]
_Checkpoint = Annotated[Path | None, typer.Option("--checkpoint", help="Local state dict file.")]
_ImageSize = Annotated[
    int | None, typer.Option("--image-size", help="Override the input resolution (pixels, at least 32).")
]
_BatchSize = Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")]
_Workers = Annotated[
    int | None,
    typer.Option(
        "--workers", min=0, help="Image decoding processes (default: one less than the cores available, at most 4)."
    ),
]
_NumWorkers = Annotated[int | None, typer.Option("--num-workers", min=0, hidden=True)]
_Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:1 …")]
_Progress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")]


def evaluate_model_command(
    model: _Model,
    fit: _Fit,
    id_data: _IdData,
    ood: _Ood,
    csid: _Csid = None,
    store: _Store = None,
    out: _Out = None,
    detectors: Detectors = None,
    param: Param = None,
    net: _Net = None,
    pretrained: _Pretrained = True,
    checkpoint: _Checkpoint = None,
    image_size: _ImageSize = None,
    batch_size: _BatchSize = 64,
    workers: _Workers = None,
    num_workers: _NumWorkers = None,
    device: _Device = "auto",
    progress: _Progress = True,
    small_fit_set: SmallFitSet = "fail",
    tpr: Tpr = 0.95,
    convention: Convention = "oodbench",
    aupr: Aupr = False,
    groups: Groups = None,
    gram_dtype: GramDtype = "float64",
    strict: Strict = False,
    verify: Verify = False,
    plugin: Plugin = None,
    save_detectors: SaveDetectors = None,
) -> None:
    """Evaluate a timm model on image folders in one command: extract (cached in --store), fit, score, print.

    Example: oodbench evaluate-model resnet50.a1_in1k --fit data/train --id data/val --ood textures=data/dtd

    Example: oodbench evaluate-model resnet50.a1_in1k --fit train=data/train --id imnet=data/val --ood inat=data/inat --store feats -d all,-she
    """
    from .. import detectors as registry
    from ..detectors.cli import warn_plugin_failures
    from ..evaluation.cli import build_spec
    from ..extract.cli import check_image_size

    check_image_size(image_size)
    registry.load_plugins(plugin or ())  # before the specification: its detector names must be known
    warn_plugin_failures()
    if store is not None:
        refuse_inside(("--out", out), ("--store", store))
        refuse_inside(("--save-detectors", save_detectors), ("--store", store))
    workers = _workers(workers, num_workers)
    (fit_name, fit_dir), (id_name, id_dir), shifted, named = _sets(fit, id_data, csid or [], ood)
    options = {"tpr": tpr, "convention": convention, "aupr": aupr, "groups": groups, "gram_dtype": gram_dtype}
    options |= {"small_fit_set": small_fit_set, "strict": strict, "verify": verify}
    # One specification, validated here (a bad option is one line naming it, before any image is read).
    spec = build_spec(detectors, param, fit=fit_name, id=id_name, ood=list(named), csid=list(shifted), **options)
    # Where results and kept detectors go is checked before any image is read, not after the detectors ran.
    check_output_dir("--out", out)
    check_output_dir("--save-detectors", save_detectors)
    from .quick import evaluate_model

    result = evaluate_model(
        model,
        fit={fit_name: fit_dir},
        id={id_name: id_dir},
        ood=named,
        csid=shifted,
        net=_net(net or []),
        store=store,
        out=out,
        pretrained=pretrained,
        checkpoint=checkpoint,
        image_size=image_size,
        batch_size=batch_size,
        num_workers=workers,
        device=device,
        progress=progress,
        spec=spec,
        save_detectors=save_detectors,
        report=lambda line: typer.echo(line, err=True),
    )
    _print_result(result)


def _sets(
    fit: str, id_data: str, csid: list[str], ood: list[str]
) -> tuple[tuple[str, Path], tuple[str, Path], dict[str, Path], dict[str, Path]]:
    """The named sets of the command line: (fit name, dir), (id name, dir), {csid name: dir}, {ood name: dir}."""
    named = _named(ood)
    shifted = _named(csid, "--csid", "imagenet-v2=data/v2")
    fit_name, fit_dir = _maybe_named(fit, "fit")
    id_name, id_dir = _maybe_named(id_data, "id")
    for option, sets in (("--csid", shifted), ("--ood", named)):
        reserved = sorted({fit_name, id_name} & set(sets))
        if reserved:
            raise typer.BadParameter(f"{option}: the names {reserved} are those of --fit or --id; rename them")
    both = sorted(set(shifted) & set(named))
    if both:
        raise typer.BadParameter(f"--csid: the names {both} are also given to --ood; rename them")
    return (fit_name, fit_dir), (id_name, id_dir), shifted, named


def _workers(workers: int | None, num_workers: int | None) -> int | None:
    """--workers, or the value of its old name --num-workers (with a warning)."""
    if num_workers is None:
        return workers
    if workers is not None and workers != num_workers:
        raise typer.BadParameter("--num-workers is the old name of --workers; give only --workers")
    typer.secho("warning: --num-workers is now --workers (as in `oodbench extract`)", fg="yellow", err=True)
    return num_workers


def _add_net(settings: Sequence[str], them: str) -> str:
    """How evaluate-model gets a network-time detector's arrays: --net on the same command."""
    return f"add {' '.join(f'--net {setting}' for setting in settings)} to extract {them}"


def _print_result(result: ModelEvaluation) -> None:
    """The detector table, the accuracy, skipped and failed detectors, what was extracted and where results are."""
    sys.stdout.write(result.table_markdown)
    print_accuracy(result.accuracy)
    report_detectors(result.skipped, result.failed, result.adapted, extract=_add_net)
    ran, unreadable = sum(result.extracted.values()), sum(result.unreadable.values())
    if not ran:
        typer.echo("extracted nothing: every set was in the store")
    elif unreadable:
        typer.echo(f"read {ran} images: extracted {ran - unreadable}, {unreadable} unreadable (no row in the store)")
    else:
        typer.echo(f"extracted {ran} images")
    if result.run_dir is not None:
        typer.echo(f"results: {result.run_dir / 'results.parquet'}  table: {result.run_dir / 'table.md'}")
    if result.failed:
        raise typer.Exit(SOME_FAILED)


def register(app: typer.Typer) -> None:
    """Add `oodbench evaluate-model` to the main CLI."""
    app.command("evaluate-model")(evaluate_model_command)
