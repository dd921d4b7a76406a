"""Printed tables: whole names and content width when piped, a legend under every table."""

from __future__ import annotations

import io

import pytest
from rich.table import Table
from typer.testing import CliRunner

from oodbench.cli.main import app
from oodbench.util.terminal import print_table, table_markdown

runner = CliRunner()


def test_markdown_keeps_every_name_whole_and_strips_markup() -> None:
    table = Table("name", "status", title="datasets")
    table.add_row("a-very-long-dataset-name-that-a-terminal-would-cut", "[green]ok[/green]")
    table.add_row("b|c", "missing")
    text = table_markdown(table, "status: ok or missing")
    lines = text.splitlines()
    assert lines[0] == "datasets" and lines[-1] == "status: ok or missing"
    assert "| a-very-long-dataset-name-that-a-terminal-would-cut | ok      |" in lines
    assert "| b\\|c" in text and "[green]" not in text
    assert len({len(line) for line in lines[2:-2]}) == 1  # one width: the widest cell's, not the console's


def test_print_table_on_a_pipe_is_markdown() -> None:
    out = io.StringIO()  # not a terminal
    table = Table("x")
    table.add_row("1")
    print_table(table, legend="x: a number", file=out)
    assert out.getvalue() == "| x   |\n|-----|\n| 1   |\n\nx: a number\n"


def test_datasets_list_piped_keeps_names_whole() -> None:
    from oodbench.extract.dataset_registry import REGISTRY

    result = runner.invoke(app, ["datasets", "list"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    rows = {line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")}
    assert set(REGISTRY) <= rows
    assert all(line == line.rstrip() for line in result.stdout.splitlines())  # no padding to a fixed width


@pytest.mark.parametrize(
    "args, legend",
    [
        (["datasets", "list"], "published images:"),
        (["datasets", "check", "--root", "."], "status: ok, missing"),
        (["detectors"], "requires: the arrays"),
        (["zeroshot", "scores"], "needs: what the score reads"),
    ],
)
def test_every_printed_table_has_a_legend(args, legend) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert legend in result.stdout
    assert all(line == line.rstrip() for line in result.stdout.splitlines())  # no padding to a fixed width


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path) -> None:
    """`oodbench … | head`: stdout closed before the command writes; no 'unexpected' line, no log file."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "OODBENCH_LOG_DIR": str(tmp_path),
    }
    code = "from oodbench.cli import main; main(['datasets', 'list'])"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    child.stdout.close()  # the reader leaves before the child (still importing) writes anything
    _, err = child.communicate(timeout=120)
    assert "unexpected" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    assert child.returncode == 1 and err == ""  # click's rule for a closed pipe: status 1, nothing printed
    assert not list(tmp_path.iterdir())
