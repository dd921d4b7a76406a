"""`oodbench report` on a zero-shot run (written by the zero-shot evaluation) next to a supervised run, end to end.

The zero-shot run's rows feed Table 2 and the vocabulary-size figure only; the supervised tables hold the supervised
run alone. Table 2's cells are recomputed here from the saved per-image scores, independently of the result rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from oodbench.analysis.published import read_accuracy
from oodbench.analysis.rundata import load_run, load_runs
from oodbench.core import metrics
from oodbench.core.errors import AnalysisError
from oodbench.core.outputs import Outputs
from oodbench.core.results import read_rows
from oodbench.core.scores import load_scores
from oodbench.core.store import Store
from oodbench.core.tabular import render_markdown
from oodbench.report.build import ReportOptions, build_report, split_rows
from oodbench.report.cli import register
from oodbench.report.figures import vocab_sweep_lines
from oodbench.report.tables import Table, table1, table_a1, table_a2, table_detectors
from oodbench.text.classes import ClassList
from oodbench.zeroshot.evaluate import evaluate_zeroshot_store, make_plan

from ..analysis.helpers import make_run
from ..zeroshot.zeroshot_helpers import HashEmbedder, toy_vocabularies

DIM = 10
CLASSES = ClassList(("apple", "bus", "cloud"), None, "three")
ZS_MODEL = "clip-toy"
FAST = dict(draws=100, curve_draws=30, curve_points=3, resamples=100, score_figures=False)


def _embedder():
    e = np.eye(DIM)
    fixed = {
        "apple": e[0],
        "bus": e[1],
        "cloud": e[2],
        "rock": e[5],
        "violin": e[6],
        "lamp": e[7],
        "pear": 0.9 * e[0] + 0.4 * e[8],
        "tram": 0.9 * e[1] + 0.4 * e[8],
    }
    return HashEmbedder(dim=DIM, fixed=fixed)


def make_zeroshot_run(root: Path, model: str = ZS_MODEL, seed: int = 0, vocabularies: bool = True) -> Path:
    """A zero-shot run directory from synthetic image embeddings: logit scores, 4 vocabularies, k and M sweeps."""
    rng = np.random.default_rng(seed)
    e = np.eye(DIM)

    def images(centres: list[int], n: int) -> Outputs:
        x = e[rng.choice(centres, n)] + 0.45 * rng.normal(size=(n, DIM))
        return Outputs(features=(x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))

    store = Store(root / f"zs-store-{model}")
    provenance = {"model": "tiny-clip", "checkpoint": f"random-init:seed={seed}", "preprocessing": {}}
    for name, outputs in {
        "id-test": images([0, 1, 2], 80),
        "far": images([5, 6, 7], 60),
        "near": images([0, 3, 4, 8], 50),
    }.items():
        store.write_outputs(model, name, outputs, provenance=provenance, shard_size=64)
    plan = make_plan(
        ["mcm", "maxlogit", "energy", "gen", "neglabel", "eoe"],
        toy_vocabularies() if vocabularies else [],
        sweep_k=[2],
        sweep_m=[2, 6],
    )
    out = root / f"zs-run-{model}"
    evaluate_zeroshot_store(
        store, model, "id-test", ["far", "near"], CLASSES, _embedder(), plan, out_dir=out, progress=False
    )
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zs-report")
    return {"zeroshot": make_zeroshot_run(root), "supervised": make_run(root, "toy-a", seed=0), "root": root}


def _cells(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]


def _mean_fpr_from_scores(run: Path, detector: str) -> float:
    """FPR@95 averaged over the OOD sets, from the per-image scores (not from results.parquet)."""
    ids = load_scores(run, ZS_MODEL, "id-test")[detector]
    return float(
        np.mean([metrics.fpr_at_tpr(ids, load_scores(run, ZS_MODEL, ood)[detector]) for ood in ("far", "near")])
    )


def test_report_cli_puts_zero_shot_runs_in_table2_only(runs, tmp_path) -> None:
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "report",
            str(runs["supervised"]),
            str(runs["zeroshot"]),
            "--out",
            str(out),
            "--format",
            "md",
            "--figure-format",
            "png",
            "--no-score-figures",
            "--quiet",
            "--draws",
            "100",
            "--curve-draws",
            "30",
            "--resamples",
            "100",
        ],
    )
    assert result.exit_code == 0, result.output
    header, line = _cells((out / "tables" / "table2.md").read_text())
    # Columns: the vocabularies of run.json, labelled by kind with their sizes; the non-deployable oracle marked, last.
    assert header == ["model", "best logit score", "EOE (3)", "LLM siblings (3)", "WN (4)", "oracle (3)†"]
    assert line[0] == ZS_MODEL
    # Each vocabulary cell recomputed from the saved scores: its score at the vocabulary's own size, not a sweep point.
    for column, detector in (
        ("WN (4)", "neglabel@wn"),
        ("LLM siblings (3)", "neglabel@llm"),
        ("oracle (3)†", "neglabel@oracle"),
        ("EOE (3)", "eoe@eoe-far"),
    ):
        method = detector.split("@")[0]
        expected = f"{100 * _mean_fpr_from_scores(runs['zeroshot'], detector):.1f} ({method})"
        assert line[header.index(column)].replace("**", "") == expected, column
    logit = {d: _mean_fpr_from_scores(runs["zeroshot"], d) for d in ("mcm", "maxlogit", "energy", "gen")}
    best = min(logit, key=logit.get)
    assert line[1] == f"{100 * logit[best]:.1f} ({best})"
    assert (out / "figures" / "figA1-vocabulary-sweep.png").is_file()
    # The supervised tables and figures hold the supervised model only.
    for name in ("table1", "tableA1", "tableA2", "tableA6", "intervals", "delong", "detectors-toy-a"):
        text = (out / "tables" / f"{name}.md").read_text()
        assert ZS_MODEL not in text and "mcm" not in text and "neglabel" not in text and "eoe" not in text, name
    assert not list((out / "tables").glob(f"detectors-{ZS_MODEL}*"))
    assert not list((out / "figures").glob(f"*{ZS_MODEL}*"))


def _top1(run_dir: Path) -> dict[str, dict[str, float]]:
    """What the report reads from a run's accuracy.json (evaluate writes one when the ID set has labels)."""
    top1: dict[str, dict[str, float]] = {}
    for acc in read_accuracy(run_dir):
        top1.setdefault(acc.model, {})[acc.labels] = acc.top1
    return top1


def _label_sets(run_dir: Path) -> dict[str, str]:
    """The label set of each model's original labels, which the report's Top-1 caption names."""
    return {a.model: a.label_set for a in read_accuracy(run_dir) if a.labels == "original" and a.label_set}


def test_report_content_matches_the_runs_taken_alone(runs) -> None:
    content = build_report([runs["supervised"], runs["zeroshot"]], ReportOptions(**FAST))
    by_key = {t.key: t for t in content.tables()}
    supervised = load_run(runs["supervised"]).rows
    # Supervised tables: exactly those of the supervised run alone.
    for key, table in (
        ("table1", table1(supervised, top1=_top1(runs["supervised"]), label_sets=_label_sets(runs["supervised"]))),
        ("tableA1", table_a1(supervised)),
        ("tableA2", table_a2(supervised)),
        ("detectors-toy-a", table_detectors(supervised, "toy-a")),
    ):
        assert render_markdown(by_key[key]) == render_markdown(table), key
    assert {s.model for s in content.subsample} == {"toy-a"}
    assert {r.model for r in content.intervals} == {"toy-a"}
    # The vocabulary-size figure: the M sweep (2, own M=4, 6) and the k sweep (own k=1 → 3 labels, k=2 → 6).
    info = json.loads((runs["zeroshot"] / "run.json").read_text())
    zs_rows = read_rows(runs["zeroshot"] / "results.parquet")
    lines = vocab_sweep_lines(zs_rows, info["vocabularies"])[ZS_MODEL]
    assert list(lines["WN · neglabel, M sweep"]) == [2, 4, 6]
    assert list(lines["LLM siblings · neglabel, k sweep"]) == [3, 6]
    fprs = {(r.detector, r.ood_dataset): r.value for r in zs_rows if r.metric == "fpr95"}
    assert lines["WN · neglabel, M sweep"][6] == pytest.approx(
        (fprs[("neglabel@wn[m=6]", "far")] + fprs[("neglabel@wn[m=6]", "near")]) / 2
    )
    assert any(
        isinstance(item, Table) and item.key == "table2"
        for s in content.sections
        if s.key == "zeroshot"
        for item in s.items
    )


def test_a_zero_shot_and_a_supervised_run_may_share_a_model_id(runs) -> None:
    # CLIP zero-shot and a linear probe on the same store entry: same model id, ID set and some score names (energy).
    twin = make_zeroshot_run(runs["root"], model="toy-a", seed=1)
    loaded = load_runs([runs["supervised"], twin])
    supervised, zeroshot = split_rows(loaded)
    assert supervised == load_run(runs["supervised"]).rows and zeroshot == load_run(twin).rows
    content = build_report(loaded, ReportOptions(**FAST))
    by_key = {t.key: t for t in content.tables()}
    assert render_markdown(by_key["tableA1"]) == render_markdown(table_a1(supervised))
    assert _cells(render_markdown(by_key["table2"]))[1][0] == "toy-a"
    # Two runs of the same kind still clash.
    with pytest.raises(AnalysisError, match="appears in both"):
        load_runs([twin, make_zeroshot_run(runs["root"] / "again", model="toy-a", seed=1)])


def test_a_zero_shot_run_without_vocabularies_is_known_by_its_kind(runs) -> None:
    # Only logit-space scores: nothing in the names says zero-shot, run.json's "kind" does.
    logit_only = make_zeroshot_run(runs["root"], model="clip-logit", seed=2, vocabularies=False)
    assert not any("@" in r.detector for r in load_run(logit_only).rows)
    content = build_report([runs["supervised"], logit_only], ReportOptions(**FAST))
    by_key = {t.key: t for t in content.tables()}
    supervised = load_run(runs["supervised"]).rows
    expected = table1(supervised, top1=_top1(runs["supervised"]), label_sets=_label_sets(runs["supervised"]))
    assert render_markdown(by_key["table1"]) == render_markdown(expected)
    assert render_markdown(by_key["tableA1"]) == render_markdown(table_a1(supervised))
    header, line = _cells(render_markdown(by_key["table2"]))
    assert header == ["model", "best logit score"] and line[0] == "clip-logit"


def test_run_kind_is_checked(runs, tmp_path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(runs["zeroshot"], copy)
    info = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**info, "kind": "zero-shot"}))
    with pytest.raises(AnalysisError, match="unknown run kind 'zero-shot'"):
        load_run(copy)
