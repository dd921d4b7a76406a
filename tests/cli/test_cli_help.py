"""Every command's help fits 80 columns: examples stay whole commands (shell continuations), no ``<bool>`` tags."""

from __future__ import annotations

import inspect
import re

import pytest
from typer.testing import CliRunner

from oodbench.cli.help import COMMAND, fit_examples
from oodbench.cli.main import app

WIDTH = 80


def _commands(typer_app, path=()):
    for command in typer_app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        yield (*path, name), command.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*path, group.name))


def _logical_lines(text: str) -> list[str]:
    """Lines joined only where a shell continuation (trailing backslash) joins them; whitespace collapsed."""
    joined = re.sub(r"\s*\\[ \t]*\n\s*", " ", text)
    return [" ".join(line.split()) for line in joined.splitlines()]


COMMANDS = sorted(_commands(app))


def _examples(doc: str) -> list[str]:
    """The example commands of a docstring, one per logical line (from the word ``oodbench`` on)."""
    return [line[line.index("oodbench ") :] for line in _logical_lines(doc) if COMMAND.search(line)]


def test_every_command_is_checked() -> None:
    assert len(COMMANDS) > 40 and sum(bool(_examples(inspect.getdoc(cb) or "")) for _, cb in COMMANDS) > 25


@pytest.mark.parametrize("path, callback", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_fits_80_columns(path, callback) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH, env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH
    rendered = " \n ".join(_logical_lines(result.output))
    for example in _examples(inspect.getdoc(callback) or ""):
        assert f" {example} " in f" {rendered} ", f"example cut by wrapping: {example}"


def test_fit_examples_breaks_before_options_and_keeps_prose() -> None:
    line = "Example: oodbench run configs/fi-imagenet-1k.toml --dry-run --set paths.imagenet=/data/imagenet --set a=b"
    prose = "A long sentence about oodbench that goes on and on " * 3
    fitted = fit_examples(f"{line}\n\n{prose}", width=60).splitlines()
    assert fitted[-1] == prose
    command = fitted[:-2]
    assert all(len(part) <= 60 for part in command) and all(part.endswith(" \\") for part in command[:-1])
    assert all(part.lstrip().startswith("--") for part in command[1:])
    assert " ".join(p.removesuffix(" \\").strip() for p in command) == line


def _options(path):
    from typer.main import get_command

    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return {name for param in command.params for name in (*param.opts, *getattr(param, "secondary_opts", ()))}


PROGRESS_COMMANDS = [
    ("evaluate",),
    ("evaluate-model",),
    ("demo",),
    ("extract",),
    ("run",),
    ("report",),
    ("analyze", "subsample"),
    ("analyze", "ci"),
    ("audit", "fingerprint"),
    ("audit", "battery"),
    ("zeroshot", "evaluate"),
    ("zeroshot", "vocab", "build", "siblings"),
    ("annotate", "describe"),
]


@pytest.mark.parametrize("path", PROGRESS_COMMANDS, ids=[" ".join(p) for p in PROGRESS_COMMANDS])
def test_progress_bars_are_switched_with_one_vocabulary(path) -> None:
    assert {"--progress", "--no-progress"} <= _options(path)


def test_no_command_knows_quiet_without_no_progress() -> None:
    for path, _ in COMMANDS:
        options = _options(path)
        assert "--quiet" not in options or "--no-progress" in options, path


def _panel_lines(output: str, title: str) -> list[str]:
    """The inside of every panel called `title` (one string per line, the borders removed)."""
    lines, inside = [], False
    for line in output.splitlines():
        if line.startswith(f"╭─ {title} "):
            inside = True
        elif line.startswith("╰"):
            inside = False
        elif inside:
            lines.append(line[1:-1])
    return lines


@pytest.mark.parametrize("path, callback", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_option_descriptions_keep_a_readable_width_at_80_columns(path, callback) -> None:
    # Before: five columns (option, short, negative flag, type, description) left descriptions 17 characters.
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH, env={"COLUMNS": str(WIDTH)})
    lines = _panel_lines(result.output, "Options")
    # A description's continuation lines (the option column blank) all start in one column, 40 or more from the end.
    starts = {len(line) - len(line.lstrip()) for line in lines if line.strip() and line[:8].isspace()}
    assert len(starts) <= 1 and all(WIDTH - start >= 40 for start in starts), (starts, result.output)
    assert any("--help  " in line and "Show this message and exit." in line for line in lines)


@pytest.mark.parametrize("path", [("evaluate",), ("evaluate-model",)])
def test_small_fit_set_help_lists_its_values(path) -> None:
    from oodbench.detectors.fitsize import SMALL_FIT_SET

    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH, env={"COLUMNS": str(WIDTH)})
    rows = " ".join(" ".join(_panel_lines(result.output, "Options")).split())
    description = rows[rows.index("--small-fit-set <str>") + len("--small-fit-set <str>") :].split()
    # The description opens with the values: "fail (...) or adapt ..." / "fail or adapt, ...".
    assert description[0] == SMALL_FIT_SET[0] and f"or {SMALL_FIT_SET[1]}" in " ".join(description[:20])
