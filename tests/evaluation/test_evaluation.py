"""Evaluation runs, the `oodbench evaluate` CLI and the demo, end to end on real (digits) data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import oodbench as ob
from oodbench import Head, Outputs, Store
from oodbench.cli.main import app
from oodbench.core.errors import DetectorError, OodbenchError, StoreError
from oodbench.core.results import read_rows
from oodbench.core.scores import load_scores
from oodbench.demo import DEMO_EXCLUDED
from oodbench.evaluation.evaluate import evaluate_outputs, evaluate_store

from .. import reference

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


def toy_store(tmp_path, seed=0):
    rng = np.random.default_rng(seed)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    store = Store(tmp_path / "store")

    def outputs(n, shift):
        z = (rng.normal(size=(n, 5)) + shift).astype(np.float32)
        return Outputs(z, (z @ weight.T + bias).astype(np.float32), rng.integers(0, 3, n))

    for name, n, shift in [("fit", 200, 2.0), ("id", 100, 2.0), ("ood_a", 80, 0.0), ("ood_b", 60, -1.0)]:
        store.write_outputs("toy", name, outputs(n, shift), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def test_evaluate_store_writes_run_directory_and_resumes(tmp_path):
    store = toy_store(tmp_path)
    out = tmp_path / "run"
    result = evaluate_store(
        store, "toy", "fit", "id", ["ood_a", "ood_b"], ["msp", "energy"], out_dir=out, progress=False
    )
    rows = read_rows(out / "results.parquet")
    assert len(rows) == 2 * 2 * 4 and {r.metric for r in rows} == {"fpr95", "auroc", "aupr_in", "aupr_out"}
    scores = load_scores(out, "toy", "id")
    assert set(scores) == {"msp", "energy"} and scores["msp"].shape == (100,)
    # Metrics recomputed independently from the saved scores agree with the rows, and the scores are the definitions'.
    ood = load_scores(out, "toy", "ood_a")
    row = next(r for r in rows if r.detector == "energy" and r.ood_dataset == "ood_a" and r.metric == "auroc")
    assert row.value == pytest.approx(reference.auroc(scores["energy"], ood["energy"]), abs=reference.AUROC_ABS)
    for name in ("msp", "energy"):
        definition = getattr(reference, name)
        np.testing.assert_allclose(scores[name], definition(store.read("toy", "id").logits), rtol=reference.SCORE_RTOL)
        np.testing.assert_allclose(ood[name], definition(store.read("toy", "ood_a").logits), rtol=reference.SCORE_RTOL)
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and run["entries"]["fit"]["provenance"] == PROV
    assert "**" in (out / "table.md").read_text()
    # A rerun reuses saved scores (no detector is fitted again).
    calls = []
    original = ob.detectors.get_class("msp")._fit
    ob.detectors.get_class("msp")._fit = lambda self, *a: calls.append(1)
    try:
        evaluate_store(store, "toy", "fit", "id", ["ood_a", "ood_b"], ["msp", "energy"], out_dir=out, progress=False)
    finally:
        ob.detectors.get_class("msp")._fit = original
    assert calls == []
    assert result.table_markdown == (out / "table.md").read_text()


def test_bad_inputs_give_one_clear_error_each(tmp_path):
    store = toy_store(tmp_path)
    with pytest.raises(OodbenchError, match="no OOD datasets"):
        evaluate_store(store, "toy", "fit", "id", [], ["msp"], progress=False)
    rng = np.random.default_rng(0)
    fit = Outputs(rng.normal(size=(10, 5)).astype(np.float32), rng.normal(size=(10, 3)).astype(np.float32))
    with pytest.raises(OodbenchError, match="OOD dataset 'e' is empty"):
        evaluate_outputs(fit, None, fit, {"e": fit.subset(slice(0, 0))}, ["msp"], progress=False)
    # Logits whose class count disagrees with the head.
    head = Head(np.ones((4, 5), np.float32), np.zeros(4, np.float32))
    with pytest.raises(DetectorError, match="C=3 classes but the head has C=4"):
        ob.detectors.create("kl_matching").fit(fit, head)
    with pytest.raises(DetectorError, match="unknown detector 'nope'"):
        evaluate_outputs(fit, None, fit, {"o": fit}, ["nope"], progress=False)
    with pytest.raises(DetectorError, match="has no parameter"):
        ob.detectors.create("energy", temp=2)
    with pytest.raises(DetectorError, match="positive"):
        ob.detectors.create("energy", temperature=-1)
    # A store entry extracted with another checkpoint cannot be mixed into the evaluation.
    store.write_outputs("toy", "foreign", fit, provenance={**PROV, "checkpoint": "other"})
    with pytest.raises(StoreError, match="mismatched model provenance"):
        evaluate_store(store, "toy", "fit", "id", ["foreign"], ["msp"], progress=False)


def test_logit_detectors_protocol():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(30, 4)).astype(np.float32)
    head = Head(rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, np.float32))
    outputs = Outputs(z, head.logits(z).astype(np.float32))
    scores = ob.detectors.create("energy").fit(outputs, head).score(outputs)
    assert scores.shape == (30,) and scores.dtype == np.float64
    with pytest.raises(DetectorError, match="not fitted"):
        ob.detectors.create("msp").score(outputs)
    with pytest.raises(DetectorError, match="needs logits"):
        ob.detectors.create("msp").fit(outputs).score(Outputs(z))


def test_cli_evaluate(tmp_path):
    toy_store(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--store",
            str(tmp_path / "store"),
            "--model",
            "toy",
            "--fit",
            "fit",
            "--id",
            "id",
            "--ood",
            "ood_a",
            "--ood",
            "ood_b",
            "-d",
            "msp,energy",
            "-p",
            "energy.temperature=2",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| energy |" in result.output
    # The CLI's rows are the library's evaluation of the same entries with the same parameters.
    direct = evaluate_store(
        tmp_path / "store",
        "toy",
        "fit",
        "id",
        ["ood_a", "ood_b"],
        {"msp": {}, "energy": {"temperature": 2}},
        progress=False,
    )
    reported = reference.run_results(tmp_path / "run")
    np.testing.assert_equal(reported, {(r.detector, r.ood_dataset, r.metric): r.value for r in direct.rows})
    # And the definitions: MSP, and energy at T = 2 (T·log Σ exp(f/T)), of the stored logits; AUROC of those scores.
    store = Store(tmp_path / "store")
    definitions = {"msp": reference.msp, "energy": lambda f: 2.0 * reference.energy(np.asarray(f, np.float64) / 2.0)}
    for name, definition in definitions.items():
        saved = {ds: reference.run_scores(tmp_path / "run", ds)[name] for ds in ("id", "ood_a", "ood_b")}
        for ds, scores in saved.items():
            np.testing.assert_allclose(scores, definition(store.read("toy", ds).logits), rtol=reference.SCORE_RTOL)
        for ood in ("ood_a", "ood_b"):
            expected = reference.auroc(saved["id"], saved[ood])
            assert reported[(name, ood, "auroc")] == pytest.approx(expected, abs=reference.AUROC_ABS)
    bad = runner.invoke(
        app,
        [
            "evaluate",
            "--store",
            str(tmp_path / "store"),
            "--model",
            "toy",
            "--fit",
            "fit",
            "--id",
            "id",
            "--ood",
            "missing",
            "--out",
            str(tmp_path / "r2"),
        ],
    )
    assert bad.exit_code == 2 and "no store entry toy/missing" in bad.output
    assert "Example" in runner.invoke(app, ["evaluate", "--help"]).output


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo"), "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = read_rows(tmp_path / "demo" / "run" / "results.parquet")
    detectors = {r.detector for r in rows}
    # Every built-in detector but those that need held-out ID data (the demo fits on its training split).
    assert detectors == {d for d in ob.detectors.available() if ob.detectors.origin(d).builtin} - DEMO_EXCLUDED
    assert {r.ood_dataset for r in rows} == {"digits-6to9", "lfw-faces", "noise"}
    # The CNN really learned the digits and its scores really separate far OOD from ID.
    info = json.loads((tmp_path / "demo" / "store" / "digits-cnn" / "head" / "meta.json").read_text())
    assert info["provenance"]["demo"]["test_accuracy"] > 0.95
    best_noise = max(r.value for r in rows if r.metric == "auroc" and r.ood_dataset == "noise")
    assert best_noise > 0.9
    assert "| msp |" in (tmp_path / "demo" / "report.md").read_text()
    # The demo store in the openood convention: the same FPR@95 as pytorch-ood's OODMetrics on the same scores.
    from .test_conventions import assert_openood_rows_match_peers

    store, run = tmp_path / "demo" / "store", tmp_path / "openood-run"
    args = ["--model", "digits-cnn", "--fit", "digits-fit", "--id", "digits-id-test", "--ood", "digits-6to9"]
    args += ["--ood", "lfw-faces", "--ood", "noise", "-d", "msp,energy,maxlogit", "--convention", "openood"]
    result = CliRunner().invoke(app, ["evaluate", "--store", str(store), *args, "--out", str(run), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert assert_openood_rows_match_peers(run, "digits-cnn", "digits-id-test") == 3 * 3 * 4


def test_rerun_with_fewer_detectors_drops_their_saved_scores(tmp_path):
    store = toy_store(tmp_path)
    out = tmp_path / "run"
    evaluate_store(store, "toy", "fit", "id", ["ood_a"], ["msp", "energy"], out_dir=out, progress=False)
    evaluate_store(store, "toy", "fit", "id", ["ood_a"], ["msp"], out_dir=out, progress=False)
    assert set(load_scores(out, "toy", "ood_a")) == {"msp"}
    assert {r.detector for r in read_rows(out / "results.parquet")} == {"msp"}


def test_a_float32_gram_run_keys_only_the_gram_detectors_apart(tmp_path, monkeypatch):
    # gram_dtype enters the score keys of the detectors that learn from a Gram matrix (maha: yes, msp: no), so a
    # float32 rerun of a float64 run directory refits maha and reuses msp, and run.json says which precision ran.
    store = toy_store(tmp_path)
    out = tmp_path / "run"
    first = evaluate_store(store, "toy", "fit", "id", ["ood_a"], ["msp", "maha"], out_dir=out, progress=False)
    fitted = []
    for name in ("msp", "maha"):
        cls = ob.detectors.get_class(name)
        original = cls._fit
        monkeypatch.setattr(cls, "_fit", lambda self, *a, _o=original, _n=name: (fitted.append(_n), _o(self, *a)))
    second = evaluate_store(
        store, "toy", "fit", "id", ["ood_a"], ["msp", "maha"], out_dir=out, progress=False, gram_dtype="float32"
    )
    assert fitted == ["maha"]
    run = json.loads((out / "run.json").read_text())
    assert run["gram_dtype"] == "float32"
    np.testing.assert_array_equal(second.scores["id"]["msp"], first.scores["id"]["msp"])
    # The float32 Gram moves maha's scores, by far less than the scores themselves (toy data: D = 5, 200 rows).
    moved = np.abs(second.scores["id"]["maha"] - first.scores["id"]["maha"])
    assert 0 < moved.max() < 1e-4 * np.abs(first.scores["id"]["maha"]).max()
    with pytest.raises(OodbenchError, match="gram_dtype must be one of"):
        evaluate_store(store, "toy", "fit", "id", ["ood_a"], ["maha"], out_dir=out, progress=False, gram_dtype="half")
