"""`oodbench analyze …` end to end on a real (synthetic-feature) evaluation run directory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core import metrics
from oodbench.core.scores import load_scores
from oodbench.report.analyze import register

runner = CliRunner()


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps `analyze` a sub-group, as in the main CLI
        pass

    return app


def test_subsample_writes_table_json_and_figure(cli, synthetic_run, tmp_path) -> None:
    out, figure = tmp_path / "sub.json", tmp_path / "curves.png"
    result = runner.invoke(
        cli,
        [
            "analyze",
            "subsample",
            str(synthetic_run),
            "--n",
            "50",
            "--n",
            "100",
            "--draws",
            "200",
            "--out",
            str(out),
            "--figure",
            str(figure),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Table A6" in result.stdout and "| far |" in result.stdout and "ratio" in result.stdout
    payload = json.loads(out.read_text())
    assert [entry["n"] for entry in payload["results"]] == [50, 100]
    far = next(s for s in payload["results"][1]["summaries"] if s["ood_dataset"] == "far")
    scores_id = load_scores(synthetic_run, "toy-model", "id-test")[far["detector"]]
    scores_far = load_scores(synthetic_run, "toy-model", "far")[far["detector"]]
    assert far["full"] == metrics.fpr_at_tpr(scores_id, scores_far)
    assert far["draws"] == 200 and far["n_total"] == 260
    with Image.open(figure) as image:
        assert image.size[0] > 300 and np.asarray(image.convert("L")).std() > 5


def test_subsample_default_n_is_auto_and_written_into_the_run(cli, synthetic_run) -> None:
    result = runner.invoke(cli, ["analyze", "subsample", str(synthetic_run), "--draws", "50", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "n=auto resolved to n=110" in result.stderr
    payload = json.loads((synthetic_run / "analysis" / "subsample.json").read_text())
    assert payload["results"][0]["n"] == 110


def test_ci_and_compare(cli, synthetic_run, tmp_path) -> None:
    out = tmp_path / "ci.json"
    result = runner.invoke(
        cli,
        [
            "analyze",
            "ci",
            str(synthetic_run),
            "--detector",
            "energy",
            "--dataset",
            "far",
            "--resamples",
            "300",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Wilson" in result.stdout and "BCa" in result.stdout and "DeLong" in result.stdout
    assert "Confidence intervals of the detectors named on the OOD sets named" in result.stdout
    assert "best detector" not in result.stdout
    record = json.loads(out.read_text())["records"][0]
    assert record["detector"] == "energy" and record["ood_dataset"] == "far"
    wilson = record["intervals"]["fpr95/wilson"]
    assert wilson["low"] <= wilson["estimate"] <= wilson["high"]

    every = runner.invoke(cli, ["analyze", "ci", str(synthetic_run), "--resamples", "50", "--quiet"])
    assert every.exit_code == 0, every.output
    assert "Confidence intervals of every detector on every OOD set" in every.stdout
    listed = {line.split("|")[2].strip() for line in every.stdout.splitlines() if line.startswith("| ") and "[" in line}
    assert len(listed) > 1  # it lists them all, as its title says

    result = runner.invoke(cli, ["analyze", "compare", str(synthetic_run), "--a", "energy", "--b", "msp"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ") and "energy" in line]
    assert len(lines) == 3  # one per OOD set


@pytest.mark.parametrize(
    "args, message",
    [
        (["subsample", "{run}", "--n", "5000"], "exceeds every OOD set"),
        (["subsample", "{missing}"], "no run directory"),
        (["ci", "{run}", "--method", "jackknife-after-bootstrap"], "unknown interval methods"),
        (["compare", "{run}", "--a", "energy", "--b", "energy"], "two different detectors"),
        (["compare", "{run}", "--a", "energy", "--b", "knn"], "no saved scores for knn"),
    ],
)
def test_errors_are_clear(cli, synthetic_run, tmp_path, args, message) -> None:
    args = [a.format(run=synthetic_run, missing=tmp_path / "nope") for a in args]
    result = runner.invoke(cli, ["analyze", *args, "--quiet"] if args[0] in ("subsample", "ci") else ["analyze", *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_help_shows_examples(cli) -> None:
    for command in ("subsample", "ci", "compare"):
        result = runner.invoke(cli, ["analyze", command, "--help"])
        assert result.exit_code == 0 and "Example: oodbench analyze" in result.stdout


def test_a_flat_bootstrap_interval_beside_wilson_is_explained() -> None:
    """FPR@95 of 0: every resample gives 0, so the bootstrap says [0, 0] while Wilson's upper end is 1.3 % (n = 300)."""
    from statistics import NormalDist

    import numpy as np

    from oodbench.analysis.runs import interval_record
    from oodbench.report.tables import table_intervals

    rng = np.random.default_rng(0)
    ids = rng.normal(5.0, 1.0, 400)
    far = rng.normal(-20.0, 1.0, 300)  # below every ID score: no OOD image accepted
    near = rng.normal(4.0, 1.0, 300)
    flat = interval_record("m", "id", "far", "energy", ids, far, resamples=200, seed=0)
    spread = interval_record("m", "id", "near", "energy", ids, near, resamples=200, seed=0)
    wilson, boot = flat.intervals["fpr95/wilson"], flat.intervals["fpr95/percentile"]
    z = NormalDist().inv_cdf(0.975)  # Wilson's upper end with 0 of n accepted is z²/(n + z²), in closed form
    assert boot.low == boot.high == 0.0 and wilson.high == pytest.approx(z**2 / (300 + z**2), rel=1e-12)
    table = table_intervals([flat, spread])
    assert len(table.notes) == 2 and "(far/energy)" in table.notes[1] and "near" not in table.notes[1]
    assert "300 OOD images, upper end 1.3 %" in table.notes[1] and "every bootstrap resample" in table.notes[1]
    assert table.title == "Confidence intervals per OOD set and detector"
    assert len(table_intervals([spread]).notes) == 1  # no flat interval, no note
