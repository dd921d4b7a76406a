"""`oodbench run` has every option of `oodbench evaluate`, as options, as experiment-file keys and in Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import ConfigError
from oodbench.core.metrics import fpr_at_tpr_ood_positive
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
