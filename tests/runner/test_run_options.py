"""`oodbench run` has every option of `oodbench evaluate`, as options, as experiment-file keys and in Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import ConfigError
from oodbench.core.metrics import fpr_at_tpr, fpr_at_tpr_ood_positive
from oodbench.core.results import read_rows
from oodbench.core.scores import load_scores
from oodbench.detectors import available, create
from oodbench.runner.cli import evaluation_overrides

from .helpers import CONFIGS, FAST_DEMO, demo_config


def _app() -> typer.Typer:
    from oodbench.runner.cli import register

    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `run` a named sub-command
    return app


def test_evaluate_options_in_the_experiment_file_and_in_python(tmp_path: Path) -> None:
    config = demo_config(
        tmp_path,
        'evaluation.convention="openood"',
        "evaluation.aupr=true",
        'evaluation.small_fit_set="adapt"',
        'id.csid=["lfw-faces"]',
        'ood.datasets=["digits-6to9","noise"]',
        'detectors.include="all,-tempscale,-she,-openmax"',
    )
    spec = config.evaluation
    assert (spec.convention, spec.aupr, spec.small_fit_set, spec.csid) == ("openood", True, "adapt", ("lfw-faces",))
    assert spec.groups is not None and "near" in spec.groups.groups  # openood's default groups, as in evaluate
    assert "she" not in config.detectors and "openmax" not in config.detectors and "msp" in config.detectors
    assert config.datasets_of(config.classifiers[0]) == [
        "digits-fit",
        "digits-id-test",
        "lfw-faces",
        "digits-6to9",
        "noise",
    ]
    # Resolved parameters beside the parameters as given (what adapt may change).
    assert config.detectors["knn"] == create("knn", k=10).get_params() and spec.detectors["knn"] == {"k": 10}
    # The options of `oodbench evaluate` map to the same keys.
    overrides = evaluation_overrides(
        detectors="all,-she", param=["knn.k=5"], convention="openood", aupr=True, csid=["lfw-faces"], strict=True
    )
    assert 'evaluation.convention="openood"' in overrides and 'id.csid=["lfw-faces"]' in overrides
    assert "detectors.params.knn.k=5" in overrides and "evaluation.strict=true" in overrides
    for bad, key in (
        ('evaluation.convention="both"', "evaluation.convention"),
        ('evaluation.small_fit_set="shrink"', "evaluation.small_fit_set"),
        ('id.csid=["digits-fit"]', "used twice"),
        ('detectors.include="all,-nope"', "unknown detector 'nope'"),
    ):
        with pytest.raises(ConfigError, match=key):
            demo_config(tmp_path, bad)


@pytest.mark.slow
def test_run_with_evaluate_options_reuses_the_scores_and_writes_the_openood_tables(demo_copy: Path) -> None:
    """--convention openood --aupr --csid on a finished demo: the fits and scores are reused (their keys do not
    depend on the table), the run directory gets OpenOOD's rows and the full-spectrum table."""
    sets = [arg for item in FAST_DEMO for arg in ("--set", item)]
    args = ["run", str(CONFIGS / "demo.toml"), "--out", str(demo_copy), "--no-progress", *sets]
    options = [
        "--convention",
        "openood",
        "--aupr",
        "--csid",
        "lfw-faces",
        "--set",
        'ood.datasets=["digits-6to9","noise"]',
    ]
    result = CliRunner().invoke(_app(), [*args, *options])
    assert result.exit_code == 0, result.output
    assert "fit       ran      0" in result.output and "score     ran      0" in result.output
    run = demo_copy / "runs" / "digits-cnn"
    info = json.loads((run / "run.json").read_text())
    assert info["convention"] == "openood" and info["csid_datasets"] == ["lfw-faces"]
    rows = {(r.ood_dataset, r.detector, r.metric): r.value for r in read_rows(run / "results.parquet")}
    id_scores, noise = load_scores(run, "digits-cnn", "digits-id-test"), load_scores(run, "digits-cnn", "noise")
    expected = fpr_at_tpr_ood_positive(id_scores["energy"], noise["energy"])
    assert rows[("noise", "energy", "openood.fpr95")] == expected
    table = (run / "table.md").read_text()
    assert "AUPR" in table and "lfw-faces" in table  # AUPR cells; the covariate-shifted set in the full spectrum
    assert {"msp", "energy"} <= set(load_scores(run, "digits-cnn", "lfw-faces"))  # the csid set is scored
    result = CliRunner().invoke(_app(), [*args, "--convention", "both"])
    assert result.exit_code == 2 and "evaluation.convention" in result.output


def test_detector_selection_leaves_out_what_it_names(tmp_path: Path) -> None:
    config = demo_config(tmp_path, 'detectors.include="all,-tempscale,-she"')
    assert list(config.detectors) == [n for n in available() if n not in ("tempscale", "she")]


# ----------------------------------------------------------------------------------------------- the threshold's TPR
def _keys(config: object, stage: str) -> dict[str, str]:
    from oodbench.runner.plan import build_plan

    return {u.id: u.key for u in build_plan(config).stage(stage)}  # type: ignore[arg-type]


def test_tpr_enters_the_metrics_keys_and_nothing_upstream(tmp_path: Path) -> None:
    """Scores do not depend on the threshold: a changed tpr keeps every fit and score key, changes the metrics'."""
    default, other = demo_config(tmp_path), demo_config(tmp_path, "experiment.tpr=0.8")
    for stage in ("extract", "fit", "score"):
        assert _keys(default, stage) == _keys(other, stage), stage
    for stage in ("metrics", "analysis", "report"):
        before, after = _keys(default, stage), _keys(other, stage)
        assert before.keys() == after.keys() and all(before[u] != after[u] for u in before), stage


@pytest.mark.parametrize("tpr", [1.0, 1, 0.5])
def test_tpr_lies_in_zero_to_one_as_in_evaluate(tmp_path: Path, tpr: float) -> None:
    config = demo_config(tmp_path, f"experiment.tpr={tpr}")
    assert config.tpr == config.evaluation.tpr == tpr


@pytest.mark.parametrize("tpr", [0, 0.0, -0.1, 1.5, "nan"])
def test_tpr_outside_zero_to_one_names_the_key(tmp_path: Path, tpr: object) -> None:
    with pytest.raises(ConfigError, match=r"^experiment\.tpr: "):
        demo_config(tmp_path, f"experiment.tpr={tpr}")


@pytest.mark.slow
def test_changed_tpr_reruns_the_metrics_and_no_fit_or_score(demo_copy: Path) -> None:
    """`--tpr 1.0` after a finished run: every fit and score unit is cached, the tables are rewritten at TPR 1."""
    from oodbench.runner.executor import run_experiment

    report = run_experiment(demo_config(demo_copy, "experiment.tpr=1.0"), progress=False)
    assert report.executed["extract"] == report.executed["fit"] == report.executed["score"] == []
    assert report.cached["score"] and "metrics:digits-cnn" in report.executed["metrics"]
    assert report.executed["analysis"] and report.executed["report"]
    run = demo_copy / "runs" / "digits-cnn"
    rows = {(r.ood_dataset, r.detector, r.metric): r.value for r in read_rows(run / "results.parquet")}
    id_scores, noise = load_scores(run, "digits-cnn", "digits-id-test"), load_scores(run, "digits-cnn", "noise")
    assert rows[("noise", "energy", "fpr100")] == fpr_at_tpr(id_scores["energy"], noise["energy"], tpr=1.0)


# ----------------------------------------------------------------------------------------------- -d and the file's params
def test_command_line_selection_leaves_the_files_parameters_unused(tmp_path: Path) -> None:
    """`-d msp` on the demo, whose file sets knn, nnguide, … parameters: they do not apply, and the plan says so."""
    config = demo_config(tmp_path, *evaluation_overrides(detectors="msp,energy"))
    assert list(config.detectors) == ["msp", "energy"]
    assert {"knn", "nnguide", "neco", "nac", "rankfeat", "gram", "mds_ensemble"} == set(config.unused_params)
    result = CliRunner().invoke(
        _app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), "-d", "msp", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "detectors.params not applied (the selection leaves these detectors out): knn, " in result.output
    as_json = CliRunner().invoke(
        _app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), "-d", "msp", "--dry-run", "--json"]
    )
    assert as_json.exit_code == 0 and "knn" in json.loads(as_json.output)["unused_params"]


def test_files_own_selection_leaves_its_parameters_unused(tmp_path: Path) -> None:
    """A file that excludes knn while keeping knn's parameters evaluates without knn (an edited selection keeps
    the settings the next selection may need)."""
    config = demo_config(tmp_path, 'detectors.exclude=["tempscale","knn"]')
    assert "knn" not in config.detectors and config.unused_params == ("knn",)
    assert "knn" not in config.evaluation.detectors


def test_parameters_of_unknown_or_unselected_command_line_detectors_are_errors(tmp_path: Path) -> None:
    """A detector that does not exist stays an error; so do parameters given on the command line for a detector
    the selection leaves out (as `oodbench evaluate -d msp -p knn.k=5` refuses them)."""
    with pytest.raises(ConfigError, match=r"^detectors\.params\.sobel: unknown detector 'sobel'"):
        demo_config(tmp_path, *evaluation_overrides(detectors="msp"), "detectors.params.sobel.k=3")
    with pytest.raises(ConfigError, match=r"^detectors\.params\.knn: parameters for 'knn', which the selection "):
        demo_config(tmp_path, *evaluation_overrides(detectors="msp", param=["knn.k=5"]))
    result = CliRunner().invoke(
        _app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), "-d", "msp", "-p", "knn.k=5"]
    )
    assert result.exit_code == 2 and 'detectors.include = "msp"' in result.output, result.output
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------------------------- refused options
@pytest.mark.parametrize("flag", ["--json", "--summary"])
def test_plan_formats_need_dry_run(tmp_path: Path, flag: str) -> None:
    result = CliRunner().invoke(_app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), flag])
    assert result.exit_code == 2 and f"{flag} needs --dry-run" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "w").exists()


def _listed_stages(tmp_path: Path) -> list[str]:
    result = CliRunner().invoke(
        _app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), "--only", "foo"]
    )
    assert result.exit_code == 2 and "--only: unknown stage 'foo'; stages: " in result.output, result.output
    return result.output.strip().rpartition("stages: ")[2].split(", ")


def test_only_lists_the_stages_it_accepts(tmp_path: Path) -> None:
    assert _listed_stages(tmp_path) == ["extract", "score", "metrics", "analysis", "report"]
    result = CliRunner().invoke(
        _app(), ["run", str(CONFIGS / "demo.toml"), "--out", str(tmp_path / "w"), "--only", "fit"]
    )
    assert result.exit_code == 2 and "use --only score" in result.output, result.output


@pytest.mark.slow
def test_every_listed_stage_runs_alone(demo_copy: Path, tmp_path: Path) -> None:
    sets = [arg for item in FAST_DEMO for arg in ("--set", item)]
    for stage in _listed_stages(tmp_path):
        args = ["run", str(CONFIGS / "demo.toml"), "--out", str(demo_copy), "--no-progress", "--only", stage, *sets]
        result = CliRunner().invoke(_app(), args)
        assert result.exit_code == 0 and "everything cached: nothing to do" in result.output, (stage, result.output)
