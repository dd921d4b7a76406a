"""Importers on the shipped ReaL and MTurk files and on generic tables."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from oodbench.annotate.importers import (
    BUILTIN,
    MTURK_FLAG,
    REAL_FLAG,
    Candidate,
    TableMapping,
    builtin_file,
    load_original_labels,
    merge_candidates,
    read_mturk,
    read_real,
    read_table,
)
from oodbench.core.errors import AnnotateError


def read_json_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def test_shipped_label_error_files_are_the_upstream_bytes():
    """The vendored files decompress to the SHA-256 their SOURCE states, and the licence ships beside them."""
    folder = builtin_file("mturk").parent
    stated = dict(
        (name, digest) for digest, name in re.findall(r"sha256 ([0-9a-f]{64})  (\S+)", (folder / "SOURCE").read_text())
    )
    assert set(stated) == {"imagenet_mturk.json", "imagenet_val_set_index_to_filepath.json"}
    for name, digest in stated.items():
        assert hashlib.sha256(gzip.decompress((folder / f"{name}.gz").read_bytes())).hexdigest() == digest
    assert "Apache License" in (folder / "LICENSE").read_text() and "Version 2.0" in (folder / "LICENSE").read_text()


def test_builtin_sources_are_found_without_importing_timm():
    import subprocess
    import sys

    code = (
        "import sys; from oodbench.annotate.importers import builtin_file; "
        "print(builtin_file('real').name, 'timm' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["imagenet_real_labels.json", "False", "False"]
    with pytest.raises(AnnotateError, match="no built-in file 'wordnet'"):
        builtin_file("wordnet")


@pytest.fixture(scope="module")
def val_labels():
    return load_original_labels(BUILTIN)


def test_real_empty_entries(val_labels):
    path = builtin_file("real")
    imp = read_real(path, val_labels)
    assert len(imp.candidates) == 3163
    raw = json.loads(path.read_text())
    empty = [i for i, labels in enumerate(raw) if labels == []]
    assert [c.key for c in imp.candidates] == [f"ILSVRC2012_val_{i + 1:08d}.JPEG" for i in empty]
    assert all(c.flags == (REAL_FLAG,) for c in imp.candidates)
    assert [c.original_label for c in imp.candidates] == [int(val_labels[i]) for i in empty]
    # Confusion pairs, counted the slow way: every ReaL label that differs from the original.
    slow = Counter(
        (int(val_labels[i]), int(lab)) for i, labels in enumerate(raw) for lab in labels if lab != val_labels[i]
    )
    assert Counter(map(tuple, imp.confusion_pairs.tolist())) == slow


def test_real_without_original_labels_has_no_pairs():
    imp = read_real(builtin_file("real"))
    assert len(imp.candidates) == 3163 and imp.confusion_pairs.shape == (0, 2)
    assert imp.candidates[0].original_label is None
    with pytest.raises(AnnotateError, match="50000 entries but 3 original labels"):
        read_real(builtin_file("real"), [1, 2, 3])


def test_val_index_gives_the_standard_label_order(val_labels):
    assert val_labels.shape == (50000,) and val_labels.min() == 0 and val_labels.max() == 999
    mturk = read_json_gz(builtin_file("mturk"))
    # The MTurk file states each image's original label independently of the index file.
    assert all(val_labels[row["id"] - 1] == row["given_original_label"] for row in mturk)


def test_mturk_majority_neither():
    path = builtin_file("mturk")
    raw = read_json_gz(path)
    imp = read_mturk(path)
    expected = [r for r in raw if r["mturk"]["neither"] * 2 > sum(r["mturk"].values())]
    assert len(imp.candidates) == len(expected) == 293
    first = imp.candidates[0]
    assert first.flags == (MTURK_FLAG,) and first.url.startswith("https://")
    assert first.path.startswith("val/n") and first.path.endswith(first.key)
    assert first.original_label == expected[0]["given_original_label"]
    assert len(read_mturk(path, min_neither=1).candidates) == sum(r["mturk"]["neither"] >= 1 for r in raw)
    fits = [r for r in raw if (r["mturk"]["guessed"] + r["mturk"]["both"]) * 2 > 5]
    assert imp.confusion_pairs.tolist() == [[r["given_original_label"], r["our_guessed_label"]] for r in fits]


def test_real_and_mturk_merge_flags(val_labels):
    real = read_real(builtin_file("real"), val_labels)
    mturk = read_mturk(builtin_file("mturk"))
    merged = merge_candidates([real.candidates, mturk.candidates])
    both = {c.key for c in real.candidates} & {c.key for c in mturk.candidates}
    assert len(merged) == 3163 + 293 - len(both)
    for cand in merged:
        if cand.key in both:
            assert set(cand.flags) == {REAL_FLAG, MTURK_FLAG} and "/" in cand.path


def test_merge_rejects_conflicting_labels():
    with pytest.raises(AnnotateError, match="disagree on its original label"):
        merge_candidates([[Candidate("a.png", "a.png", 1)], [Candidate("a.png", "a.png", 2)]])


def test_table_csv_and_jsonl(tmp_path):
    csv_path = tmp_path / "re.csv"
    csv_path.write_text(
        "file,orig,uncertain,none_fit,relabels\na/1.jpg,2,yes,0,3;4\na/2.jpg,class-1,0,0,1\nb/3.jpg,0,0,TRUE,\n"
    )
    mapping = TableMapping(
        path="file",
        original_label="orig",
        flags={"uncertain": "uncertain", "no-class": "none_fit"},
        reassigned="relabels",
        flag_prefix="re:",
    )
    imp = read_table(csv_path, mapping, class_names=[f"class-{i}" for i in range(5)])
    assert [(c.key, c.path, c.original_label, c.flags) for c in imp.candidates] == [
        ("1.jpg", "a/1.jpg", 2, ("re:uncertain",)),
        ("3.jpg", "b/3.jpg", 0, ("re:no-class",)),
    ]
    assert imp.confusion_pairs.tolist() == [[2, 3], [2, 4]]  # the '1 -> 1' re-assignment is no confusion

    jsonl = tmp_path / "re.jsonl"
    jsonl.write_text(
        json.dumps({"file": "x.png", "orig": 1, "flags_nc": True, "relabels": [1, 2]})
        + "\n\n"
        + json.dumps({"file": "y.png", "orig": 3, "flags_nc": False})
        + "\n"
    )
    imp = read_table(
        jsonl, TableMapping(path="file", original_label="orig", flags={"no-class": "flags_nc"}, reassigned="relabels")
    )
    assert [c.key for c in imp.candidates] == ["x.png"] and imp.confusion_pairs.tolist() == [[1, 2]]
    everything = read_table(jsonl, TableMapping(path="file", include_all=True))
    assert [c.flags for c in everything.candidates] == [("listed",), ("listed",)]


def test_table_mapping_from_json_and_errors(tmp_path):
    mapping_file = tmp_path / "map.json"
    mapping_file.write_text(json.dumps({"path": "p", "flags": {"uncertain": "u"}}))
    mapping = TableMapping.from_json(mapping_file)
    assert mapping.flags == {"uncertain": "u"}
    mapping_file.write_text(json.dumps({"pth": "p"}))
    with pytest.raises(AnnotateError, match="unknown mapping keys"):
        TableMapping.from_json(mapping_file)
    table = tmp_path / "t.csv"
    table.write_text("p,u\nimg.png,1\n")
    with pytest.raises(AnnotateError, match="missing the flag column 'x'"):
        read_table(table, TableMapping(path="p", flags={"x": "x"}))
    table.write_text("p,u,lab\nimg.png,1,zebra\n")
    with pytest.raises(AnnotateError, match="neither a class index nor a known class name"):
        read_table(table, TableMapping(path="p", flags={"u": "u"}, original_label="lab"))
    with pytest.raises(AnnotateError, match="unsupported table format"):
        read_table(_touch(tmp_path / "t.xlsx"), mapping)


def _touch(path):
    path.write_text("")
    return path


def test_original_label_files(tmp_path):
    np.save(tmp_path / "l.npy", np.array([3, 1, 2]))
    (tmp_path / "l.txt").write_text("3\n1\n2\n")
    (tmp_path / "l.json").write_text("[3, 1, 2]")
    for name in ("l.npy", "l.txt", "l.json"):
        assert load_original_labels(tmp_path / name).tolist() == [3, 1, 2]
    (tmp_path / "bad.txt").write_text("3\ncat\n")
    with pytest.raises(AnnotateError, match="one integer class index per line"):
        load_original_labels(tmp_path / "bad.txt")
    with pytest.raises(AnnotateError, match="not found"):
        load_original_labels(tmp_path / "missing.npy")


def test_imagenet_class_list_order():
    """Class indices follow the standard sorted-synset order (checked against an independent index file)."""
    from oodbench.text.classes import ClassListError, load_classes

    classes = load_classes("imagenet1k:timm")
    # timm's list of the ImageNet-1k synsets in class order, an index file independent of ours.
    synsets = (builtin_file("real").parent / "imagenet_synsets.txt").read_text().split()
    assert classes.wnids == tuple(synsets) == tuple(sorted(synsets)) and len(synsets) == 1000
    assert (classes.names[0], classes.names[134], classes.names[999]) == ("tench", "crane", "toilet tissue")
    assert classes.name(None) is None
    with pytest.raises(ClassListError, match="outside 0..999"):
        classes.name(1000)
