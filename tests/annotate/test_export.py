"""Export: extract-readable file lists, manifests, statistics recomputed from the event log."""

from __future__ import annotations

import csv
import json

import pytest

from oodbench.annotate.export import export
from oodbench.annotate.protocol import Judgement, Verdict
from oodbench.core.errors import AnnotateError

from .helpers import PASSWORD, build_project


def decide(store, users, image_id, first, second, panel=None):
    a, b = users[0], users[1]
    assert store.next_stage1(a) == image_id and store.next_stage1(b) == image_id
    store.submit_stage1(a, image_id, first)
    store.submit_stage1(b, image_id, second)
    for user, vote in zip(users, panel or [], strict=False):
        store.vote_stage3(user, image_id, vote)


@pytest.fixture
def decided(tmp_path, backend):
    """Six images: OOD by agreement, OOD by review, ID, ambiguous, no consensus, pending."""
    project = build_project(tmp_path, n_images=6, backend=backend)
    store = project.store()
    for name in ("a", "b", "c"):
        store.add_user(name, PASSWORD)
    users = sorted(store.users(), key=lambda u: u.name)
    ids = {img.key: img.id for img in store.images()}
    OOD, ID, AMB = Verdict.OOD, Verdict.ID, Verdict.AMBIGUOUS
    decide(
        store, users, ids["img000.png"], Judgement(OOD, label="Yurt", fine_grained=True), Judgement(OOD, label="yurt")
    )
    decide(
        store,
        users,
        ids["img001.png"],
        Judgement(OOD, label="canoe"),
        Judgement(ID, class_index=3),
        [Judgement(OOD, label="canoe")] * 3,
    )
    decide(store, users, ids["img002.png"], Judgement(ID, class_index=4), Judgement(ID, class_index=4))
    decide(store, users, ids["img003.png"], Judgement(AMB, reason="corrupted"), Judgement(AMB, reason="degraded"))
    decide(
        store,
        users,
        ids["img004.png"],
        Judgement(ID, class_index=1),
        Judgement(ID, class_index=2),
        [Judgement(ID, class_index=1), Judgement(ID, class_index=2), Judgement(ID, class_index=1)],
    )
    store.close_stage3(users[0], ids["img004.png"])
    yield project
    project.close()


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_export_files_and_statistics(decided, tmp_path):
    out = tmp_path / "bench"
    manifest = export(decided, out, name="fi-test")
    assert manifest["counts"] == {"images": 6, "ood": 2, "id": 1, "ambiguous": 2, "pending": 1}
    root = decided.root("images")
    ood = read_csv(out / "fi-test.csv")
    assert [r["path"] for r in ood] == [str(root / "sub0/img000.png"), str(root / "sub1/img001.png")]
    assert all(r["label"] == "" for r in ood)
    assert read_csv(out / "fi-test-id.csv") == [{"path": str(root / "sub0/img002.png"), "label": "4"}]
    rich = read_csv(out / "ood_manifest.csv")
    assert [
        (
            r["key"],
            r["ood_label"],
            r["ood_concept"],
            r["fine_grained"],
            r["original_label"],
            r["flags"],
            r["decided_in"],
        )
        for r in rich
    ] == [
        ("img000.png", "Yurt", "yurt", "1", "0", "no-class", "2"),
        ("img001.png", "canoe", "canoe", "0", "1", "no-class;uncertain", "3"),
    ]
    assert rich[0]["original_label_name"] == "class-0" and rich[1]["annotators"] == "a;b;c"
    ambiguous = read_csv(out / "ambiguous.csv")
    assert [(r["key"], r["reason"], r["decided_in"]) for r in ambiguous] == [
        ("img003.png", "corrupted+degraded", "2"),
        ("img004.png", "no-consensus", "3"),
    ]
    everything = read_csv(out / "manifest.csv")
    assert [r["status"] for r in everything] == ["final"] * 5 + ["stage1"]
    # Statistics: percentages of decided images, overall and per flag (odd images are also 'uncertain').
    stats = json.loads((out / "stats.json").read_text())
    overall, no_class, uncertain = stats["groups"]
    assert overall == {
        "group": "all",
        "candidates": 6,
        "decided": 5,
        "pending": 1,
        "ood": 2,
        "ood_pct": 40.0,
        "id": 1,
        "id_pct": 20.0,
        "ambiguous": 2,
        "ambiguous_pct": 40.0,
        "concepts": 2,
        "fine_grained": 1,
        "fine_grained_pct": 50.0,
        "by_agreement": 3,
        "by_review": 2,
    }
    assert no_class["group"] == "no-class" and no_class["candidates"] == 6
    assert (
        uncertain["group"],
        uncertain["candidates"],
        uncertain["ood"],
        uncertain["ambiguous"],
        uncertain["id"],
        uncertain["pending"],
    ) == ("uncertain", 3, 1, 1, 0, 1)
    assert uncertain["ood_pct"] == 50.0
    assert "| all | 6 | 5 | 2 | 40.0 |" in (out / "stats.md").read_text()
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert len(events) == 2 * 5 + 3 + 3 + 1 and {"annotator", "kind", "at"} <= set(events[0])
    assert json.loads((out / "manifest.json").read_text())["files"]["ood_list"] == "fi-test.csv"


def test_extract_reads_the_export_as_a_dataset(decided, tmp_path):
    datasets = pytest.importorskip("oodbench.extract.datasets", reason="extract is not in this checkout")
    for relative in (False, True):
        out = tmp_path / f"bench-{relative}"
        export(decided, out, relative=relative)
        ood = datasets.file_list(out / "ood.csv")
        assert len(ood) == 2 and ood.labels is None
        paths = ood.paths(range(len(ood)))
        assert [p.rsplit("/", 1)[-1] for p in map(str, paths)] == ["img000.png", "img001.png"]
        assert all(__import__("os").path.isfile(p) for p in paths)
        returned = datasets.file_list(out / "ood-id.csv")
        assert returned.labels.tolist() == [4]
    registry = pytest.importorskip("oodbench.extract.dataset_registry")
    export(decided, tmp_path / "named", name="fi-imagenet-1k")
    found = registry.open_registered("fi-imagenet-1k", tmp_path / "named")
    assert len(found) == 2 and found.labels is None


def test_export_recomputes_from_events_and_checks_files(decided, tmp_path):
    import sqlalchemy as sa

    store = decided.store()
    with store.engine.begin() as conn:  # a stale status cache must not leak into the export
        conn.execute(sa.text("UPDATE images SET status = 'stage1'"))
    assert export(decided, tmp_path / "x")["counts"]["ood"] == 2
    next(decided.root("images").rglob("img000.png")).unlink()
    with pytest.raises(AnnotateError, match="no longer inside their roots"):
        export(decided, tmp_path / "y")
    with pytest.raises(AnnotateError, match="invalid export name"):
        export(decided, tmp_path / "z", name="../evil")
