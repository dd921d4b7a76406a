"""`oodbench report RUN_DIR… --out DIR --format md,tex,html` end to end."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.results import write_rows
from oodbench.report.cli import register

from .helpers import VOCABULARIES

runner = CliRunner()
FAST = ["--draws", "100", "--curve-draws", "30", "--resamples", "100", "--quiet"]


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command, as in the main CLI
        pass

    return app


def test_report_writes_tables_figures_and_reports(cli, two_runs, tmp_path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        cli,
        [
            "report",
            *map(str, two_runs),
            "--out",
            str(out),
            "--format",
            "md,tex,html",
            "--figure-format",
            "png",
            "--no-score-figures",
            *FAST,
        ],
    )
    assert result.exit_code == 0, result.output
    for key in ("table1", "tableA1", "tableA2", "tableA6", "intervals", "delong"):
        for fmt in ("md", "tex", "html"):
            assert (out / "tables" / f"{key}.{fmt}").is_file(), f"{key}.{fmt}"
    assert (out / "figures" / "fig1-toy-a.png").is_file() and not list((out / "figures").glob("*.pdf"))
    assert (out / "figures" / "figA4-toy-b.png").is_file()
    assert not list((out / "figures").glob("roc-*"))  # --no-score-figures
    markdown = (out / "report.md").read_text()
    for target in re.findall(r"\]\((figures/[^)]+)\)", markdown):
        assert (out / target).is_file()
    tex = (out / "report.tex").read_text()
    assert tex.count(r"\begin{table}") == len(list((out / "tables").glob("*.tex")))
    assert r"\includegraphics" not in tex  # LaTeX includes PDF figures only, and none were asked for
    table1 = (out / "tables" / "table1.md").read_text()
    assert "| toy-a |" in table1 and "| toy-b |" in table1
    assert "<table" in (out / "report.html").read_text()
    assert "wrote" in result.stdout


def test_report_with_vocabulary_file(cli, zeroshot_rows, tmp_path) -> None:
    write_rows(zeroshot_rows, tmp_path / "zs.parquet")
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(VOCABULARIES))
    out = tmp_path / "out"
    result = runner.invoke(
        cli, ["report", str(tmp_path / "zs.parquet"), "--out", str(out), "--format", "md", "--vocab", str(vocab), *FAST]
    )
    assert result.exit_code == 0, result.output
    assert "oracle (370)†" in (out / "tables" / "table2.md").read_text()
    assert (out / "figures" / "figA1-vocabulary-sweep.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "docx"], "unknown report formats"),
        (["--n", "100000"], "exceeds every OOD set"),
    ],
)
def test_report_errors(cli, two_runs, tmp_path, args, message) -> None:
    result = runner.invoke(cli, ["report", str(two_runs[0]), "--out", str(tmp_path / "o"), *args, *FAST])
    assert result.exit_code == 2 and message in result.stderr


def test_report_rejects_a_directory_without_results(cli, tmp_path) -> None:
    result = runner.invoke(cli, ["report", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no results.parquet" in result.stderr


def test_help_shows_an_example(cli) -> None:
    result = runner.invoke(cli, ["report", "--help"])
    assert result.exit_code == 0 and "Example: oodbench report" in result.stdout


def test_names_stay_unique_when_run_directories_share_a_name(two_runs, tmp_path) -> None:
    import shutil

    from oodbench.report.build import ReportOptions, build_report

    copies = []
    for parent, run in zip("ab", two_runs, strict=False):
        target = tmp_path / parent / "run"
        shutil.copytree(run, target)
        copies.append(target)
    content = build_report(copies, ReportOptions(draws=20, curve_draws=10, curve_points=3, resamples=20))
    keys = [t.key for t in content.tables()]
    stems = [f.stem for f in content.figures()]
    assert len(keys) == len(set(keys)) and len(stems) == len(set(stems))
    assert "prov-run" in keys and "prov-run-2" in keys


def test_report_states_the_convention_and_captions_once(cli, two_runs, tmp_path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        cli, ["report", str(two_runs[0]), "--out", str(out), "--format", "md,tex", "--no-score-figures", *FAST]
    )
    assert result.exit_code == 0, result.output
    markdown = (out / "report.md").read_text()
    overview = markdown.split("## Overview", 1)[1].split("\n## ", 1)[0]
    assert "ID is the positive class" in overview and "OpenOOD" in overview
    tex = (out / "report.tex").read_text()
    captions = re.findall(r"\\caption\{([^}]*)\}", tex)
    assert captions and not [c for c in captions if re.match(r"(Table|Fig\.) [0-9A]+[0-9]*:", c)], captions
    assert r"\caption{Best FPR@95 and AUROC per model and OOD set (paper Table 1)}" in tex


def test_report_defaults_to_a_folder_inside_the_run(cli, two_runs, tmp_path) -> None:
    import shutil

    run = tmp_path / "runs" / "toy"
    shutil.copytree(two_runs[0], run)
    result = runner.invoke(cli, ["report", str(run), "--format", "md", "--no-score-figures", *FAST])
    assert result.exit_code == 0, result.output
    assert (run / "report" / "report.md").is_file() and f"in {run / 'report'}" in result.stdout
    again = runner.invoke(cli, ["report", str(run), "--format", "md", "--no-score-figures", *FAST])
    assert again.exit_code == 0, again.output  # the report folder inside does not disturb reading the run
    both = runner.invoke(cli, ["report", str(run), str(two_runs[1]), "--format", "md", *FAST])
    assert both.exit_code == 2 and "2 runs: give --out for their joint report" in both.stderr
    assert not (tmp_path / "runs" / "report").exists()


def test_a_report_written_again_removes_what_a_killed_write_left(cli, two_runs, tmp_path) -> None:
    """SIGKILL during an atomic write leaves its temporary; the next report over the folder removes it."""
    import os

    out = tmp_path / "out"
    args = ["report", *map(str, two_runs), "--out", str(out), "--format", "md", "--figure-format", "png", *FAST]
    assert runner.invoke(cli, args).exit_code == 0
    figure = next((out / "figures").glob("fig1-*.png"))
    killed = [out / ".report.md.k1ll3d.tmp", figure.parent / f".{figure.name}.x9y8z7.tmp"]
    others = [out / ".notes.txt.abc.tmp", out / "report.md.bak"]  # not the temporary of a file the report writes
    for path in (*killed, *others):
        path.write_bytes(b"half")
        os.utime(path, (1, 1))  # written long before the next report starts
    fresh = out / ".report.md.inflight.tmp"  # a write that began after the report started: left alone
    fresh.write_bytes(b"writing")
    os.utime(fresh, (4e9, 4e9))
    assert runner.invoke(cli, args).exit_code == 0
    assert not any(p.exists() for p in killed)
    assert all(p.exists() for p in (*others, fresh))


def test_an_unknown_plot_detector_is_refused_before_any_work(cli, two_runs, tmp_path) -> None:
    # It used to drop every ROC curve and histogram silently (rc 0).
    out = tmp_path / "o"
    result = runner.invoke(cli, ["report", str(two_runs[0]), "--out", str(out), "--plot-detector", "enrgy", *FAST])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'enrgy'" in lines[0] and "did you mean 'energy'" in lines[0]
    assert "msp" in lines[0]  # the run's detectors are listed
    assert not out.exists()
    result = runner.invoke(cli, ["report", str(two_runs[0]), "--out", str(out), "--plot-detector", "nosuch", *FAST])
    assert result.exit_code == 2 and "'nosuch'" in result.stderr and not out.exists()
