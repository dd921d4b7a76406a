"""Union, oracle and imported vocabularies; ID class lists."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from oodbench.cli.main import main
from oodbench.core.errors import ZeroShotError
from oodbench.core.outputs import Outputs
from oodbench.core.store import Store
from oodbench.text.classes import ClassList, ClassListError, imagenet_wnids, load_classes
from oodbench.zeroshot.vocab.artefact import ADJECTIVE, NOUN, Vocabulary
from oodbench.zeroshot.vocab.builders import (
    build_oracle,
    build_union,
    import_vocabulary,
    neglabel_reference_list,
    oracle_labels_from_store,
)


def _wordnet() -> Vocabulary:
    vocab = Vocabulary(
        "wn",
        "wordnet",
        [],
        params={"m": 3, "id_classes": "h"},
        ranked={NOUN: ["rock", "pear", "lamp", "moss"], ADJECTIVE: ["icy", "wet"]},
    )
    vocab.labels = vocab.select()
    return vocab


def _siblings() -> Vocabulary:
    vocab = Vocabulary(
        "llm",
        "siblings",
        [],
        params={"k": 2, "id_classes": "h"},
        per_class={"cat": ["lynx", "ocelot", "serval"], "apple": ["pear", "quince", "medlar"]},
    )
    vocab.labels = vocab.select()
    return vocab


def test_union_combines_prefix_and_per_class_lists():
    wordnet, siblings = _wordnet(), _siblings()
    assert wordnet.labels == ["rock", "pear", "icy"]
    assert siblings.labels == ["lynx", "ocelot", "pear", "quince"]
    union = build_union(wordnet, siblings, name="wn+llm")
    assert union.kind == "union" and union.deployable
    assert union.labels == ["rock", "pear", "icy", "lynx", "ocelot", "quince"]  # 'pear' once
    assert union.select(m=0, k=1) == ["lynx", "pear"]
    assert union.select(m=6, k=0) == ["rock", "pear", "lamp", "moss", "icy", "wet"]
    assert union.provenance["parents"]["wordnet"]["hash"] == wordnet.hash
    with pytest.raises(ZeroShotError, match="no WordNet ranking"):
        build_union(siblings, siblings)
    other = _siblings()
    other.params["id_classes"] = "other"
    with pytest.raises(ZeroShotError, match="different ID class lists"):
        build_union(wordnet, other)
    with pytest.raises(ZeroShotError, match="k cannot be varied"):
        wordnet.select(k=2)


def test_oracle_is_non_deployable_and_filtered(toy_lexicon, monkeypatch):
    classes = ClassList(("cat", "dog"), ("n00000001", "n00000002"), "toy")
    oracle = build_oracle({"inat": ["Oak", "kitty", "moss"], "textures": ["icy", "oak"]}, classes, lexicon=toy_lexicon)
    assert oracle.labels == ["oak", "moss", "icy"] and oracle.deployable is False
    assert oracle.provenance["dropped_id_names_or_synonyms"] == ["kitty"]
    # Even a hand-made 'oracle' vocabulary cannot be marked deployable.
    assert Vocabulary("o", "oracle", ["x"], deployable=True).deployable is False


def test_oracle_labels_from_store_entries(tmp_path):
    store = Store(tmp_path)
    outputs = Outputs(features=np.ones((2, 3), dtype=np.float32))
    provenance = {"model": "m", "checkpoint": "c", "preprocessing": {}}
    store.write_outputs("m", "places", outputs, provenance=provenance)
    with pytest.raises(ZeroShotError, match="records no class names"):
        oracle_labels_from_store(store, "m", "places")
    meta_path = store.entry_path("m", "places") / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["dataset"] = {"class_names": ["abbey", "bakery"]}
    meta_path.write_text(json.dumps(meta))
    assert oracle_labels_from_store(store, "m", "places") == ["abbey", "bakery"]


def test_import_neglabel_reference_list_keeps_its_ranking_and_loses_id_names():
    path = neglabel_reference_list()  # shipped with the package (Apache-2.0 + WordNet licence)
    classes = load_classes("imagenet1k")
    vocab = import_vocabulary(path, name="neglabel-ref", kind="wordnet", id_classes=classes)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert sum(line.startswith("the nice ") for line in lines) == 8578
    assert len(vocab.ranked[NOUN]) < 8578 - 30 and len(vocab.ranked[ADJECTIVE]) <= 1921 - 5
    assert "lynx" in vocab.provenance["dropped_id_names_or_synonyms"]
    assert vocab.ranked[NOUN][:3] == ["yellow clintonia", "yellow adder's tongue", "silvery spleenwort"]
    assert not any(label.startswith(("the nice", "this is a")) for label in vocab.labels)
    assert len(vocab.select(m=1000)) == 1000


def test_import_json_shapes(tmp_path):
    classes = ClassList(("cat", "apple"), None, "two")
    per_class = tmp_path / "near.json"
    per_class.write_text(json.dumps({"cat": ["Lynx", "ocelot", "apple"], "apple": ["pear", "quince"]}))
    vocab = import_vocabulary(per_class, name="near", kind="siblings", id_classes=classes, k=1)
    assert vocab.per_class == {"cat": ["lynx", "ocelot"], "apple": ["pear", "quince"]}
    assert vocab.labels == ["lynx", "pear"] and vocab.params["k"] == 1
    far = tmp_path / "far.json"
    far.write_text(json.dumps({"far": ["galaxy", "Cat", "ocean wave"]}))
    vocab = import_vocabulary(far, name="eoe-far", kind="eoe", id_classes=classes)
    assert vocab.per_class is None and vocab.labels == ["galaxy", "ocean wave"]
    txt = tmp_path / "list.txt"
    txt.write_text("# my negatives\nrock\nthis is a wet photo\n\nrock\n")
    assert import_vocabulary(txt, name="t", kind="custom").labels == ["rock", "wet"]
    assert import_vocabulary(txt, name="t", kind="custom", strip_prompts=False).labels == [
        "rock",
        "this is a wet photo",
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 3}')
    with pytest.raises(ZeroShotError, match="lists of strings"):
        import_vocabulary(bad, name="b", kind="custom")
    with pytest.raises(ZeroShotError, match="unknown vocabulary kind"):
        import_vocabulary(txt, name="b", kind="negatives")


def test_class_lists(tmp_path):
    # Self-contained: the subset, index and CSV files are written from timm's ImageNet metadata (the package's
    # source of WordNet ids), in the formats of MCM's ImageNet-10 lists and the Keras class index.
    wnids, lemmas = imagenet_wnids()
    picked = list(wnids[::100])
    path = tmp_path / "class_list.txt"
    path.write_text("\n".join(picked) + "\n")
    subset = load_classes(f"imagenet1k@{path}")
    assert len(subset) == 10 and subset.wnids == tuple(picked)
    full = load_classes("imagenet1k")
    assert len(full) == 1000 and full.names[0] == "tench" and full.wnids[0] == "n01440764"
    assert subset.names == tuple(full.names[i] for i in range(0, 1000, 100))
    assert load_classes("imagenet-1k") == full  # the annotation app's spelling of the same spec
    timm_names = load_classes("imagenet1k:timm")
    assert timm_names.names[1] == "goldfish" and timm_names.wnids == full.wnids
    index = tmp_path / "imagenet_class_index.json"
    index.write_text(json.dumps({str(i): [w, lemmas[w].split(",")[0].replace(" ", "_")] for i, w in enumerate(wnids)}))
    from_index = load_classes(str(index))
    assert from_index.wnids == full.wnids and from_index.names == timm_names.names
    csv = tmp_path / "classlist.csv"
    csv.write_text("".join(f"{w},{lemmas[w].split(',')[0]}\n" for w in picked))
    from_csv = load_classes(str(csv))
    assert from_csv.wnids == subset.wnids and from_csv.names[0] == "tench"
    txt = tmp_path / "c.txt"
    txt.write_text("n01440764\tfish\nbus\n")
    classes = load_classes(str(txt))
    assert classes.names == ("fish", "bus") and classes.wnids == ("n01440764", None)
    assert classes.hash != ClassList(("fish", "bus"), None, "x").hash
    assert ClassList.from_json(classes.to_json()) == classes
    assert ClassList.from_json({"names": ["a", "b"], "folders": ["c00", "c01"]}).wnids == ("c00", "c01")
    only_ids = tmp_path / "ids.txt"
    only_ids.write_text("n01440764\nn01443537\n")
    with pytest.raises(ClassListError, match="imagenet1k@"):
        load_classes(str(only_ids))
    with pytest.raises(ClassListError, match="class list not found"):
        load_classes(str(tmp_path / "missing.txt"))
    with pytest.raises(ClassListError, match="empty"):
        ClassList((), None, "nothing")


def test_import_refuses_an_empty_file_and_a_list_of_id_names(tmp_path, capsys):
    # Before: both were saved as a 0-label vocabulary and `vocab import` exited 0 ("0 labels").
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    empty, only_ids = tmp_path / "empty.txt", tmp_path / "ids.txt"
    empty.write_text("\n# nothing\n")
    only_ids.write_text("Cat\ndog.\n")
    vocab_dir = tmp_path / "vocab"
    for path, message in ((empty, "holds no labels"), (only_ids, "every label is an ID class name")):
        argv = ["zeroshot", "vocab", "import", str(path), "--name", "v", "--classes", str(classes)]
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--vocab-dir", str(vocab_dir)])  # the console entry point
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1
    assert not vocab_dir.exists() or not any(vocab_dir.rglob("*.json"))
