"""`oodbench run configs/demo.toml` end to end: outputs, caching (by instrumentation), resumption, content keys."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import ConfigError, OodbenchError
from oodbench.core.results import read_rows
from oodbench.detectors import available
from oodbench.detectors.base import Detector
from oodbench.runner.executor import run_experiment
from oodbench.runner.plan import build_plan

from .helpers import CONFIGS, FAST_DEMO, demo_config

ALL_DETECTORS = len(available()) - 1  # the demo config includes every registered detector but tempscale


def _values(path: Path) -> dict[tuple[str, str, str, str], float]:
    return {(r.model, r.ood_dataset, r.detector, r.metric): r.value for r in read_rows(path)}


def _assert_detects_noise(path: Path) -> None:
    """The run's numbers are real: some detector tells uniform noise from digits (the demo's far-OOD set).

    Noise images are far from every digit, so the best detector's AUROC on them is near 1 in the demo (the demo
    test's floor is 0.9 too); a detector that scores every image alike gives 0.5 and fails this.
    """
    aurocs = [r.value for r in read_rows(path) if r.ood_dataset == "noise" and r.metric == "auroc"]
    assert aurocs and max(aurocs) > 0.9, max(aurocs, default=None)


def test_first_run_does_every_stage(finished_demo) -> None:
    workdir, report = finished_demo
    ran = {stage: len(units) for stage, units in report.executed.items()}
    assert ran == {
        "extract": 5,
        "fit": ALL_DETECTORS,
        "score": 4 * ALL_DETECTORS,
        "metrics": 2,
        "analysis": 2,
        "report": 1,
    }
    rows = read_rows(workdir / "results.parquet")
    assert len(rows) == ALL_DETECTORS * 3 * 4  # detectors × OOD sets × metrics
    _assert_detects_noise(workdir / "results.parquet")
    html = (workdir / "report" / "report.html").read_text(encoding="utf-8")
    assert "<table" in html and "rmaha++" in html and "digits-6to9" in html
    assert (workdir / "analysis" / "subsample" / "digits-cnn.json").is_file()
    assert (workdir / "runs" / "digits-cnn" / "scores" / "digits-cnn" / "noise.npz").is_file()


def test_second_run_recomputes_nothing(demo_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("recomputation in a run that should find everything cached")

    # Instrumentation: every expensive step raises if it is reached at all.
    monkeypatch.setattr("oodbench.demo.model.train_cnn", forbidden)
    monkeypatch.setattr(Detector, "fit", forbidden)
    monkeypatch.setattr(Detector, "score", forbidden)
    monkeypatch.setattr("oodbench.report.output.write_report", forbidden)
    monkeypatch.setattr("oodbench.analysis.subsample.subsample_run", forbidden)
    monkeypatch.setattr("oodbench.core.results.write_rows", forbidden)
    before = {p: p.stat().st_mtime_ns for p in demo_copy.rglob("*") if p.is_file()}
    report = run_experiment(demo_config(demo_copy), progress=False)
    assert report.total_executed == 0
    assert {stage: len(units) for stage, units in report.cached.items()} == {
        "extract": 5,
        "fit": ALL_DETECTORS,
        "score": 4 * ALL_DETECTORS,
        "metrics": 2,
        "analysis": 2,
        "report": 1,
    }
    after = {p: p.stat().st_mtime_ns for p in demo_copy.rglob("*") if p.is_file()}
    assert after == before  # not a single file written
    _assert_detects_noise(demo_copy / "results.parquet")


def test_results_agree_with_evaluate_store(finished_demo, tmp_path: Path) -> None:
    """The runner's unit-by-unit path gives the rows of the one-call evaluation (an independent code path)."""
    from oodbench.evaluation.evaluate import evaluate_store

    workdir, _ = finished_demo
    config = demo_config(workdir)
    result = evaluate_store(
        workdir / "store",
        "digits-cnn",
        config.fit,
        config.id_test,
        list(config.ood),
        config.detectors,
        out_dir=tmp_path / "eval",
        progress=False,
    )
    expected = {(r.model, r.ood_dataset, r.detector, r.metric): r.value for r in result.rows}
    # Both paths compute each row from the same float scores in the same order: identical up to float64 rounding
    # of the metric sums (|error| ≤ n·eps64 ≈ 1e-13 for n < 1,000 images).
    assert _values(workdir / "results.parquet") == pytest.approx(expected, abs=1e-12)
    _assert_detects_noise(workdir / "results.parquet")


def test_interrupted_run_resumes_where_it_stopped(
    finished_demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, _ = finished_demo
    workdir = tmp_path / "run"
    shutil.copytree(source / "store", workdir / "store")  # extraction done elsewhere: the run adopts the entries
    assert all(u.note == "found in store" for u in build_plan(demo_config(workdir)).stage("extract"))
    calls = {"n": 0}
    original = Detector.score

    def killed_midway(self, test):
        calls["n"] += 1
        if calls["n"] == 40:  # like Ctrl-C in the middle of a unit: its record must not be written
            raise KeyboardInterrupt
        return original(self, test)

    monkeypatch.setattr(Detector, "score", killed_midway)
    done_first: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_experiment(demo_config(workdir), progress=False, on_unit=lambda u: done_first.append(u.id))
    monkeypatch.setattr(Detector, "score", original)
    plan = build_plan(demo_config(workdir))
    recorded = {u.id for u in plan.stage("score") if not u.todo}
    # Every unit reported done was recorded; units of the interrupted (model, detector) task finished before the
    # interruption are recorded too (their records are written one by one).
    assert {u for u in done_first if u.startswith("score:")} <= recorded
    assert 20 < len(recorded) < 4 * ALL_DETECTORS
    assert all(u.status == "cached" for u in plan.stage("extract"))  # adopted from the copied store and recorded

    report = run_experiment(demo_config(workdir), progress=False)
    second_scores = set(report.executed["score"])
    assert second_scores.isdisjoint(recorded)
    assert second_scores | recorded == {u.id for u in plan.stage("score")}
    assert report.executed["extract"] == []
    assert _values(workdir / "results.parquet") == _values(source / "results.parquet")
    _assert_detects_noise(workdir / "results.parquet")


def test_changing_one_parameter_reruns_only_what_depends_on_it(demo_copy: Path) -> None:
    report = run_experiment(demo_config(demo_copy, "detectors.params.knn.k=5"), progress=False)
    assert report.executed["extract"] == []
    assert report.executed["fit"] == ["fit:digits-cnn/knn"]
    assert sorted(report.executed["score"]) == sorted(
        f"score:digits-cnn/knn/{d}" for d in ("digits-id-test", "digits-6to9", "lfw-faces", "noise")
    )
    assert len(report.executed["metrics"]) == 2 and len(report.executed["report"]) == 1
    plan = build_plan(demo_config(demo_copy))  # back to k=10: what k=5 replaced is stale now
    knn_scores = {f"score:digits-cnn/knn/{d}" for d in ("digits-id-test", "digits-6to9", "lfw-faces", "noise")}
    assert {u.id for u in plan.units if u.status == "stale"} == knn_scores | {
        "metrics:digits-cnn",
        "metrics:all",
        "analysis:subsample/digits-cnn",
        "analysis:intervals/digits-cnn",
        "report:report",
    }
    assert [u.id for u in plan.units if u.todo and u.status != "stale"] == ["fit:digits-cnn/knn"]
    _assert_detects_noise(demo_copy / "results.parquet")
    with pytest.raises(OodbenchError, match=r"needs score:digits-cnn/knn/.*, which is out of date \(its parameters"):
        run_experiment(demo_config(demo_copy), only="metrics", progress=False)  # ran, but with k=5: not "has not run"


def test_only_checks_prerequisites(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "fresh")
    with pytest.raises(OodbenchError, match=r"--only metrics: metrics:digits-cnn needs score:digits-cnn/[a-z_]+/"):
        run_experiment(config, only="metrics", progress=False)
    with pytest.raises(ConfigError, match="--only fit"):
        run_experiment(config, only="fit", progress=False)
    with pytest.raises(ConfigError, match="--only: unknown stage"):
        run_experiment(config, only="plot", progress=False)
    assert not (tmp_path / "fresh").exists()  # nothing started


def test_cli_run_and_dry_run(demo_copy: Path) -> None:
    from oodbench.runner.cli import register

    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `run` a named sub-command
    sets = [arg for item in FAST_DEMO for arg in ("--set", item)]
    result = CliRunner().invoke(
        app, ["run", str(CONFIGS / "demo.toml"), "--out", str(demo_copy), "--no-progress", *sets]
    )
    assert result.exit_code == 0, result.output
    assert "everything cached" in result.output and "report.html" in result.output
    assert "## digits-cnn" in result.output and "| knn" in result.output  # the results table, not only counts
    result = CliRunner().invoke(app, ["run", str(CONFIGS / "demo.toml"), "--out", str(demo_copy), "--dry-run", *sets])
    assert result.exit_code == 0, result.output
    assert "cached   digits-cnn/knn/noise" in result.output
    assert "433 images" in result.output  # the ID test split's size
    _assert_detects_noise(demo_copy / "results.parquet")
    result = CliRunner().invoke(app, ["run", str(CONFIGS / "demo.toml"), "--set", "detectors.include=['msp','nope']"])
    assert result.exit_code == 2
    assert "detectors.include[1]: unknown detector 'nope'" in result.output


def test_fits_of_one_model_share_one_pass_over_the_fit_set(demo_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local executor hands run_fit_score every detector of the model it fits; their fits read the fit set once."""
    import numpy as np

    from oodbench.detectors import create, shared
    from oodbench.runner.stages import Context, run_fit_score

    config = demo_config(demo_copy)
    ctx = Context(config, progress=False)
    passes: list[set[str]] = []
    original = shared.FitStatistics._compute

    def counted(self, needs):
        passes.append(set(needs))
        return original(self, needs)

    monkeypatch.setattr(shared.FitStatistics, "_compute", counted)
    model = config.classifiers[0].id
    names = ["maha", "rmaha++", "neco", "vim", "knn"]
    share = [(name, config.detectors[name]) for name in names]
    for name in names:
        todo = [{"label": f"{model}/{name}/{config.id_test}", "key": "test", "dataset": config.id_test}]
        run_fit_score(ctx, model, name, config.detectors[name], todo, share_with=share)
    assert len(passes) == 1 and {"features_by_class", "normalized_by_class", "features"} <= passes[0]
    # Each detector's scores are those of fitting it alone (shared statistics change nothing but the reading).
    store, layout = ctx.store, ctx.layout
    head = store.read_head(model)
    for name in names:
        alone = create(name, **config.detectors[name]).fit(store.read(model, config.fit), head)
        expected = alone.score(store.read(model, config.id_test))
        written = np.load(layout.score_file(model, name, config.id_test))
        np.testing.assert_allclose(written, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
        assert np.unique(written).size > 100, name  # 433 images get distinct scores, not one constant
