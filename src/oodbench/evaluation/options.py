"""The evaluation's command-line options, declared once for every front end (`evaluate`, `evaluate-model`, `run`).

Each is a typed `Annotated` alias: the command gives the default (`run` takes None for "as the experiment file
says"), the option's name and help are the same everywhere. Every one of them becomes a field of `EvaluationSpec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "Aupr",
    "Convention",
    "Csid",
    "Detectors",
    "GramDtype",
    "Groups",
    "Param",
    "Plugin",
    "SaveDetectors",
    "SmallFitSet",
    "Strict",
    "Tpr",
    "Verify",
]

Detectors = Annotated[
    list[str] | None,
    typer.Option(
        "--detectors",
        "-d",
        help="Comma-separated names; all (every registered one), paper (the paper's 21), peers (those OpenOOD or "
        "pytorch-ood implement), -NAME leaves one out (all,-she,-openmax); repeated, the lists are joined; "
        "default: all.",
    ),
]


def joined_selection(detectors: list[str] | None) -> str | None:
    """The -d values as one comma-separated selection: `-d msp -d energy` selects both, as `-d msp,energy`."""
    return ",".join(detectors) if detectors else None


Param = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="Detector hyper-parameter DETECTOR.PARAM=VALUE (repeatable)."),
]
Tpr = Annotated[float | None, typer.Option("--tpr", help="ID acceptance rate of the FPR threshold.")]
Convention = Annotated[
    str | None,
    typer.Option(
        "--convention",
        help="Metric convention of the table: oodbench (ID positive), or openood (OOD-positive FPR@95 and "
        "trapezoidal AUPR, as OpenOOD v1.5 and pytorch-ood; its rows are added as openood.*).",
    ),
]
Aupr = Annotated[bool, typer.Option("--aupr", help="Add AUPR-In and AUPR-Out to the table's cells.")]
Groups = Annotated[
    str | None,
    typer.Option(
        "--groups",
        help="OOD groups with group means: a groups TOML file or a shipped name (default with --convention "
        "openood: openood-v1.5-imagenet, OpenOOD's near / far).",
    ),
]
Csid = Annotated[
    list[str] | None,
    typer.Option(
        "--csid",
        help="Covariate-shifted ID set (e.g. imagenet-v2; repeatable): scored, and counted as ID in a "
        "full-spectrum table beside the standard one.",
    ),
]
SmallFitSet = Annotated[
    str | None,
    typer.Option(
        "--small-fit-set",
        help="fail (name every parameter the fit set is too small for, before any work) or adapt (scale those "
        "defaults to the fit set and leave out what cannot run, recorded in run.json).",
    ),
]
GramDtype = Annotated[
    str | None,
    typer.Option(
        "--gram-dtype",
        help="Precision of the Gram matrices the Gaussian-family fits share: float64, or float32 (about twice "
        "the speed, within a proven bound; docs/detectors.md).",
    ),
]
Strict = Annotated[
    bool, typer.Option("--strict", help="Fail (instead of skip) when a detector's requirements are not met.")
]
Verify = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="Check every byte of the store entries against their checksums even if this run directory did already.",
    ),
]
Plugin = Annotated[
    list[str] | None,
    typer.Option("--plugin", help="Import MODULE (or a .py file) to register its detectors (repeatable)."),
]
SaveDetectors = Annotated[
    Path | None,
    typer.Option("--save-detectors", help="Keep each fitted detector in DIR/<name> (reload with `oodbench score`)."),
]
