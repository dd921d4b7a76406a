"""Top-1 beside OOD: single labels, the multi-label (ReaL) rule, zero-shot, accuracy.json, Spearman's ρ."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from oodbench.cli.main import app
from oodbench.core.outputs import Outputs
from oodbench.core.store import Store
from oodbench.evaluation.accuracy import (
    ACCURACY_FILE,
    AccuracyError,
    AccuracyRow,
    load_multilabels,
    multilabel_top1,
    predictions,
    rank_correlation,
    read_accuracy,
    real_labels_path,
    top1,
    write_accuracy,
    zero_shot_predictions,
)


def one_hot_logits(classes: list[int], num_classes: int = 1000) -> np.ndarray:
    logits = np.zeros((len(classes), num_classes), dtype=np.float32)
    logits[np.arange(len(classes)), classes] = 5.0
    return logits


def test_multilabel_rule_closed_form():
    # Sets: {1, 5}, {} (excluded), {3}, {0}; predictions 1, 2, 3, 4 → hits on rows 0 and 2 of the 3 used.
    sets = np.array([[1, 5], [-1, -1], [3, -1], [0, -1]])
    row = multilabel_top1(np.array([1, 2, 3, 4]), sets)
    assert (row.top1, row.n, row.n_excluded) == (2 / 3, 3, 1)
    covered = np.array([True, True, False, True])  # row 2 not in the label file: excluded as well
    row = multilabel_top1(np.array([1, 2, 3, 4]), sets, covered)
    assert (row.top1, row.n, row.n_excluded) == (1 / 2, 2, 2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.lists(st.integers(0, 6), max_size=4, unique=True)), min_size=1, max_size=40
    )
)
def test_multilabel_rule_matches_a_set_loop(cases):
    predicted = np.array([p for p, _ in cases])
    width = max(1, max(len(s) for _, s in cases))
    sets = np.full((len(cases), width), -1)
    for i, (_, labels) in enumerate(cases):
        sets[i, : len(labels)] = labels
    used = [(p, set(s)) for p, s in cases if s]
    row = multilabel_top1(predicted, sets)
    assert row.n == len(used) and row.n_excluded == len(cases) - len(used)
    if used:
        assert row.top1 == pytest.approx(sum(p in s for p, s in used) / len(used), abs=1e-12)
    else:
        assert np.isnan(row.top1)


def test_single_label_top1_skips_unknown_labels():
    assert top1(np.array([0, 1, 2, 2]), np.array([0, 1, 1, -1])) == (2 / 3, 3)


def test_predictions_are_chunked_argmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(257, 13)).astype(np.float32)
    np.testing.assert_array_equal(predictions(logits), logits.argmax(axis=1))
    with pytest.raises(AccuracyError, match=r"\(N, C\)"):
        predictions(np.zeros(3))


def test_zero_shot_prediction_is_the_most_similar_class():
    text = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])  # rows renormalised: (1,0), (0,1), (-.71,-.71)
    images = np.array([[0.9, 0.1], [0.2, 0.8], [-0.5, -0.6], [3.0, 2.9]], dtype=np.float32)
    np.testing.assert_array_equal(zero_shot_predictions(images, text), [0, 1, 2, 0])
    with pytest.raises(AccuracyError, match="do not share a dimension"):
        zero_shot_predictions(images, np.ones((3, 5)))


def test_timm_real_labels_are_read_at_run_time():
    labels = load_multilabels(real_labels_path())
    assert "site-packages" in labels.source or "timm" in labels.source
    assert len(labels.sets) == 50_000
    # The first five val images of ReaL (timm's imagenet_real_labels.json).
    assert labels.sets["ILSVRC2012_val_00000001"] == ()
    assert labels.sets["ILSVRC2012_val_00000002"] == (970, 795)
    assert labels.sets["ILSVRC2012_val_00000005"] == (516, 850)
    assert sum(not s for s in labels.sets.values()) == 3163  # images with no acceptable ImageNet class


def test_other_multilabel_files(tmp_path):
    by_name = tmp_path / "relabels.json"
    by_name.write_text(json.dumps({"val/n1/ILSVRC2012_val_00000007.JPEG": [3], "photo.png": [1, 2]}))
    labels = load_multilabels(by_name)
    sets, covered = labels.for_items(["a/ILSVRC2012_val_00000007.JPEG", "b/photo.png", "c/other.png"])
    np.testing.assert_array_equal(sets, [[3, -1], [1, 2], [-1, -1]])
    np.testing.assert_array_equal(covered, [True, True, False])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([[1], ["dog"]]))
    with pytest.raises(AccuracyError, match="must be a list of class indices"):
        load_multilabels(bad)


@pytest.fixture
def val_store(tmp_path):
    """An ID set of six ImageNet val images (ReaL ids 1-6) with known predictions and labels."""
    items = [f"val/n0000000{i}/ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 7)]
    # ReaL: 1 → {}, 2 → {970, 795}, 3 → {230, 231}, 4 → {809}, 5 → {516, 850}, 6 → see assert below.
    real = load_multilabels()
    assert real.sets["ILSVRC2012_val_00000006"] == (57,)
    predicted = [65, 795, 231, 809, 1, 2]
    labels = np.array([65, 970, 230, 809, 516, 57])
    store = Store(tmp_path / "store")
    provenance = {"model": "m", "checkpoint": "c", "preprocessing": {}}
    outputs = Outputs(np.zeros((6, 2), np.float32), one_hot_logits(predicted), labels)
    store.write_outputs("m", "val", outputs, provenance=provenance)
    (store.entry_path("m", "val") / "items.txt").write_text("".join(f"{item}\n" for item in items))
    return store


def test_accuracy_command_writes_the_schema(val_store, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "accuracy",
        "--store",
        str(val_store.root),
        "--model-id",
        "m",
        "--dataset",
        "val",
        "--run-dir",
        str(run_dir),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((run_dir / ACCURACY_FILE).read_text())
    assert data["model"] == "m"
    rows = {row["labels"]: row for row in data["rows"]}
    # Original: predictions equal labels on images 1 and 4 → 2/6. ReaL: image 1 excluded (empty set); hits on
    # 2 (795 ∈ {970, 795}), 3 (231 ∈ {230, 231}), 4 (809) → 3/5.
    # No record of how the entry was read (written directly): integer labels in [0, 1000) index the head.
    assert rows["original"] == {
        "dataset": "val",
        "labels": "original",
        "top1": 2 / 6,
        "n": 6,
        "n_excluded": 0,
        "label_set": "class indices 0-999",
    }
    assert rows["real"] == {
        "dataset": "val",
        "labels": "real",
        "top1": 3 / 5,
        "n": 5,
        "n_excluded": 1,
        "label_set": "ImageNet-1k (real)",
    }
    assert read_accuracy(run_dir) == data
    assert "top1=0.6000" in result.output


def test_plugged_in_relabels_and_bad_spec(val_store, tmp_path):
    relabels = tmp_path / "reimagenet.json"
    relabels.write_text(json.dumps({"ILSVRC2012_val_00000005": [1], "ILSVRC2012_val_00000006": []}))
    base = ["accuracy", "--store", str(val_store.root), "--model-id", "m", "--dataset", "val", "--no-real"]
    result = CliRunner().invoke(app, [*base, "--run-dir", str(tmp_path / "run"), "--labels", f"reimagenet={relabels}"])
    assert result.exit_code == 0, result.output
    rows = {row["labels"]: row for row in read_accuracy(tmp_path / "run")["rows"]}
    assert set(rows) == {"original", "reimagenet"}
    assert (rows["reimagenet"]["top1"], rows["reimagenet"]["n"], rows["reimagenet"]["n_excluded"]) == (1.0, 1, 5)
    result = CliRunner().invoke(app, [*base, "--labels", "no-equals-sign"])
    assert result.exit_code == 2 and "NAME=FILE" in result.output


def test_write_accuracy_merges_rows_and_read_checks_schema(tmp_path):
    write_accuracy(tmp_path, "m", [AccuracyRow("val", "original", 0.5, 10, 0)])
    write_accuracy(tmp_path, "m", [AccuracyRow("val", "real", 0.75, 8, 2), AccuracyRow("val", "original", 0.6, 10, 0)])
    rows = read_accuracy(tmp_path)["rows"]
    assert [(r["labels"], r["top1"]) for r in rows] == [("original", 0.6), ("real", 0.75)]
    (tmp_path / ACCURACY_FILE).write_text(json.dumps({"model": "m", "rows": [{"dataset": "val"}]}))
    with pytest.raises(AccuracyError, match="malformed row"):
        read_accuracy(tmp_path)


def test_evaluate_store_records_accuracy(val_store, tmp_path):
    from oodbench.evaluation.evaluate import evaluate_store

    rng = np.random.default_rng(0)
    provenance = {"model": "m", "checkpoint": "c", "preprocessing": {}}
    for name in ("fit", "ood"):
        logits = rng.normal(size=(20, 1000)).astype(np.float32)
        labels = rng.integers(0, 1000, 20) if name == "fit" else None
        val_store.write_outputs("m", name, Outputs(rng.normal(size=(20, 2)), logits, labels), provenance=provenance)
    evaluate_store(val_store, "m", "fit", "val", ["ood"], ["msp"], out_dir=tmp_path / "run", progress=False)
    rows = {row["labels"]: row["top1"] for row in read_accuracy(tmp_path / "run")["rows"]}
    assert rows == {"original": 2 / 6, "real": 3 / 5}


def test_rank_correlation_against_scipy():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(3)
    top = {f"m{i}": float(v) for i, v in enumerate(rng.integers(70, 90, 30))}  # ties on purpose
    fpr = {f"m{i}": float(v) for i, v in enumerate(rng.integers(20, 60, 30))}
    fpr["only-fpr"] = 1.0
    rho, n = rank_correlation(top, fpr)
    expected = spearmanr([top[m] for m in top], [fpr[m] for m in top]).statistic
    assert n == 30 and rho == pytest.approx(expected, abs=1e-12)
    assert rank_correlation({"a": 1, "b": 2, "c": 3}, {"a": 30, "b": 20, "c": 10}) == (-1.0, 3)
    assert np.isnan(rank_correlation({"a": 1, "b": 2}, {"a": 1, "b": 2})[0])


def test_zero_shot_without_cached_text_embeddings_says_how_to_cache_them(val_store, tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    args = ["accuracy", "--store", str(val_store.root), "--model-id", "m", "--dataset", "val", "--zero-shot"]
    result = CliRunner().invoke(app, [*args, "--classes", str(classes)])
    assert result.exit_code == 2
    assert "no cached text embeddings for 2 labels x 8 templates" in " ".join(result.output.split())


def _synsets():
    from oodbench.extract.datasets import imagenet_synsets

    return list(imagenet_synsets())


def test_head_label_set_matches_labels_to_the_heads_classes():
    from oodbench.evaluation.accuracy import LabelSet, head_label_set

    synsets = _synsets()
    labels = np.array([0, 1, 2, 6])
    # ImageNet layouts (and synset file lists) name ImageNet-1k classes: they index a 1000-class head only.
    assert head_label_set({"class_names": synsets}, labels, 1000) == LabelSet("ImageNet-1k")
    assert "but the model's head has 10 classes" in head_label_set({"class_names": synsets}, labels, 10)
    # Seven digit folders against an ImageNet head: the silent zero. No Top-1, and why.
    folders = {"class_names": [str(i) for i in range(7)], "layout": "class sub-folders"}
    reason = head_label_set(folders, labels, 1000)
    assert isinstance(reason, str) and reason.startswith("its labels number its 7 class folders (0-6), not the 1000")
    # As many folders as head classes: their sorted order is taken as the head's (torchvision's ImageFolder rule).
    assert head_label_set(folders, labels, 7).name.startswith("7 class folders in sorted order")
    # Folders named by synsets are mapped onto ImageNet-1k's indices.
    subset = {"class_names": [synsets[5], synsets[17], synsets[999]]}
    mapped = head_label_set(subset, np.array([0, 1, 2]), 1000)
    assert mapped.name == "ImageNet-1k (class folders named by synset)"
    np.testing.assert_array_equal(mapped.to_head, [5, 17, 999])
    # Bare integer labels must lie in the head's range.
    assert head_label_set(None, np.array([0, 999]), 1000).name == "class indices 0-999"
    assert head_label_set({}, np.array([0, 12]), 10) == "its labels reach 12 but the model's head has 10 classes"


def test_synset_folders_score_top1_on_imagenet_indices(tmp_path):
    """Rows labelled 0, 1, 2 by folder position are ImageNet classes 5, 17, 999: predictions are compared there."""
    from oodbench.evaluation.accuracy import accuracy_rows

    synsets = _synsets()
    store = Store(tmp_path / "store")
    provenance = {"model": "m", "checkpoint": "c", "preprocessing": {}}
    labels = np.array([0, 1, 2, 2])
    arrays = {"features": np.zeros((4, 2), np.float32), "logits": one_hot_logits([5, 17, 999, 3]), "labels": labels}
    meta = {"dataset": {"class_names": [synsets[5], synsets[17], synsets[999]], "layout": "class sub-folders"}}
    writer = store.writer("m", "val", provenance=provenance, num_items=4, shard_size=4, item_hash="h")
    writer.write_shard(0, {**arrays, "index": np.arange(4)})
    writer.finalize(extra_meta=meta)
    (row,) = accuracy_rows(store, "m", "val", need_items=False)
    assert (row.top1, row.n, row.label_set) == (3 / 4, 4, "ImageNet-1k (class folders named by synset)")


def test_report_caption_names_the_label_set_and_why_top1_is_missing():
    from oodbench.core.results import ResultRow
    from oodbench.report.tables import table1

    rows = [
        ResultRow(model, "id", "ood", "msp", metric, value, 10, 10)
        for model in ("a", "b")
        for metric, value in (("fpr95", 0.5), ("auroc", 0.8))
    ]
    table = table1(
        rows,
        top1={"a": {"original": 0.7}},
        label_sets={"a": "ImageNet-1k"},
        top1_missing={"b": "id (original labels): its labels number its 7 class folders (0-6)"},
    )
    notes = " ".join(table.notes)
    assert "Top-1: accuracy on the ID test set's original labels (ImageNet-1k)" in notes
    assert "Top-1 of b not computed: id (original labels): its labels number its 7 class folders (0-6)." in notes
    assert "ImageNet-1k accuracy on the original labels" not in notes
