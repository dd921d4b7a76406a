"""The annotation database: queues, append-only events, protocol writes, accounts."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from oodbench.annotate.protocol import Judgement, Status, Verdict
from oodbench.core.errors import AnnotateError

from .helpers import PASSWORD, build_project


def users(store):
    return {u.name: u for u in store.users()}


def test_queue_gives_each_image_to_exactly_two_annotators(project):
    store = project.store()
    u = users(store)
    first = store.next_stage1(u["ann1"])
    assert store.next_stage1(u["ann1"]) == first  # unsubmitted work stays at the head of the queue
    # The second annotator is steered to the half-claimed image so pairs complete early.
    assert store.next_stage1(u["ann2"]) == first
    assert store.next_stage1(u["ann3"]) != first
    store.submit_stage1(u["ann1"], first, Judgement(Verdict.ID, class_index=1))
    assert store.next_stage1(u["ann1"]) not in (None, first)
    with pytest.raises(AnnotateError, match="not in your queue"):
        store.submit_stage1(u["ann4"], first, Judgement(Verdict.ID, class_index=1))


def test_concurrent_claims_and_verdicts(tmp_path, backend):
    project = build_project(tmp_path, n_images=12, backend=backend)
    store = project.store()
    names = [f"w{i}" for i in range(6)]
    for name in names:
        store.add_user(name, PASSWORD)
    u = users(store)
    errors = []

    def work(name):
        try:
            while (image_id := store.next_stage1(u[name])) is not None:
                store.submit_stage1(u[name], image_id, Judgement(Verdict.ID, class_index=image_id % 3))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    outcomes = store.replay_all()
    assert all(o.status is Status.FINAL and len(o.stage1) == 2 for o in outcomes.values())
    assert len(store.events()) == 24  # no verdict lost, none duplicated
    project.close()


def test_events_are_append_only(project):
    store = project.store()
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label="yurt"))
    store.add_match(u["boss"], "yurt", "ger")
    with store.engine.connect() as conn:
        for sql in ("UPDATE events SET label = 'tent'", "DELETE FROM events", "DELETE FROM label_matches"):
            with pytest.raises(sa.exc.DatabaseError, match="append-only"):
                conn.exec_driver_sql(sql)
            conn.rollback()
    assert store.events()[0]["label"] == "yurt"


def test_revision_stage3_and_explicit_match(project):
    store = project.store()
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    assert store.next_stage1(u["ann2"]) == image_id
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label="canoe"))
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label="kayak"))  # revision
    assert store.own_stage1(u["ann1"], image_id).label == "kayak"
    assert store.own_stage1(u["ann2"], image_id) is None
    out = store.submit_stage1(u["ann2"], image_id, Judgement(Verdict.OOD, label="sea kayak"))
    assert out.status is Status.STAGE3 and [i.id for i in store.stage3_images()] == [image_id]
    with pytest.raises(AnnotateError, match="Stage 1 is over"):
        store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label="sea kayak"))
    assert store.add_match(u["boss"], "Sea kayak", "kayak") == 1
    final = store.outcome(image_id)
    assert final.status is Status.FINAL and final.decided_in == 2 and final.concept == "kayak"
    assert store.image(image_id).status is Status.FINAL and not store.stage3_images()
    kinds = [(e["annotator"], e["kind"], e["label"]) for e in store.events(image_id)]
    assert kinds == [("ann1", "stage1", "canoe"), ("ann1", "stage1", "kayak"), ("ann2", "stage1", "sea kayak")]


def test_stage3_panel_close(project):
    store = project.store()
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    store.next_stage1(u["ann2"])
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.ID, class_index=1))
    store.submit_stage1(u["ann2"], image_id, Judgement(Verdict.ID, class_index=2))
    for name, cls in (("ann1", 1), ("ann2", 2), ("ann3", 1)):
        store.vote_stage3(u[name], image_id, Judgement(Verdict.ID, class_index=cls))
    with pytest.raises(AnnotateError, match="panel of this image is full"):
        store.vote_stage3(u["ann4"], image_id, Judgement(Verdict.ID, class_index=1))
    out = store.close_stage3(u["ann2"], image_id)
    assert out.verdict is Verdict.AMBIGUOUS and out.reason == "no-consensus"
    assert store.replay_all()[image_id] == out


def test_release_returns_claims(project):
    store = project.store()
    u = users(store)
    a = store.next_stage1(u["ann1"])
    store.next_stage1(u["ann2"])  # same image, slot 1
    assert store.release("ann1") == 1
    assert store.next_stage1(u["ann3"]) == a  # the freed slot is offered again
    store.submit_stage1(u["ann3"], a, Judgement(Verdict.ID, class_index=0))
    store.submit_stage1(u["ann2"], a, Judgement(Verdict.ID, class_index=0))
    assert store.outcome(a).status is Status.FINAL
    with pytest.raises(AnnotateError, match="no user"):
        store.release("nobody")


def test_accounts_and_sessions(project):
    store = project.store()
    assert store.authenticate("ann1", PASSWORD).name == "ann1"
    assert store.authenticate("ann1", "wrong password") is None
    assert store.authenticate("ghost", PASSWORD) is None
    with pytest.raises(AnnotateError, match="already exists"):
        store.add_user("ann1", PASSWORD)
    with pytest.raises(AnnotateError, match="invalid user name"):
        store.add_user("a b", PASSWORD)
    with pytest.raises(AnnotateError, match="at least 8"):
        store.add_user("short", "1234")
    user = users(store)["ann1"]
    token, csrf = store.open_session(user)
    assert store.session_user(token) == (user, csrf)
    assert store.session_user("forged") is None
    store.set_password("ann1", "another password")
    assert store.session_user(token) is None  # a new password ends old sessions
    assert store.authenticate("ann1", "another password") is not None
    with store.engine.connect() as conn:  # passwords are stored as Argon2id hashes only
        hashes = [row[0] for row in conn.exec_driver_sql("SELECT password_hash FROM users")]
    assert all(h.startswith("$argon2id$") and PASSWORD not in h for h in hashes)


def test_reimport_keeps_events_and_adds_flags(tmp_path, backend):
    import numpy as np

    from oodbench.annotate.importers import Candidate, Import
    from oodbench.annotate.project import import_candidates

    project = build_project(tmp_path, n_images=2, backend=backend)
    store = project.store()
    store.add_user("ann1", PASSWORD)
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.ID, class_index=0))
    extra = Import([Candidate("img000.png", "img000.png", 0, ("mturk:neither",))], np.zeros((0, 2), np.int64), "x")
    assert import_candidates(project, [extra]) == {"added": 0, "updated": 1, "skipped": 0}
    image = next(i for i in store.images() if i.key == "img000.png")
    assert image.flags == ("no-class", "mturk:neither") and len(store.events()) == 1
    missing = Import([Candidate("nope.png", "nope.png")], np.zeros((0, 2), np.int64), "x")
    with pytest.raises(AnnotateError, match="not under"):
        import_candidates(project, [missing])
    project.close()


# -- findings of the outside review --------------------------------------------------------------
def test_release_between_queue_check_and_write_cannot_slip_in(project, monkeypatch):
    """The queue check and the Stage 1 write are one transaction: a release racing them wins or loses whole."""
    store = project.store()
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    original_write = type(store).write
    raced = []

    def write_after_a_release(self):
        # The race made deterministic: `annotate release` commits just before the verdict's transaction.
        if not raced:
            raced.append(None)
            raced[0] = store.release("ann1")
        return original_write(self)

    monkeypatch.setattr(type(store), "write", write_after_a_release)
    with pytest.raises(AnnotateError, match="not in your queue"):
        store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.ID, class_index=1))
    monkeypatch.undo()
    assert raced == [1] and store.events() == []
    assert store.progress(u["ann1"])["mine_open"] == 0


@pytest.mark.parametrize(
    "label", ["cat\x00dog", "tab\tbed", "line\nbreak", "\x1b[31mred", "del\x7f", "rtl\u202eevil", "iso\u2066late"]
)
def test_labels_with_control_characters_are_refused(project, label):
    store = project.store()
    u = users(store)
    image_id = store.next_stage1(u["ann1"])
    with pytest.raises(AnnotateError, match="control character"):
        store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label=label))
    with pytest.raises(AnnotateError, match="control character"):
        store.add_match(u["boss"], label, "snow globe")
    assert store.events() == [] and store.matches() == []
    # Letters of any script, accents, apostrophes and joiners inside words stay accepted.
    store.submit_stage1(u["ann1"], image_id, Judgement(Verdict.OOD, label="crème brûlée · ドーナツ · ک\u200cتاب"))


def test_out_of_range_ids_are_unknown_images(project):
    store = project.store()
    u = users(store)
    for image_id in (2**63, 10**20, 0, -1):
        assert store.image(image_id) is None
        assert not store.is_assigned(u["ann1"], image_id) and not store.may_view(u["ann1"], image_id)
        with pytest.raises(AnnotateError, match="no image"):
            store.vote_stage3(u["ann1"], image_id, Judgement(Verdict.ID, class_index=1))


def test_database_file_is_private(tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("file modes concern the SQLite file only")
    project = build_project(tmp_path)
    store = project.store()
    store.add_user("ann1", PASSWORD)  # a write, so the -wal and -shm files exist
    files = sorted(project.dir.glob("annotate.db*"))
    assert [f.name for f in files][:1] == ["annotate.db"]
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: "0o600" for f in files}
    project.close()


# -- schema versions -----------------------------------------------------------------------------
V0_SQL = Path(__file__).parent / "data" / "annotate_v0.sql"


def test_database_of_the_previous_version_is_migrated(tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("the frozen database is SQLite")
    from oodbench.annotate.db import SCHEMA_VERSION
    from oodbench.annotate.project import Project

    built = build_project(tmp_path)  # the image files and project files; its database is replaced
    built.close()
    db_file = built.dir / "annotate.db"
    for path in built.dir.glob("annotate.db*"):
        path.unlink()
    with sqlite3.connect(db_file) as conn:
        conn.executescript(V0_SQL.read_text(encoding="utf-8"))
    assert sqlite3.connect(db_file).execute("PRAGMA user_version").fetchone() == (0,)

    project = Project.open(built.dir)
    store = project.store()
    assert store.schema_version() == SCHEMA_VERSION
    indexes = {row[0] for row in sqlite3.connect(db_file).execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"ix_events_image_kind", "ix_assignments_user_open"} <= indexes
    # Everything written before is there and behaves: the disagreement, the claim, the match, the accounts.
    u = users(store)
    assert set(u) == {"ann1", "ann2", "boss"} and u["boss"].is_admin
    assert store.authenticate("ann1", PASSWORD) is not None
    outcome = store.outcome(1)
    assert outcome.status is Status.STAGE3 and {n: j.label for n, j in outcome.stage1.items()} == {
        "ann1": "snow globe",
        "ann2": None,
    }
    assert store.matches()[0][:3] == ("snow globe", "snowdome", "boss")
    assert store.pending_stage1(u["ann1"]) == 2
    store.submit_stage1(u["ann1"], 2, Judgement(Verdict.OOD, label="kayak"))
    with store.engine.begin() as conn, pytest.raises(sa.exc.DatabaseError, match="append-only"):
        conn.execute(sa.text("DELETE FROM events"))
    assert len(store.events()) == 3
    project.close()
    # Opening again is a no-op; a database of a newer oodbench is refused with one line.
    assert Project.open(built.dir).store().migrate() == SCHEMA_VERSION
    with sqlite3.connect(db_file) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(AnnotateError, match="newer than this oodbench"):
        Project.open(built.dir).store()


def test_new_database_starts_at_the_current_version(project):
    from oodbench.annotate.db import SCHEMA_VERSION

    assert project.store().schema_version() == SCHEMA_VERSION
    assert project.store().migrate() == SCHEMA_VERSION  # nothing left to do
