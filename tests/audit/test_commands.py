"""`oodbench audit …` end to end through Typer's CliRunner on tiny stores written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from oodbench import Outputs, Store
from oodbench.audit import logistic_regression_head
from oodbench.audit.cli import register
from oodbench.cli.main import OodbenchGroup

from .audit_helpers import Pentagon, digits_features, single_thread_blas  # noqa: F401 (autouse fixture)

PROVENANCE = {"model": "toy", "checkpoint": "abc", "preprocessing": "none"}


@pytest.fixture(scope="module")
def cli():
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["audit", *args], catch_exceptions=False)


def _write(store: Store, model: str, name: str, outputs: Outputs, head) -> None:
    logits = head.logits(outputs.features).astype(np.float32)
    store.write_outputs(model, name, Outputs(outputs.features, logits, outputs.labels), provenance=PROVENANCE)


@pytest.fixture(scope="module")
def pentagon_store(tmp_path_factory):
    world = Pentagon(seed=0)
    store = Store(tmp_path_factory.mktemp("store"))
    fit = world.leaked_fit()
    head = logistic_regression_head(fit.features, fit.labels)
    store.write_head("toy", head, provenance=PROVENANCE)
    for name, outputs in (
        ("fit", fit),
        ("id", world.id_test()),
        ("class4", world.ood()),
        (
            "far",
            Outputs(
                np.full((50, 2), 30.0, np.float32) + np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
            ),
        ),
    ):
        _write(store, "toy", name, outputs, head)
    return store


def test_fingerprint_command_writes_a_report(cli, pentagon_store, tmp_path):
    result = cli(
        "fingerprint",
        "--store",
        str(pentagon_store.root),
        "--model",
        "toy",
        "--fit",
        "fit",
        "--id",
        "id",
        "--ood",
        "class4",
        "--ood",
        "far",
        "-p",
        "iforest.n_estimators=20",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert "| class4 |" in result.output and "leak" in result.output
    payload = json.loads((tmp_path / "audit.json").read_text())
    verdicts = {s["name"]: s["verdict"]["label"] for s in payload["splits"]}
    assert verdicts == {"class4": "leak", "far": "clean"}
    assert payload["config"]["pool_params"] == {"iforest": {"n_estimators": 20}}
    markdown = (tmp_path / "audit.md").read_text()
    assert "Exclusion contrast" in markdown and "Leave-class-out" in markdown and "msp †" in markdown
    if (tmp_path / "audit.html").exists():
        assert "<table" in (tmp_path / "audit.html").read_text()


def test_fingerprint_command_errors_are_clean(cli, pentagon_store, tmp_path):
    result = cli(
        "fingerprint",
        "--store",
        str(pentagon_store.root),
        "--model",
        "toy",
        "--fit",
        "fit",
        "--id",
        "id",
        "--ood",
        "missing",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 2 and "no store entry" in result.output
    result = cli(
        "fingerprint",
        "--store",
        str(pentagon_store.root),
        "--model",
        "toy",
        "--fit",
        "fit",
        "--id",
        "id",
        "--ood",
        "class4",
        "--suspect",
        "class4=x",
    )
    assert result.exit_code != 0 and "DATASET=CLASS" in result.output
    # A class the fit set does not hold: excluding it removes no fit row, so the contrast would test nothing.
    fingerprint = ["fingerprint", "--store", str(pentagon_store.root), "--model", "toy", "--fit", "fit", "--id", "id"]
    result = cli(*fingerprint, "--ood", "class4", "--suspect", "class4=99", "--out", str(tmp_path / "absent"))
    assert result.exit_code == 2 and "classes 99 have no row in the fit set fit" in result.output
    assert not (tmp_path / "absent").exists()


def test_overlap_and_suites_commands(cli, pentagon_store):
    result = cli(
        "overlap", "--store", str(pentagon_store.root), "--model", "toy", "--id", "id", "--ood", "class4", "-k", "5"
    )
    assert result.exit_code == 0 and "class4: L_5 = 0.0000" in result.output
    result = cli("suites")
    assert result.exit_code == 0 and "ssb-hard" in result.output and "no class list" in result.output


def test_scan_command_covers_every_shipped_suite(cli, tmp_path):
    result = cli("scan", "--label-space", "imagenet-1k", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    from oodbench.audit import shipped_suites

    for name in shipped_suites():
        assert f"| {name} |" in result.output
    assert "| mcm-imagenet10-vs-20 | 20 | 20 | 0 | 0 | 0 | **leaks** |" in result.output
    payload = json.loads((tmp_path / "scan.json").read_text())
    assert {s["suite"] for s in payload["scans"]} == set(shipped_suites())
    assert "Sources" in (tmp_path / "scan.md").read_text()


def test_battery_command_on_a_store(cli, tmp_path):
    data = digits_features(seed=1)
    store = Store(tmp_path / "store")
    head = logistic_regression_head(data["train"].features, data["train"].labels)
    store.write_head("digits", head, provenance=PROVENANCE)
    for name in ("train", "test", "noise"):
        _write(store, "digits", name, data[name], head)
    result = cli(
        "battery",
        "--store",
        str(store.root),
        "--model",
        "digits",
        "--train",
        "train",
        "--test",
        "test",
        "--far",
        "noise",
        "--classes",
        "0,3",
        "--pool",
        "maha,knn,iforest",
        "-p",
        "iforest.n_estimators=20",
        "--logit",
        "msp",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert "automatic contrast: sensitivity 1.000  specificity 1.000" in result.output
    assert "designated class: 1.000 / 1.000" in result.output
    assert "leaked/trained-class-3" in result.output and "verdict=leak" in result.output
    assert (tmp_path / "out" / "battery.md").exists()


def test_battery_command_on_the_synthetic_battery(cli, tmp_path):
    result = cli(
        "battery", "--synthetic", "--classes", "0", "--pool", "maha,knn", "--logit", "",
        "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("automatic contrast: sensitivity ") and "designated class: " in first
    assert "leaked/trained-class-0" in result.output and "clean/near-near-0" in result.output
    payload = json.loads((tmp_path / "out" / "battery.json").read_text())
    assert {s["meta"]["family"] for s in payload["splits"]} == {"trained-class", "near", "far"}
    # A floor on separable data: the far set's mean lies 3·separation = 30 from the origin, orthogonal to every class
    # mean (7.1 from it). With unit-variance noise in D = 128, its squared Mahalanobis distance to the nearest class
    # is ~128 + 950 (sd ≈ 62) against ~128 (sd 16) for ID rows: over 12 standard deviations apart.
    far = next(s for s in payload["splits"] if s["name"] == "clean/far-far")
    assert far["fingerprint"]["pool_aurocs"]["maha"] >= 0.99
    assert (
        "designated_sensitivity" in payload and "verdict (designated)" in (tmp_path / "out" / "battery.md").read_text()
    )


def test_seed_reaches_the_isolation_forest(cli, pentagon_store, tmp_path):
    """`--seed` drives the forest: three seeds give three AUROCs, and one seed gives the same AUROC twice."""

    def iforest_auroc(seed: int) -> float:
        out = tmp_path / f"seed{seed}"
        args = ("--store", str(pentagon_store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "class4")
        result = cli(
            "fingerprint", *args, "--pool", "iforest", "-p", "iforest.n_estimators=10", "--logit", "",
            "--seed", str(seed), "--out", str(out), "--no-progress",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        (split,) = json.loads((out / "audit.json").read_text())["splits"]
        return split["fingerprint"]["pool_aurocs"]["iforest"]

    aurocs = [iforest_auroc(seed) for seed in (0, 1, 2)]
    assert len(set(aurocs)) == 3, aurocs
    assert iforest_auroc(1) == aurocs[1]
