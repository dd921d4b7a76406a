"""A run at a TPR other than 0.95 names its FPR by that rate everywhere: rows, run.json, table.md and the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oodbench.core import metrics
from oodbench.core.errors import AnalysisError
from oodbench.core.results import read_rows
from oodbench.core.scores import load_scores
from oodbench.core.tabular import render_markdown
from oodbench.evaluation.evaluate import evaluate_store
from oodbench.report.build import ReportOptions, build_report

from .test_evaluation import toy_store

FAST = ReportOptions(draws=20, curve_draws=10, curve_points=3, resamples=20, score_figures=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same evaluation at tpr 0.8 and at the default 0.95."""
    root = tmp_path_factory.mktemp("tpr")
    store = toy_store(root)
    out = {"tpr80": root / "tpr80", "default": root / "default"}
    evaluate_store(
        store, "toy", "fit", "id", ["ood_a", "ood_b"], ["msp", "energy"], out_dir=out["tpr80"], tpr=0.8, progress=False
    )
    evaluate_store(
        store, "toy", "fit", "id", ["ood_a", "ood_b"], ["msp", "energy"], out_dir=out["default"], progress=False
    )
    return out


def test_names_and_labels() -> None:
    assert [metrics.fpr_metric(t) for t in (0.95, 0.8, 0.975)] == ["fpr95", "fpr80", "fpr97.5"]
    assert metrics.fpr_label(0.8) == "FPR@80" and metrics.tpr_of_metric("openood.fpr80") == 0.8
    assert metrics.tpr_of_metric("auroc") is None and metrics.tpr_of_metric("fpr95_std") is None
    note = metrics.relabel_fpr("FPR@95 at the threshold that accepts 95% of ID, with Wilson 95% intervals", 0.8)
    assert note == "FPR@80 at the threshold that accepts 80% of ID, with Wilson 95% intervals"


def test_a_tpr_80_run_names_its_fpr_fpr80(runs) -> None:
    out = runs["tpr80"]
    rows = read_rows(out / "results.parquet")
    assert {r.metric for r in rows} == {"fpr80", "auroc", "aupr_in", "aupr_out"}
    ids, ood = load_scores(out, "toy", "id"), load_scores(out, "toy", "ood_a")
    row = next(r for r in rows if (r.detector, r.ood_dataset, r.metric) == ("msp", "ood_a", "fpr80"))
    assert row.value == metrics.fpr_at_tpr(ids["msp"], ood["msp"], 0.8)
    assert json.loads((out / "run.json").read_text())["tpr"] == 0.8
    table = (out / "table.md").read_text()
    assert "FPR@80" in table and "accepts 80% of ID" in table
    assert "FPR@95" not in table and "95% of ID" not in table


def test_the_default_run_keeps_its_names(runs) -> None:
    out = runs["default"]
    assert {r.metric for r in read_rows(out / "results.parquet")} == {"fpr95", "auroc", "aupr_in", "aupr_out"}
    assert json.loads((out / "run.json").read_text())["tpr"] == 0.95
    table = (out / "table.md").read_text()
    assert "FPR@95" in table and "accepts 95% of ID" in table and "FPR@80" not in table


def test_openood_rows_state_the_rate_too(tmp_path) -> None:
    store = toy_store(tmp_path)
    evaluate_store(
        store,
        "toy",
        "fit",
        "id",
        ["ood_a"],
        ["msp"],
        out_dir=tmp_path / "r",
        tpr=0.8,
        convention="openood",
        progress=False,
    )
    metric_names = {r.metric for r in read_rows(tmp_path / "r" / "results.parquet")}
    assert {"fpr80", "openood.fpr80"} <= metric_names and not any("fpr95" in m for m in metric_names)
    assert "FPR@80" in (tmp_path / "r" / "table.md").read_text()


def _text(content) -> str:
    parts = [s.title + "\n" + s.text for s in content.sections]
    parts += [render_markdown(t) for t in content.tables()] + [f.caption for f in content.figures()]
    return "\n".join(parts + content.notes)


def test_the_report_of_a_tpr_80_run_says_fpr80_and_its_tables_agree(runs) -> None:
    content = build_report([runs["tpr80"]], FAST)
    text = _text(content)
    assert "FPR@80" in text and "80% of the ID" in text
    assert "FPR@95" not in text and "95% of ID" not in text and "95% of the ID" not in text
    table1 = next(t for t in content.tables() if t.key == "table1")
    assert any("FPR@80" in c for c in table1.columns)
    # Table 1's best FPR, the detector table's and the interval table's estimate are one number: FPR at 0.8.
    rows = read_rows(runs["tpr80"] / "results.parquet")
    for record in content.intervals:
        stored = next(
            r.value
            for r in rows
            if (r.detector, r.ood_dataset, r.metric) == (record.detector, record.ood_dataset, "fpr80")
        )
        assert record.intervals["fpr95/wilson"].estimate == pytest.approx(stored)
        cell = f"**{100 * stored:.1f}** ({record.detector})"
        assert cell in render_markdown(table1)


def test_the_default_report_is_unchanged(runs) -> None:
    text = _text(build_report([runs["default"]], FAST))
    assert "FPR@95" in text and "FPR@80" not in text


def test_the_report_refuses_mixed_or_conflicting_rates(runs) -> None:
    with pytest.raises(AnalysisError, match="different ID acceptance rates"):
        build_report([runs["tpr80"], runs["default"]], FAST)
    with pytest.raises(AnalysisError, match="evaluated at tpr 0.8"):
        build_report([runs["tpr80"]], ReportOptions(tpr=0.95))
    with pytest.raises(AnalysisError, match="published numbers are FPR@95"):
        build_report([runs["tpr80"]], ReportOptions(against="fi-imagenet-1k"))


def test_a_run_without_a_recorded_tpr_reads_it_from_its_row_names(runs, tmp_path) -> None:
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(runs["tpr80"], copy)
    info = json.loads((copy / "run.json").read_text())
    del info["tpr"]
    (copy / "run.json").write_text(json.dumps(info))
    assert "FPR@80" in _text(build_report([copy], FAST))
    assert np.isfinite([r.value for r in read_rows(copy / "results.parquet")]).all()
