"""Progress bars (rich), the one helper every command uses: on stderr, quiet when disabled or not a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["console", "make_progress", "progress_bar"]

console = Console(stderr=True)


class _Rate(ProgressColumn):
    """Items per second, e.g. ``  412.3 img/s``."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"  -- {self.unit}/s" if speed is None else f"{speed:7.1f} {self.unit}/s")


def make_progress(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False) -> Progress:
    """A rich Progress with description, bar, counts, (optionally) a rate in `rate_unit`/s, elapsed time and ETA."""
    columns: list[ProgressColumn] = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
    if rate_unit is not None:
        columns.append(_Rate(rate_unit))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console, disable=not enabled, transient=transient)


@contextlib.contextmanager
def progress_bar(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False) -> Iterator[Progress]:
    """`make_progress`, started for the duration of the block."""
    progress = make_progress(enabled, rate_unit=rate_unit, transient=transient)
    with progress:
        yield progress
