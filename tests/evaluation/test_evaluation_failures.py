"""A detector that fails keeps the others' results; a run where nothing ran exits 2; fit-set sizes checked first."""

from __future__ import annotations

import json

import numpy as np
import pytest

import oodbench as ob
from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core.errors import DetectorError
from oodbench.core.scores import load_scores
from oodbench.evaluation.evaluate import FitSetTooSmall, NothingEvaluated, evaluate_store
from oodbench.runner.quick_cli import SOME_FAILED

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


def toy_store(tmp_path, *, fit_rows: int = 200, duplicate_head_rows: bool = False, labels: bool = True) -> Store:
    """Gaussian features, logits of a linear head; a head with two equal rows breaks fDBD (and only fDBD)."""
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    if duplicate_head_rows:
        weight[1], bias[1] = weight[0], bias[0]
    store = Store(tmp_path / "store")

    def outputs(n, shift, labelled):
        z = (rng.normal(size=(n, 5)) + shift).astype(np.float32)
        return Outputs(z, (z @ weight.T + bias).astype(np.float32), rng.integers(0, 3, n) if labelled else None)

    for name, n, shift in [("fit", fit_rows, 2.0), ("id", 100, 2.0), ("ood", 80, 0.0)]:
        store.write_outputs("toy", name, outputs(n, shift, labels or name != "fit"), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def test_a_failing_detector_leaves_the_others_results_and_a_rerun_retries_it(tmp_path, monkeypatch):
    store = toy_store(tmp_path, duplicate_head_rows=True)
    out = tmp_path / "run"
    result = evaluate_store(store, "toy", "fit", "id", ["ood"], ["msp", "fdbd", "energy"], out_dir=out, progress=False)
    assert set(result.failed) == {"fdbd"} and "head rows 0 and 1 are identical" in result.failed["fdbd"]
    assert {row.detector for row in result.rows} == {"msp", "energy"}
    assert set(load_scores(out, "toy", "ood")) == {"msp", "energy"}
    assert "fdbd" not in (out / "table.md").read_text() and "energy" in (out / "table.md").read_text()
    info = json.loads((out / "run.json").read_text())
    assert info["complete"] is False and set(info["score_keys"]) == {"msp", "energy"}
    assert "identical" in info["failed_detectors"]["fdbd"]
    # A rerun reuses the saved scores of msp and energy and tries fdbd again.
    from oodbench.detectors import get_class

    calls: list[str] = []
    for name in ("msp", "fdbd"):
        cls = get_class(name)
        monkeypatch.setattr(cls, "fit", lambda self, *a, _f=cls.fit, **k: calls.append(self.name) or _f(self, *a, **k))
    again = evaluate_store(store, "toy", "fit", "id", ["ood"], ["msp", "fdbd", "energy"], out_dir=out, progress=False)
    assert calls == ["fdbd"] and set(again.failed) == {"fdbd"}
    with pytest.raises(DetectorError, match="identical"):  # strict: the failure is raised, not recorded
        evaluate_store(store, "toy", "fit", "id", ["ood"], ["fdbd"], progress=False, strict=True)


def test_cli_exit_status_says_some_detectors_failed(tmp_path, capsys):
    store = toy_store(tmp_path, duplicate_head_rows=True)
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "-d", "msp,fdbd", "--out", str(tmp_path / "run"), "--no-progress"])
    assert exit_info.value.code == SOME_FAILED
    captured = capsys.readouterr()
    assert "| msp |" in captured.out
    assert "failed fdbd: fdbd: head rows 0 and 1 are identical" in captured.err
    assert "the others' results, scores and table are written" in captured.err


def test_nothing_evaluated_exits_2_with_every_reason_before_any_fit(tmp_path, capsys):
    store = toy_store(tmp_path, labels=False)
    with pytest.raises(NothingEvaluated, match="no detector could be evaluated: maha skipped: fit set lacks labels"):
        evaluate_store(store, "toy", "fit", "id", ["ood"], ["maha", "mcm"], out_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "results.parquet").exists()
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "-d", "maha", "--out", str(tmp_path / "run2"), "--no-progress"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: no detector could be evaluated: maha skipped")
    assert len(err.strip().splitlines()) == 1


def test_store_fit_set_too_small_fails_before_any_fit_or_adapts(tmp_path, monkeypatch, capsys):
    store = toy_store(tmp_path, fit_rows=84)
    fitted = []
    from oodbench.detectors import get_class

    original = get_class("msp").fit
    monkeypatch.setattr(get_class("msp"), "fit", lambda self, *a, **k: fitted.append(1) or original(self, *a, **k))
    with pytest.raises(FitSetTooSmall, match="knn: k=1000 exceeds the fit set's 84 rows.*nnguide: the bank holds 0"):
        evaluate_store(store, "toy", "fit", "id", ["ood"], ["msp", "knn", "nnguide"], progress=False)
    assert fitted == []
    out = tmp_path / "run"
    result = evaluate_store(
        store,
        "toy",
        "fit",
        "id",
        ["ood"],
        ["msp", "knn", "nnguide"],
        out_dir=out,
        progress=False,
        small_fit_set="adapt",
    )
    assert result.adapted == {
        "knn": {"k": {"from": 1000, "to": 1}},
        "nnguide": {"alpha": {"from": 0.01, "to": 1.0}, "k": {"from": 100, "to": 1}},
    }
    info = json.loads((out / "run.json").read_text())
    # run.json records the resolved parameters (defaults filled in), the adapted value among them.
    assert info["adapted_parameters"] == result.adapted
    assert info["detectors"]["knn"] == {**ob.detectors.create("knn").get_params(), "k": 1}
    assert {row.detector for row in result.rows} == {"msp", "knn", "nnguide"}


def test_network_time_detectors_without_their_arrays_are_one_skipped_line(tmp_path, capsys):
    """A store without the network-time detectors' arrays: one line names the skipped ones and the extraction that
    makes their arrays; a detector with another reason too (a fit set without labels) keeps its own line."""
    store = toy_store(tmp_path, labels=False)
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "-d", "msp,odin,gram,mds_ensemble,maha", "--out", str(tmp_path / "run"), "--no-progress"])
    assert exit_info.value.code == 0
    skipped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("skipped")]
    assert skipped == [
        "skipped 2 network-time detectors (odin, gram): their arrays are not extracted; "
        "extract them with `oodbench extract --net odin --net gram`",
        "skipped mds_ensemble: its arrays are not extracted (--net mds); fit set lacks labels",
        "skipped maha: fit set lacks labels",
    ]
