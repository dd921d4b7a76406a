"""Progress, the one helper every command uses: on stderr; rich bars on a terminal, plain lines in a log file.

A rich bar redrawn in place is unreadable once stderr is a file or a pipe (rich prints only its last frame, cut to
80 columns). There `make_progress` gives `PlainProgress` instead, with the same interface: one whole line per
tenth of a task, at least every `PLAIN_EVERY_S` seconds while it runs, and one when it ends.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = [
    "PLAIN_EVERY_S",
    "PlainProgress",
    "console",
    "forget_work",
    "interrupted_line",
    "make_progress",
    "note_work",
    "progress_bar",
    "work_topics",
]

console = Console(stderr=True)
PLAIN_EVERY_S = 30.0  # longest silence of a running task in a log file


class _Rate(ProgressColumn):
    """Items per second, e.g. ``  412.3 img/s``."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Any) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"  -- {self.unit}/s" if speed is None else f"{speed:7.1f} {self.unit}/s")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class PlainProgress(Progress):
    """A `Progress` that draws nothing and writes plain, whole lines to stderr (for log files and pipes)."""

    def __init__(self, *columns: Any, rate_unit: str | None = None, transient: bool = False, **options: Any) -> None:
        super().__init__(*columns, disable=True, **options)
        self.rate_unit = rate_unit
        self.transient = transient  # a transient task reports only while it runs, not its end
        self._last: dict[TaskID, tuple[float, int]] = {}  # task -> (time of its last line, tenths reported)
        self._ended: set[TaskID] = set()

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        task = self._tasks[task_id]
        self._last[task_id] = (time.monotonic(), self._tenths(task.completed, task.total))
        return task_id

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._report(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._report(task_id)

    @staticmethod
    def _tenths(completed: float, total: float | None) -> int:
        return int(10 * completed / total) if total else 0

    def line(self, task_id: TaskID) -> str:
        """The task's state in one line, e.g. ``fit: 40/84 (47%), 6.7 img/s, 0:00:06 elapsed, 0:00:07 left``."""
        task = self._tasks[task_id]
        done = f"{task.completed:g}" + ("" if task.total is None else f"/{task.total:g}")
        parts = [f"{task.description}: {done}"]
        if task.total:
            parts[0] += f" ({100 * task.completed / task.total:.0f}%)"
        speed = task.finished_speed or task.speed
        if speed and self.rate_unit:
            parts.append(f"{speed:.1f} {self.rate_unit}/s")
        elapsed = task.finished_time if task.finished else task.elapsed
        parts.append(f"{_clock(elapsed or 0.0)} elapsed")
        if not task.finished and task.time_remaining is not None:
            parts.append(f"{_clock(task.time_remaining)} left")
        return ", ".join(parts)

    def _report(self, task_id: TaskID) -> None:
        task = self._tasks[task_id]
        if task_id in self._ended:
            return
        now = time.monotonic()
        last_time, last_tenths = self._last[task_id]
        tenths = self._tenths(task.completed, task.total)
        if task.finished:
            self._ended.add(task_id)
            if self.transient:
                return
        elif tenths <= last_tenths and now - last_time < PLAIN_EVERY_S:
            return
        elif self.transient and now - last_time < PLAIN_EVERY_S:
            return
        self._last[task_id] = (now, tenths)
        print(self.line(task_id), file=sys.stderr, flush=True)


def make_progress(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False) -> Progress:
    """A rich Progress with description, bar, counts, (optionally) a rate in `rate_unit`/s, elapsed time and ETA;
    a `PlainProgress` when stderr is not a terminal; a silent one when not `enabled`."""
    columns: list[ProgressColumn] = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
    if rate_unit is not None:
        columns.append(_Rate(rate_unit))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    if enabled and not (console.is_terminal or console.is_jupyter):
        return PlainProgress(*columns, rate_unit=rate_unit, transient=transient)
    return Progress(*columns, console=console, disable=not enabled, transient=transient)


@contextlib.contextmanager
def progress_bar(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False) -> Iterator[Progress]:
    """`make_progress`, started for the duration of the block."""
    progress = make_progress(enabled, rate_unit=rate_unit, transient=transient)
    with progress:
        yield progress


# What the running command has finished, kept and lost, by topic, for the one line printed when it is interrupted.
_WORK: dict[str, dict[str, str]] = {}


def note_work(topic: str, *, finished: str | None = None, kept: str | None = None, lost: str | None = None) -> None:
    """Record (or update; "" clears) what the running command has finished, where it is kept, and what is lost."""
    entry = _WORK.setdefault(topic, {})
    for key, value in (("finished", finished), ("kept", kept), ("lost", lost)):
        if value is not None:
            entry[key] = value


def work_topics() -> list[str]:
    """The topics recorded so far."""
    return list(_WORK)


def forget_work() -> None:
    """Start a new command with nothing recorded."""
    _WORK.clear()


def interrupted_line(command: str) -> str:
    """One line for Ctrl-C: what was finished, what was kept (or lost), and the command that resumes the work."""

    def gather(key: str) -> list[str]:
        return list(dict.fromkeys(entry[key] for entry in _WORK.values() if entry.get(key)))

    finished, kept, lost = gather("finished"), gather("kept"), gather("lost")
    parts = [f"finished {'; '.join(finished)}" if finished else "nothing finished"]
    parts.append(f"kept {'; '.join(kept)}" if kept else "nothing kept")
    parts += [f"lost {item}" for item in lost]
    parts.append(f"to {'resume' if kept else 'start again'}, run: {command}")
    return "interrupted: " + "; ".join(parts)
