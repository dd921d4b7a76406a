"""`analyze subsample` with several --n, one of them larger than every OOD set: the others are written."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from oodbench.analysis.rundata import load_run
from oodbench.analysis.subsample import subsample_run
from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import AnalysisError
from oodbench.report.analyze import register

runner = CliRunner()


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer(cls=OodbenchGroup)
    register(app)

    @app.command("noop")
    def noop() -> None:  # keeps `analyze` a sub-group, as in the main CLI
        pass

    return app


def test_an_n_too_large_for_every_set_is_skipped_with_a_note(cli, synthetic_run, tmp_path) -> None:
    out, figure = tmp_path / "sub.json", tmp_path / "curves.png"
    args = ["analyze", "subsample", str(synthetic_run), "--n", "50", "--n", "655", "--n", "100", "--draws", "50"]
    result = runner.invoke(cli, [*args, "--out", str(out), "--figure", str(figure)])
    assert result.exit_code == 0, result.output
    assert "n=655 exceeds every OOD set" in result.stderr and "skipped" in result.stderr
    assert [entry["n"] for entry in json.loads(out.read_text())["results"]] == [50, 100]
    assert figure.is_file() and figure.stat().st_size > 0


def test_every_n_too_large_is_still_an_error(cli, synthetic_run, tmp_path) -> None:
    result = runner.invoke(cli, ["analyze", "subsample", str(synthetic_run), "--n", "5000", "--n", "6000"])
    assert result.exit_code == 2 and "exceeds every OOD set" in result.stderr


def test_library_skips_only_when_asked(synthetic_run) -> None:
    run = load_run(synthetic_run)
    with pytest.raises(AnalysisError, match="pass a smaller n"):
        subsample_run(run, 5000, draws=10, progress=False)
    studies, notes = subsample_run(run, 5000, draws=10, progress=False, skip_too_large=True)
    assert studies == [] and notes == [notes[0]] and notes[0].endswith("; skipped")
