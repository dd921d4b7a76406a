"""Parsing of `DETECTOR.PARAM=VALUE` command-line options, shared by every command that takes detector parameters."""

from __future__ import annotations

import json
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
        params.setdefault(detector, {})[key] = value
    return params
