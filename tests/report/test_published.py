"""`oodbench report … --against fi-imagenet-1k`: the paper's tables with the run's values beside them."""

from __future__ import annotations

import csv

import pytest
import typer
from typer.testing import CliRunner

from oodbench.analysis.published import load_published
from oodbench.cli.main import OodbenchGroup
from oodbench.report.cli import register

runner = CliRunner()
FAST = ["--draws", "50", "--curve-draws", "20", "--resamples", "50", "--quiet", "--no-score-figures"]


def _cli() -> typer.Typer:
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    app.command("noop")(lambda: None)
    return app


def test_against_renders_every_published_table_beside_the_run(paper_runs, tmp_path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        _cli(),
        [
            "report",
            *map(str, paper_runs),
            "--out",
            str(out),
            "--format",
            "md,html",
            "--figure-format",
            "png",
            "--against",
            "fi-imagenet-1k",
            *FAST,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "against fi-imagenet-1k: " in result.output and "(of 1273 published cells)" in result.output
    for key in ("1", "2", "3", "A1", "A2", "A3", "A4", "A5", "A6", "A7"):
        assert (out / "tables" / f"paper-table{key}.md").is_file(), key
    assert (out / "figures" / "top1-vs-fpr95.png").is_file()
    with (out / "published-comparison.csv").open() as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == len(load_published())  # every published cell has a place
    done = [r for r in records if r["reproduced"]]
    by_key = {(r["table"], r["model"], r["dataset"], r["detector"], r["metric"]): r for r in records}
    # ResNet50's energy FPR@95 on Fi-ImageNet-1k (Table A1) is the run's energy row; Δ = reproduced − published.
    energy = by_key[("A1", "ResNet50", "Fi-ImageNet-1k", "energy", "fpr95")]
    assert energy["run_model"] == "resnet50.a1_in1k" and energy["interval"] == "wilson"
    assert abs(float(energy["delta"]) - (float(energy["reproduced"]) - 88.9)) < 1e-9
    # AUROC cells get DeLong intervals from the per-image scores.
    auroc = by_key[("A1", "ResNet50", "Fi-ImageNet-1k", "energy", "auroc")]
    assert auroc["interval"] == "delong" and float(auroc["low"]) < float(auroc["reproduced"]) < float(auroc["high"])
    # Detectors the run lacks stay empty; the Top-1 (ReaL) cell reads accuracy.json.
    assert by_key[("A1", "ResNet50", "Fi-ImageNet-1k", "rmaha++", "fpr95")]["reproduced"] == ""
    assert float(by_key[("1", "ResNet50", "Fi-ImageNet-1k", "", "top1")]["reproduced"]) == pytest.approx(84.9)
    # Table 3 (EVA02-L-448) has NINCO and Textures from the run, n included.
    assert by_key[("3", "EVA02-L-448", "NINCO", "", "n")]["reproduced"] == "260.0"
    assert all(r["verdict"] in ("reproduced", "within sampling error", "differs") for r in done)
    assert {r["verdict"] for r in records if not r["reproduced"]} == {"not in the run"}
    table1 = (out / "tables" / "paper-table1.md").read_text()
    assert "| Top-1 | Top-1 (ReaL) |" in table1
    assert "80.1" in table1  # original-label Top-1 of ResNet50
    a7 = (out / "tables" / "paper-tableA7.md").read_text()
    assert "Spearman ρ" in a7 and "paper −0.61" in a7 and "Appendix E's 26 models" in a7
    # The header counts the verdicts per table.
    summary = (out / "tables" / "paper-summary.md").read_text()
    assert "| published table | cells | reproduced | within sampling error | differs | not in the run |" in summary
    counts = {v: sum(r["verdict"] == v for r in records) for v in ("reproduced", "within sampling error", "differs")}
    total_line = next(line for line in summary.splitlines() if line.startswith("| all tables"))
    assert total_line.split("|")[2:7] == [
        f" {len(records)} ",
        f" {counts['reproduced']} ",
        f" {counts['within sampling error']} ",
        f" {counts['differs']} ",
        f" {len(records) - len(done)} ",
    ]
    # The report's own Table 1 (no --against needed) carries the Top-1 columns of accuracy.json too.
    own = (out / "tables" / "table1.md").read_text()
    assert "| model | Top-1 | Top-1 (ReaL) |" in own and "| resnet50.a1_in1k | 80.1 | 84.9 |" in own
    html = (out / "report.html").read_text()
    assert "Beside the Fi-ImageNet-1k paper" in html and "(paper Table A3)" in html


def test_against_an_unknown_set_or_unmatched_models_says_so(two_runs, tmp_path) -> None:
    result = runner.invoke(
        _cli(), ["report", str(two_runs[0]), "--out", str(tmp_path / "a"), "--against", "nope", *FAST]
    )
    assert result.exit_code == 2 and "unknown published set 'nope'" in result.output
    result = runner.invoke(
        _cli(),
        [
            "report",
            str(two_runs[0]),
            "--out",
            str(tmp_path / "b"),
            "--format",
            "md",
            "--against",
            "fi-imagenet-1k",
            *FAST,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "no model of the runs (toy-a) names a model" in result.output
