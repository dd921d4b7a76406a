"""OpenOOD's conventions and layouts: groups as data, convention rows, grouped and full-spectrum tables, OpenOOD's
CSV files, and `evaluate` / `report` / `analyze ci` with --convention openood end to end on a store."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import auc, precision_recall_curve, roc_curve
from typer.testing import CliRunner

from oodbench import Head, Outputs, Store
from oodbench.cli.main import app
from oodbench.core import metrics
from oodbench.core.errors import OodbenchError
from oodbench.core.grouped import full_spectrum_table, group_table, openood_csv
from oodbench.core.oodgroups import DEFAULT_GROUPS, load_groups, shipped_groups
from oodbench.core.results import ResultRow, convention_rows, full_spectrum_rows, metric_rows, read_rows
from oodbench.core.scores import load_scores

from .. import reference

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {}}


def openood_reference(ids: np.ndarray, ood: np.ndarray) -> dict[str, float]:
    """OpenOOD v1.5's compute_all_metrics recipe on scikit-learn (every ROC point kept, see test_metrics.py)."""
    conf = np.r_[ids, ood]
    indicator = np.r_[np.zeros(len(ids)), np.ones(len(ood))]
    fpr, tpr, _ = roc_curve(indicator, -conf, drop_intermediate=False)
    p_in, r_in, _ = precision_recall_curve(1 - indicator, conf)
    p_out, r_out, _ = precision_recall_curve(indicator, -conf)
    return {
        "fpr95": float(fpr[np.argmax(tpr >= 0.95)]),
        "auroc": float(auc(fpr, tpr)),
        "aupr_in": float(auc(r_in, p_in)),
        "aupr_out": float(auc(r_out, p_out)),
    }


def pytorch_ood_fpr(ids: np.ndarray, ood: np.ndarray) -> float | None:
    """pytorch-ood's OODMetrics FPR95TPR on the same scores (None when pytorch-ood is not installed)."""
    try:
        import torch
        from pytorch_ood.metrics import OODMetrics
    except ImportError:
        return None
    collection = OODMetrics()
    collection.update(
        torch.from_numpy(-np.r_[ids, ood]), torch.from_numpy(np.r_[np.zeros(len(ids)), -np.ones(len(ood))])
    )
    return float(collection.compute()["FPR95TPR"])


def assert_openood_rows_match_peers(run: Path, model: str, id_dataset: str) -> int:
    """Every openood.* row of a run equals the OpenOOD recipe, and its FPR pytorch-ood's; the rows checked."""
    rows = [r for r in read_rows(run / "results.parquet") if r.metric.startswith("openood.")]
    id_scores = load_scores(run, model, id_dataset)
    checked = 0
    for row in rows:
        ids, ood = id_scores[row.detector], load_scores(run, model, row.ood_dataset)[row.detector]
        reference = openood_reference(ids, ood)[row.metric.removeprefix("openood.")]
        assert row.value == pytest.approx(reference, abs=1e-12), row
        if row.metric == "openood.fpr95":
            theirs = pytorch_ood_fpr(ids, ood)
            assert theirs is None or row.value == theirs, row
        checked += 1
    return checked


# ---------------------------------------------------------------------------------------------------- groups


def test_shipped_openood_groups_are_openood_v15_imagenet():
    # OpenOOD v1.5, openood/evaluation_api/datasets.py, 'imagenet': near = ssb_hard, ninco; far = inaturalist,
    # textures, openimage_o; csid = imagenet_v2, imagenet_c, imagenet_r, imagenet_es.
    assert DEFAULT_GROUPS in shipped_groups()
    groups = load_groups(DEFAULT_GROUPS)
    assert groups.groups == {"near": ("ssb-hard", "ninco"), "far": ("inaturalist", "textures", "openimage-o")}
    assert groups.covariate_shift == ("imagenet-v2", "imagenet-c", "imagenet-r", "imagenet-es")
    # Store ids match through normalisation ('_' as '-', case) and aliases (the dataset registry's names).
    arranged = groups.arrange(["Textures", "inat-ood-plants", "NINCO", "ssb_hard", "places", "openimage-o"])
    assert arranged.groups == (
        ("near", ("ssb_hard", "NINCO"), ()),
        ("far", ("inat-ood-plants", "Textures", "openimage-o"), ()),
    )
    assert arranged.ungrouped == ("places",)
    partial = groups.arrange(["ninco"])
    assert partial.present() == [("near", ("ninco",), ("ssb-hard",))]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[groups]\nnear = ['a']\nfar = ['A']\n", "already in another group"),
        ("title = 'x'\n", "needs a \\[groups\\] table"),
        ("[groups]\nnear = 'a'\n", "must be a list of dataset ids"),
        ("[groups]\nnear = ['a']\n[aliases]\nb = ['c']\n", "alias of 'b', which is in no group"),
        ("[groups]\nnear = ['a']\nfar = ['b']\n[aliases]\na = ['x']\nb = ['x']\n", "names two members"),
        ("[groups]\nnear = ['a']\nextra = 1\n", "must be a list"),
        ("[grups]\nnear = ['a']\n", "unknown keys"),
        ("[groups\n", "not valid TOML"),
    ],
)
def test_bad_groups_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(OodbenchError, match=message):
        load_groups(path)


def test_missing_groups_file_names_the_shipped_ones(tmp_path):
    with pytest.raises(OodbenchError, match="openood-v1.5-imagenet"):
        load_groups(tmp_path / "absent.toml")


# ------------------------------------------------------------------------------------------ rows and tables


def rows_of(values: dict[tuple[str, str, str], float], model: str = "m", id_dataset: str = "id") -> list[ResultRow]:
    return [ResultRow(model, id_dataset, o, d, metric, v, 100, 50) for (d, o, metric), v in values.items()]


def test_convention_rows_keep_conventions_apart():
    rng = np.random.default_rng(0)
    scores = {"id": {"a": rng.normal(1, 1, 40)}, "o": {"a": rng.normal(0, 1, 30)}}
    rows = metric_rows("m", "id", ["o"], ["a"], scores, 0.95, ["oodbench", "openood"])
    assert {r.metric for r in rows} == {*metrics.METRIC_NAMES, *(f"openood.{m}" for m in metrics.METRIC_NAMES)}
    openood = {r.metric: r.value for r in convention_rows(rows, "openood")}
    assert openood == metrics.evaluate(scores["id"]["a"], scores["o"]["a"], convention="openood")
    plain = {r.metric: r.value for r in convention_rows(rows, "oodbench")}
    assert plain == metrics.evaluate(scores["id"]["a"], scores["o"]["a"])
    with pytest.raises(OodbenchError, match="unknown metric convention"):
        convention_rows(rows, "sklearn")


def test_group_table_means_are_plain_means_over_present_sets():
    groups = load_groups(DEFAULT_GROUPS)
    values = {}
    for d, base in (("x", 0.1), ("y", 0.3)):
        for i, o in enumerate(["ninco", "textures", "openimage-o", "extra"]):
            values[(d, o, "fpr95")] = base + 0.1 * i
            values[(d, o, "auroc")] = 0.9 - 0.1 * i
    table = group_table(rows_of(values), groups, convention="openood")
    assert table.columns == ("detector", "ninco", "near mean", "textures", "openimage-o", "far mean", "extra")
    assert table.column_groups() == ["", "near", "near", "far", "far", "far", "other"]
    cells = {(row[0].text, table.columns[i]): c for row in table.rows for i, c in enumerate(row)}
    # far mean of x: FPR (0.2 + 0.3) / 2 = 25.0 %, AUROC (0.8 + 0.7) / 2 = 75.0 %; x has the lower FPR: bold.
    assert cells[("x", "far mean")].text == "25.0 / 75.0" and cells[("x", "far mean")].bold
    assert cells[("y", "near mean")].text == "30.0 / 90.0" and not cells[("y", "near mean")].bold
    notes = " ".join(table.notes)
    assert "near mean covers 1 of the 2 sets" in notes and "ssb-hard" in notes
    assert metrics.CONVENTION_NOTES["openood"] in table.notes
    with_aupr = group_table(
        rows_of({**values, **{(d, o, m): 0.5 for d, o, _ in values for m in ("aupr_in", "aupr_out")}}),
        groups,
        convention="openood",
        aupr=True,
    )
    assert with_aupr.rows[0][1].text == "10.0 / 90.0 / 50.0 / 50.0"


def test_full_spectrum_with_a_copy_of_id_leaves_openood_metrics_unchanged():
    # Joining an exact copy of the ID scores doubles every ID count: the share of ID flagged as OOD at the OOD
    # threshold (openood FPR@95) and the AUROC are exactly the same numbers.
    rng = np.random.default_rng(1)
    ids, ood = rng.normal(1, 1, 97), rng.normal(0, 1, 61)
    scores = {"id": {"a": ids}, "copy": {"a": ids.copy()}, "o": {"a": ood}}
    full = {r.metric: r for r in full_spectrum_rows("m", "id", ["copy"], ["o"], ["a"], scores, 0.95, "openood")}
    assert full["fpr95"].value == metrics.fpr_at_tpr_ood_positive(ids, ood)
    assert full["auroc"].value == metrics.auroc(ids, ood)
    assert full["fpr95"].id_dataset == "id+copy" and full["fpr95"].n_id == 2 * 97
    # A shifted set (lower scores) counted as ID raises the FPR: its images are flagged as OOD more often.
    scores["shift"] = {"a": ids - 1.0}
    shifted = {r.metric: r.value for r in full_spectrum_rows("m", "id", ["shift"], ["o"], ["a"], scores, 0.95)}
    assert shifted["fpr95"] == metrics.fpr_at_tpr(np.r_[ids, ids - 1.0], ood)
    standard = rows_of({("a", "o", "fpr95"): 0.2, ("a", "o", "auroc"): 0.8})
    table = full_spectrum_table(
        standard,
        full_spectrum_rows("m", "id", ["shift"], ["o"], ["a"], scores, 0.95),
        None,
        ["shift"],
        convention="oodbench",
    )
    assert table.columns == ("detector", "standard", "full-spectrum") and table.rows[0][1].text == "20.0 / 80.0"
    assert "shift" in table.notes[0] and metrics.CONVENTION_NOTES["oodbench"] in table.notes


def test_openood_csv_layout():
    groups = load_groups(DEFAULT_GROUPS)
    values = {}
    for i, o in enumerate(["ssb-hard", "ninco", "inaturalist", "textures", "openimage-o"]):
        for j, m in enumerate(metrics.METRIC_NAMES):
            values[("msp", o, m)] = 0.1 * (i + 1) + 0.01 * j
    text = openood_csv(rows_of(values), groups, "msp", accuracy=0.76131)
    table = list(csv.reader(io.StringIO(text)))
    assert table[0] == ["", "FPR@95", "AUROC", "AUPR_IN", "AUPR_OUT", "ACC"]
    # OpenOOD's labels (the keys of its evaluation_api/datasets.py), not oodbench's ids.
    assert [r[0] for r in table[1:]] == [
        "ssb_hard",
        "ninco",
        "nearood",
        "inaturalist",
        "textures",
        "openimage_o",
        "farood",
    ]
    assert table[1] == ["ssb_hard", "10.00", "11.00", "12.00", "13.00", "76.13"]
    # nearood is the mean of ssb-hard (10 %) and ninco (20 %); farood of 30, 40, 50 %.
    assert table[3][1] == "15.00" and table[7][1] == "40.00"
    assert openood_csv(rows_of(values), groups, "msp").splitlines()[1].endswith(",")  # ACC unknown: empty
    # A store's alias of a member gets the member's OpenOOD label; a set in no group its own id, hyphens as '_'.
    aliased = {("msp", {"openimage-o": "openimages-o"}.get(o, o), m): v for (_, o, m), v in values.items()}
    aliased[("msp", "my-set", "fpr95")] = 0.5
    labels = [r[0] for r in csv.reader(io.StringIO(openood_csv(rows_of(aliased), groups, "msp")))]
    assert "openimage_o" in labels and labels[-1] == "my_set"


# ------------------------------------------------------------------------------------------------ end to end


def toy_store(tmp_path: Path) -> Store:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    store = Store(tmp_path / "store")

    def outputs(n: int, shift: float) -> Outputs:
        z = (rng.normal(size=(n, 5)) + shift).astype(np.float32)
        return Outputs(z, (z @ weight.T + bias).astype(np.float32), rng.integers(0, 3, n))

    for name, n, shift in [
        ("fit", 200, 2.0),
        ("id", 100, 2.0),
        ("id_v2", 70, 1.5),
        ("ninco", 80, 0.0),
        ("textures", 60, -1.0),
        ("noise", 50, -3.0),
    ]:
        store.write_outputs("toy", name, outputs(n, shift), provenance=PROV)
    store.write_head("toy", Head(weight, bias), provenance=PROV)
    return store


def evaluate_args(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    base = ["evaluate", "--store", str(tmp_path / "store"), "--model", "toy", "--fit", "fit", "--id", "id"]
    oods = ["--ood", "ninco", "--ood", "textures", "--ood", "noise"]
    return [*base, *oods, "-d", "msp,energy", "--out", str(out), "--no-progress", *extra]


def test_evaluate_and_report_in_the_openood_convention(tmp_path):
    toy_store(tmp_path)
    runner = CliRunner()
    out = tmp_path / "run"
    result = runner.invoke(app, evaluate_args(tmp_path, out, "--convention", "openood", "--csid", "id_v2", "--aupr"))
    assert result.exit_code == 0, result.output
    table = (out / "table.md").read_text()
    assert metrics.CONVENTION_NOTES["openood"] in table
    assert "FPR@95 / AUROC / AUPR-In / AUPR-Out" in table
    assert "near: ninco" in table and "far: far mean" in table and "other: noise" in table  # OpenOOD's groups
    assert "full-spectrum" in table and "id_v2" in table
    info = json.loads((out / "run.json").read_text())
    assert info["csid_datasets"] == ["id_v2"] and info["convention"] == "openood" and "id_v2" in info["entries"]
    assert set(load_scores(out, "toy", "id_v2")) == {"msp", "energy"}  # the covariate-shifted set is scored
    # The scores are the definitions' (MSP and energy of the stored logits), the covariate-shifted set's included.
    store = Store(tmp_path / "store")
    for ds in ("id", "id_v2", "ninco", "textures", "noise"):
        saved, logits = load_scores(out, "toy", ds), store.read("toy", ds).logits
        for name in ("msp", "energy"):
            np.testing.assert_allclose(saved[name], getattr(reference, name)(logits), rtol=reference.SCORE_RTOL)
    # Both conventions' rows are written; the openood ones equal OpenOOD's recipe and pytorch-ood's FPR.
    assert assert_openood_rows_match_peers(out, "toy", "id") == 2 * 3 * 4
    assert {r.metric for r in read_rows(out / "results.parquet")} >= set(metrics.METRIC_NAMES)

    report = tmp_path / "report"
    args = ["report", str(out), "--out", str(report), "--format", "md", "--figure-format", "png", "--quiet"]
    fast = ["--draws", "20", "--curve-draws", "10", "--resamples", "20", "--no-score-figures"]
    result = runner.invoke(app, [*args, *fast, "--convention", "openood"])
    assert result.exit_code == 0, result.output
    text = (report / "report.md").read_text()
    assert "## OOD groups" in text and "## Full-spectrum evaluation" in text
    assert "Convention: openood" in text
    exported = list(csv.reader((report / "openood" / "toy" / "ood" / "msp.csv").open()))
    assert [r[0] for r in exported] == ["", "ninco", "nearood", "textures", "farood", "noise"]
    rows = {(r.ood_dataset, r.metric): r.value for r in read_rows(out / "results.parquet") if r.detector == "msp"}
    assert exported[1][1] == f"{100 * rows[('ninco', 'openood.fpr95')]:.2f}"
    assert exported[1][5] != ""  # ACC: the ID top-1 of accuracy.json
    fsood = list(csv.reader((report / "openood" / "toy" / "fsood" / "energy.csv").open()))
    scores = {d: load_scores(out, "toy", d)["energy"] for d in ("id", "id_v2", "textures")}
    expected = metrics.fpr_at_tpr_ood_positive(np.r_[scores["id"], scores["id_v2"]], scores["textures"])
    assert fsood[3][1] == f"{100 * expected:.2f}"

    # The default convention: no CSV files, the oodbench numbers, the full-spectrum table still there.
    plain = tmp_path / "plain"
    result = runner.invoke(app, ["report", str(out), "--out", str(plain), "--format", "md", "--quiet", *fast])
    assert result.exit_code == 0, result.output
    assert not (plain / "openood").exists() and "## OOD groups" not in (plain / "report.md").read_text()
    assert "## Full-spectrum evaluation" in (plain / "report.md").read_text()


def test_report_computes_the_openood_convention_from_saved_scores(tmp_path):
    toy_store(tmp_path)
    runner = CliRunner()
    plain, openood = tmp_path / "plain", tmp_path / "openood"
    assert runner.invoke(app, evaluate_args(tmp_path, plain)).exit_code == 0
    assert runner.invoke(app, evaluate_args(tmp_path, openood, "--convention", "openood")).exit_code == 0
    assert not any(r.metric.startswith("openood.") for r in read_rows(plain / "results.parquet"))
    fast = ["--format", "md", "--quiet", "--draws", "20", "--curve-draws", "10", "--resamples", "20"]
    for run in (plain, openood):
        result = runner.invoke(
            app, ["report", str(run), "--out", str(tmp_path / f"r-{run.name}"), *fast, "--convention", "openood"]
        )
        assert result.exit_code == 0, result.output
    for name in ("msp", "energy"):
        a = (tmp_path / "r-plain" / "openood" / "toy" / "ood" / f"{name}.csv").read_text()
        b = (tmp_path / "r-openood" / "openood" / "toy" / "ood" / f"{name}.csv").read_text()
        assert a == b


def test_analyze_ci_in_the_openood_convention(tmp_path):
    toy_store(tmp_path)
    runner = CliRunner()
    out = tmp_path / "run"
    assert runner.invoke(app, evaluate_args(tmp_path, out)).exit_code == 0
    target = tmp_path / "ci.json"
    args = ["analyze", "ci", str(out), "--detector", "msp", "--resamples", "50", "--quiet", "--out", str(target)]
    result = runner.invoke(app, [*args, "--convention", "openood"])
    assert result.exit_code == 0, result.output
    assert "hold the OOD threshold fixed" in result.output
    records = json.loads(target.read_text())["records"]
    ids = load_scores(out, "toy", "id")["msp"]
    for record in records:
        ood = load_scores(out, "toy", record["ood_dataset"])["msp"]
        assert (record["n_id"], record["n_ood"]) == (len(ids), len(ood))
        wilson = record["intervals"]["fpr95/wilson"]
        assert wilson["estimate"] == metrics.fpr_at_tpr_ood_positive(ids, ood)
        assert wilson["low"] <= wilson["estimate"] <= wilson["high"]
        assert record["intervals"]["auroc/delong"]["estimate"] == metrics.auroc(ids, ood)
    refused = runner.invoke(app, ["analyze", "subsample", str(out), "--convention", "openood"])
    assert refused.exit_code == 2 and "oodbench convention only" in refused.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--convention", "sklearn"], "--convention: must be one of oodbench, openood"),
        (["--groups", "nowhere.toml"], "no groups file"),
        (["--csid", "absent"], "absent"),
        (["--csid", "ninco"], "distinct"),
    ],
)
def test_bad_convention_options_give_one_line(tmp_path, extra, message):
    toy_store(tmp_path)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, evaluate_args(tmp_path, out, *extra))
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (out / "results.parquet").exists()


def test_report_rejects_a_bad_convention_before_any_work(tmp_path):
    toy_store(tmp_path)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, evaluate_args(tmp_path, out)).exit_code == 0
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r"), "--convention", "x"])
    assert result.exit_code == 2 and "unknown metric convention 'x'" in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "extra, message",
    [(["--csid", "nowhere"], "no saved scores of nowhere"), (["--groups", "nowhere.toml"], "no groups file")],
)
def test_report_names_missing_covariate_sets_and_groups(tmp_path, extra, message):
    toy_store(tmp_path)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, evaluate_args(tmp_path, out)).exit_code == 0
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r"), "--quiet", *extra])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
