"""Zero-shot evaluation (model × score × vocabulary × OOD set), its run directory, resumption, and the tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oodbench.core import metrics
from oodbench.core.errors import ZeroShotError
from oodbench.core.outputs import Outputs
from oodbench.core.results import ResultRow, read_rows
from oodbench.core.scores import load_scores
from oodbench.core.store import Store
from oodbench.report.tables import coerce_vocabularies, parse_vocabulary_score
from oodbench.text.classes import ClassList
from oodbench.text.templates import SEED_TEMPLATES
from oodbench.zeroshot import evaluate as E
from oodbench.zeroshot import scores as S
from oodbench.zeroshot.table import RunView, find_runs, load_run, sweep_markdown, table2_markdown
from oodbench.zeroshot.vocab.artefact import ADJECTIVE, NOUN, Vocabulary

from .test_scores import lse_error
from .zeroshot_helpers import HashEmbedder, toy_vocabularies

DIM = 10
CLASSES = ClassList(("apple", "bus", "cloud"), None, "three")


def _embedder() -> HashEmbedder:
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


def _datasets(with_patches: bool = True) -> dict[str, Outputs]:
    rng = np.random.default_rng(0)
    e = np.eye(DIM)

    def images(centres: list[int], n: int) -> np.ndarray:
        x = e[rng.choice(centres, n)] + 0.35 * rng.normal(size=(n, DIM))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def outputs(x: np.ndarray) -> Outputs:
        extras = {}
        if with_patches:
            patches = x[:, None, :] + 0.2 * rng.normal(size=(len(x), 4, DIM))
            extras["patch_embeddings"] = patches.astype(np.float16)
        return Outputs(features=x, extras=extras)

    return {
        "id-test": outputs(images([0, 1, 2], 60)),
        "far": outputs(images([5, 6, 7], 40)),
        "near": outputs(images([3, 4, 8], 30)),
    }


def test_plan_names_columns_and_sweeps():
    plan = E.make_plan(
        vocabularies=toy_vocabularies(), sweep_k=[1, 2], sweep_m=[2, 6], params={"neglabel": {"groups": 2}}, tau=0.02
    )
    assert list(plan.detectors)[:7] == ["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "glmcm"]
    assert set(plan.runs) == {
        "neglabel@wn",
        "neglabel@wn[m=2]",
        "neglabel@wn[m=6]",
        "neglabel@llm",
        "neglabel@llm[k=1]",
        "neglabel@llm[k=2]",
        "neglabel@oracle",
        "eoe@eoe-far",
    }
    info = plan.detectors["neglabel@oracle"]
    assert info["deployable"] is False and info["column"] == "oracle"
    # The report reads these names back: score, vocabulary and sweep point, one canonical spelling.
    for name, run in plan.runs.items():
        parameter = "m" if run.m is not None else "k" if run.k is not None else None
        assert parse_vocabulary_score(name) == (
            run.score,
            run.vocab.name,
            parameter,
            run.m if run.m is not None else run.k,
        )
    assert all(parse_vocabulary_score(name) is None for name in plan.detectors if name not in plan.runs)
    assert plan.detectors["neglabel@wn"]["params"] == {"tau": 0.02, "groups": 2, "seed": 0}
    assert plan.detectors["eoe@eoe-far"]["params"] == {"tau": 0.02, "beta": 0.25}
    forced = E.make_plan(["mcm"], toy_vocabularies()[:1], vocab_scores=["eoe"])
    assert set(forced.runs) == {"eoe@wn"}
    none = E.make_plan(["mcm", "neglabel"])
    assert none.not_run == {"neglabel": "no vocabulary was given"}
    with pytest.raises(Exception, match="parameters given for unknown"):
        E.make_plan(params={"nelabel": {"groups": 2}})


def test_scores_and_rows_match_an_independent_computation():
    datasets = _datasets()
    embed = _embedder()
    vocabs = toy_vocabularies()
    plan = E.make_plan(vocabularies=vocabs, sweep_m=[2])
    result = E.evaluate_zeroshot(datasets, "id-test", CLASSES, embed, plan, model="toy", progress=False)
    # Each vocabulary is embedded once (all its sweep points in one call), the ID names once.
    assert len(embed.calls) == 1 + 4
    id_text = embed(list(CLASSES.names), SEED_TEMPLATES)
    # M=4 takes 3 nouns and 1 adjective; 'bus' is an ID name inside the WordNet list, dropped before scoring.
    negatives = embed(["rock", "violin", "shiny"], SEED_TEMPLATES)
    two = embed(["rock", "shiny"], SEED_TEMPLATES)
    outliers = embed(["rock", "lamp", "galaxy"], SEED_TEMPLATES)
    for ds, outputs in datasets.items():
        np.testing.assert_allclose(result.scores[ds]["energy"], S.compute_score("energy", outputs.features, id_text))
        np.testing.assert_allclose(
            result.scores[ds]["glmcm"],
            S.compute_score("glmcm", outputs.features, id_text, patches=outputs.extras["patch_embeddings"]),
        )
        # The sweep's columns come from one pass over the vocabulary (`neglabel_sweep`): each share and the
        # per-run `neglabel_scores` are within 2·lse of the exact one in log (see test_scores), so 4·lse apart.
        share = 1.01 * 4 * lse_error(DIM, S.TAU, len(CLASSES.names) + 3)
        np.testing.assert_allclose(
            result.scores[ds]["neglabel@wn"], S.neglabel_scores(outputs.features, id_text, negatives), rtol=share
        )
        np.testing.assert_allclose(
            result.scores[ds]["neglabel@wn[m=2]"], S.neglabel_scores(outputs.features, id_text, two), rtol=share
        )
        np.testing.assert_allclose(
            result.scores[ds]["eoe@eoe-far"], S.eoe_scores(outputs.features, id_text, outliers), rtol=1e-12
        )
    assert result.detectors["neglabel@wn"]["dropped_id_labels"] == 1
    assert result.detectors["neglabel@wn"]["num_labels"] == 3
    rows = {(r.detector, r.ood_dataset, r.metric): r for r in result.rows}
    expected = metrics.evaluate(result.scores["id-test"]["mcm"], result.scores["far"]["mcm"])
    assert rows[("mcm", "far", "fpr95")].value == expected["fpr95"]
    assert rows[("mcm", "far", "auroc")].n_id == 60 and rows[("mcm", "far", "auroc")].n_ood == 40
    assert len(result.rows) == len(result.detectors) * 2 * 4
    # The vocabulary scores separate these OOD sets better than chance.
    assert rows[("neglabel@oracle", "far", "auroc")].value > 0.9


def test_glmcm_is_skipped_without_patches():
    plan = E.make_plan(["mcm", "glmcm"])
    result = E.evaluate_zeroshot(_datasets(with_patches=False), "id-test", CLASSES, _embedder(), plan, progress=False)
    assert "glmcm" in result.skipped and "patch" in result.skipped["glmcm"]
    assert {r.detector for r in result.rows} == {"mcm"}


def _store(tmp_path) -> Store:
    store = Store(tmp_path / "store")
    provenance = {"model": "tiny", "checkpoint": "random-init:seed=0", "preprocessing": {}, "kind": "open_clip"}
    for name, outputs in _datasets().items():
        store.write_outputs("tiny@x", name, outputs, provenance=provenance, shard_size=32)
    return store


def test_run_directory_resumes_and_recomputes_only_what_changed(tmp_path, monkeypatch):
    store = _store(tmp_path)
    vocabs = toy_vocabularies()
    plan = E.make_plan(vocabularies=vocabs, sweep_k=[2])
    out = tmp_path / "run"
    first = E.evaluate_zeroshot_store(
        store, "tiny@x", "id-test", ["far", "near"], CLASSES, _embedder(), plan, out_dir=out, progress=False
    )
    info = json.loads((out / "run.json").read_text())
    assert info["complete"] and info["fit_dataset"] is None and info["ood_datasets"] == ["far", "near"]
    assert info["zeroshot"]["vocabularies"]["oracle"]["deployable"] is False
    assert info["zeroshot"]["detectors"]["neglabel@llm[k=2]"]["k"] == 2
    # What `oodbench report` reads: the run kind and each vocabulary's label, size, deployability, family, k / M.
    assert info["kind"] == "zeroshot"
    assert info["vocabularies"] == {
        "wn": {"label": "WN", "size": 4, "deployable": True, "family": "wordnet", "m": 4},
        "llm": {"label": "LLM siblings", "size": 3, "deployable": True, "family": "siblings", "classes": 3, "k": 1},
        "oracle": {"label": "oracle", "size": 3, "deployable": False, "family": "oracle"},
        "eoe-far": {"label": "EOE", "size": 3, "deployable": True, "family": "eoe"},
    }
    assert coerce_vocabularies(info["vocabularies"])["llm"].sweep_size("k", 2) == 6
    assert set(info["score_keys"]) == set(first.detectors)
    assert len(read_rows(out / "results.parquet")) == len(first.rows)
    assert set(load_scores(out, "tiny@x", "far")) == set(first.detectors)
    assert "best logit-space" in (out / "table.md").read_text()

    calls = []  # one entry per NegLabel column computed (the columns of one vocabulary share a call)
    original = E.neglabel_sweep
    monkeypatch.setattr(E, "neglabel_sweep", lambda *a, **k: calls.extend([1] * len(a[3])) or original(*a, **k))
    embed = _embedder()
    again = E.evaluate_zeroshot_store(
        store, "tiny@x", "id-test", ["far", "near"], CLASSES, embed, plan, out_dir=out, progress=False
    )
    assert calls == [] and embed.calls == []  # everything came from the run directory
    assert again.rows == first.rows

    changed = E.make_plan(vocabularies=vocabs, sweep_k=[2], params={"neglabel": {"groups": 2}})
    third = E.evaluate_zeroshot_store(
        store, "tiny@x", "id-test", ["far", "near"], CLASSES, embed, changed, out_dir=out, progress=False
    )
    assert len(calls) == 4 * 3  # 4 neglabel columns x 3 datasets; logit, glmcm and eoe columns reused
    assert {r.detector for r in third.rows} == set(first.detectors)
    assert [v for v in third.rows if v.detector == "mcm"] == [v for v in first.rows if v.detector == "mcm"]


def _view(values: dict[str, float], detectors: dict[str, dict]) -> RunView:
    rows = [
        ResultRow("m1", "id", ood, d, "fpr95", v + shift, 10, 10)
        for d, v in values.items()
        for ood, shift in (("a", -0.01), ("b", 0.01))
    ]
    return RunView("m1", rows, detectors, ["a", "b"])


def test_table2_layout_marks_best_deployable_and_never_the_oracle():
    detectors = {
        "mcm": {"score": "mcm", "column": "logit"},
        "glmcm": {"score": "glmcm", "column": "logit"},
        "eoe@e": {"score": "eoe", "column": "EOE", "vocabulary": "e"},
        "neglabel@wn": {"score": "neglabel", "column": "WN", "vocabulary": "wn"},
        "neglabel@wn[m=10]": {"score": "neglabel", "column": "WN", "vocabulary": "wn", "m": 10},
        "neglabel@llm": {"score": "neglabel", "column": "LLM siblings", "vocabulary": "llm"},
        "neglabel@or": {"score": "neglabel", "column": "oracle", "vocabulary": "or", "deployable": False},
    }
    values = {
        "mcm": 0.50,
        "glmcm": 0.40,
        "eoe@e": 0.45,
        "neglabel@wn": 0.30,
        "neglabel@wn[m=10]": 0.05,
        "neglabel@llm": 0.20,
        "neglabel@or": 0.10,
    }
    table = table2_markdown([_view(values, detectors)])
    header, rule, row = table.splitlines()[:3]
    assert header == "| model | best logit-space | EOE | WN | LLM siblings | WN+LLM | oracle† |"
    # Sweep points are not Table-2 candidates (WN shows 30.0, not 5.0); WN+LLM is absent; oracle is not bold.
    assert row == "| m1 | 40.0 (glmcm) | 45.0 | 30.0 | **20.0** | – | 10.0 |"
    assert "non-deployable" in table and "mean over OOD set(s): a, b" in table
    one = table2_markdown([_view(values, detectors)], ood="a").splitlines()[2]
    assert one == "| m1 | 39.0 (glmcm) | 44.0 | 29.0 | **19.0** | – | 9.0 |"
    auroc_rows = [ResultRow("m1", "id", o, d, "auroc", v, 1, 1) for d, v in values.items() for o in ("a", "b")]
    auroc = table2_markdown([RunView("m1", auroc_rows, detectors, ["a", "b"])], metric="auroc").splitlines()[2]
    assert auroc == "| m1 | 50.0 (mcm) | **45.0** | 30.0 | 20.0 | – | 10.0 |"


def test_sweep_tables_and_run_discovery(tmp_path):
    store = _store(tmp_path)
    vocabs = toy_vocabularies()
    plan = E.make_plan(["mcm", "neglabel"], vocabs, sweep_k=[1, 2], sweep_m=[1, 4])
    E.evaluate_zeroshot_store(
        store,
        "tiny@x",
        "id-test",
        ["far"],
        CLASSES,
        _embedder(),
        plan,
        out_dir=tmp_path / "runs" / "tiny@x",
        progress=False,
    )
    runs = find_runs([tmp_path / "runs"])
    view = load_run(runs[0])
    text = sweep_markdown(view)
    assert "neglabel@llm: fpr95 (%) by siblings per class k" in text
    assert "neglabel@wn: fpr95 (%) by WordNet prefix size M" in text
    lines = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")]
    assert len(lines) == 3  # k=1, m=1, m=4
    with pytest.raises(Exception, match="no zero-shot run"):
        find_runs([tmp_path / "store"])


def test_report_vocabularies_labels_are_unique_within_a_run():
    wordnet, siblings, oracle, eoe = toy_vocabularies()
    second = Vocabulary(
        "wn-big",
        "wordnet",
        ["rock"],
        params={"m": 6},
        ranked={NOUN: ["rock", "violin", "lamp"], ADJECTIVE: ["shiny", "icy", "red"]},
    )
    mine = Vocabulary("mine", "custom", ["rock", "galaxy"])
    described = E.report_vocabularies([wordnet, second, siblings, oracle, mine])
    # Two WordNet lists: the kind's column name plus the vocabulary name; a custom list goes by its name.
    assert [d["label"] for d in described.values()] == ["WN: wn", "WN: wn-big", "LLM siblings", "oracle", "mine"]
    assert described["wn-big"]["m"] == 6 and "k" not in described["wn-big"] and "classes" not in described["wn-big"]
    assert described["oracle"]["deployable"] is False
    # Every entry is metadata the report accepts.
    assert set(coerce_vocabularies(described)) == set(described)


def test_a_vocabulary_the_id_filter_empties_is_refused():
    # Before: it was scored with 0 labels (NegLabel ≡ 1, AUROC 0.5) and written to the results.
    only_ids = Vocabulary("ids", "custom", ["Apple", "bus", "cloud"])
    plan = E.make_plan(vocabularies=[only_ids])
    with pytest.raises(ZeroShotError, match="'ids' has no label left after removing the ID class names"):
        E.evaluate_zeroshot(_datasets(), "id-test", CLASSES, _embedder(), plan, model="toy", progress=False)
