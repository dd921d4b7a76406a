"""The `oodbench` command run in-process, with its click command built once per test session.

typer builds the whole click command tree from the typer app on every call, in `CliRunner.invoke(app, …)` and in
`app(…)` (about 0.2 s for oodbench's, more on a loaded machine); a suite that runs hundreds of command lines builds
it once here. The command is the one the console script runs (`oodbench.cli.main.app`, which no test changes), so
exit codes and output are exactly those of `CliRunner().invoke(app, args)` and `oodbench.cli.main.main(argv)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any
from unittest import mock

import typer.main
import typer.testing


@cache
def command() -> Any:
    """The click command of the `oodbench` app, built once."""
    from oodbench.cli.main import app

    return typer.main.get_command(app)


@contextlib.contextmanager
def _built_once() -> Iterator[None]:
    """typer's `get_command` answers the built command for the `oodbench` app (any other app is built as usual)."""
    from oodbench.cli.main import app

    build, built = typer.main.get_command, command()

    def get_command(given: Any) -> Any:
        return built if given is app else build(given)

    with (
        mock.patch.object(typer.testing, "_get_command", get_command),
        mock.patch.object(typer.main, "get_command", get_command),
    ):
        yield


def invoke(args: Sequence[str], **options: Any) -> typer.testing.Result:
    """`CliRunner().invoke(app, args, **options)` without rebuilding the command tree."""
    from oodbench.cli.main import app

    with _built_once():
        return typer.testing.CliRunner().invoke(app, list(args), **options)


def main(argv: Sequence[str]) -> None:
    """`oodbench.cli.main.main(argv)`, the console entry point, without rebuilding the command tree."""
    from oodbench.cli.main import main as entry

    with _built_once():
        entry(argv)
