"""What `build_report` puts together: runs of one model that differ in their settings stay apart."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

from oodbench.core.results import read_rows, write_rows
from oodbench.core.tabular import render_markdown
from oodbench.report.build import ReportOptions, build_report

FAST = ReportOptions(draws=20, curve_draws=10, curve_points=3, resamples=20, score_figures=True)


def test_two_runs_of_one_model_are_labelled_by_what_differs(two_runs, tmp_path) -> None:
    base = tmp_path / "t1"
    other = tmp_path / "t2"
    shutil.copytree(two_runs[0], base)
    shutil.copytree(two_runs[0], other)
    info = json.loads((other / "run.json").read_text())
    info["detectors"]["energy"] = {"temperature": 2}
    (other / "run.json").write_text(json.dumps(info))
    # The second run's energy scores are different numbers: each label must show its own run's values.
    rows = [
        replace(r, value=r.value / 2) if (r.detector, r.metric) == ("energy", "fpr95") else r
        for r in read_rows(other / "results.parquet")
    ]
    write_rows(rows, other / "results.parquet")
    content = build_report([base, other], FAST)
    table1 = next(t for t in content.tables() if t.key == "table1")
    labels = [row[0].text for row in table1.rows]
    assert labels == [
        "toy-a [energy: temperature=1.0]",
        "toy-a [energy: temperature=2]",
    ]  # run.json records resolved parameters
    detectors = {t.title: render_markdown(t) for t in content.tables() if t.key.startswith("detectors-")}
    assert len(detectors) == 2
    energy = {
        title: next(line for line in text.splitlines() if line.startswith("| energy |"))
        for title, text in detectors.items()
    }
    assert (
        energy["toy-a [energy: temperature=1.0]: detectors × OOD sets"]
        != energy["toy-a [energy: temperature=2]: detectors × OOD sets"]
    )
    # Scores are still found under the real model name: subsampling and figures cover both runs.
    assert {s.model for s in content.subsample} == set(labels)
    assert len([f for f in content.figures() if f.stem.startswith("roc-")]) == 2 * 3


def test_labelled_ood_sets_get_a_per_class_acceptance_table(tmp_path) -> None:
    from oodbench.analysis.rundata import load_run
    from oodbench.core import metrics
    from oodbench.core.store import Store

    from .conftest import _load_make_run

    run_dir = _load_make_run()(tmp_path, "toy-c", seed=3, ood_labels=True)
    content = build_report([run_dir], FAST)
    section = next(s for s in content.sections if s.key == "ood-classes")
    keys = [t.key for t in section.items]
    assert keys == ["classes-toy-c-near", "classes-toy-c-far"]  # noise has no labels
    # The table's counts are the best detector's acceptance per class at the ID threshold.
    table = section.items[0]
    best = table.title.rsplit("(", 1)[1].rstrip(")")
    run = load_run(run_dir)
    ids, oods = run.paired_scores("toy-c", "id-test", "near")
    labels = Store(run.info["store"]).read_array("toy-c", "near", "labels")
    threshold = metrics.threshold_at_tpr(ids[best])
    for row in table.rows:
        label = int(row[0].text.split()[-1])
        members = oods[best][labels == label]
        assert (int(row[1].text), int(row[2].text)) == (members.size, int((members >= threshold).sum()))
