"""Parsing of `DETECTOR.PARAM=VALUE` command-line options, shared by every command that takes detector parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def parse_params(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """`detector.key=value` strings to {detector: {key: value}}; values parsed as JSON when possible."""
    params: dict[str, dict[str, Any]] = {}
    for item in items or []:
        target, sep, raw = item.partition("=")
        detector, dot, key = target.partition(".")
        if not sep or not dot or not detector or not key:
            raise typer.BadParameter(f"{item!r}: expected DETECTOR.PARAM=VALUE, e.g. knn.k=50")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare string such as index=ivf
        except RecursionError:
            raise typer.BadParameter(f"{item!r}: the value is nested too deeply") from None
        params.setdefault(detector, {})[key] = value
    return params


def inside(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or lies under it (symbolic links resolved; neither need exist)."""
    path, directory = path.expanduser().resolve(), directory.expanduser().resolve()
    return path == directory or directory in path.parents


def refuse_inside(output: tuple[str, Path | None], *inputs: tuple[str, Path]) -> None:
    """BadParameter when the output option's path lies inside one of the inputs (writing there would alter them)."""
    option, path = output
    if path is None:
        return
    for name, given in inputs:
        if inside(path, given):
            raise typer.BadParameter(f"{option} {path} lies inside {name} {given}; an output must not alter an input")
