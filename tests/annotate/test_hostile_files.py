"""Hostile files planted in an annotation project: the database and its journals are never reached through a link.

SQLite opens the `-wal`, `-shm` and `-journal` files again with every new connection, and a server opens new
connections for as long as it runs: a file planted after the database was first opened is refused by the next
connection. A FIFO planted as `-journal` blocked that connection for ever (SQLite opens a journal it finds to read
its header), a link there failed with "database is locked", and a rollback journal copied from another database
(a stale one) was played back by SQLite into the annotation database, replacing its content.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oodbench.annotate.db import AnnotationStore
from oodbench.core.errors import AnnotateError

from ..hostile import bounded

pytestmark = pytest.mark.hostile

VICTIM = b"precious bytes outside the project\n"


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["link-to-victim", "fifo", "directory"])
def test_a_planted_database_file_is_refused(tmp_path, suffix, kind):
    victim = tmp_path / "victim.db"
    victim.write_bytes(VICTIM)
    database = tmp_path / "project" / "annotations.db"
    database.parent.mkdir()
    planted = database.with_name(database.name + suffix)
    if kind == "link-to-victim":
        planted.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    with pytest.raises(AnnotateError) as info:
        AnnotationStore(f"sqlite:///{database}").create_schema()
    assert "\n" not in str(info.value) and str(planted) in str(info.value)
    assert victim.read_bytes() == VICTIM


def _plant(planted, kind, victim) -> None:
    if kind == "link-to-victim":
        planted.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()


@pytest.fixture
def opened(tmp_path):
    """An annotation database in use: its schema written and an account added, its connections then closed."""
    database = tmp_path / "project" / "annotations.db"
    database.parent.mkdir()
    store = AnnotationStore(f"sqlite:///{database}")
    store.create_schema()
    store.add_user("ann1", "correct horse battery")
    store.close()  # SQLite removes -wal and -shm with its last connection; the next connection opens them again
    assert not database.with_name(database.name + "-wal").exists()
    yield store, database
    store.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["link-to-victim", "fifo", "directory"])
def test_a_database_file_planted_while_the_database_is_in_use_is_refused_by_the_next_connection(
    tmp_path, opened, suffix, kind
):
    store, database = opened
    victim = tmp_path / "victim.db"
    victim.write_bytes(VICTIM)
    planted = database.with_name(database.name + suffix)
    _plant(planted, kind, victim)
    refused = bounded(store.users, planted if kind == "fifo" else None)
    assert isinstance(refused, AnnotateError), repr(refused)
    assert "\n" not in str(refused) and str(planted) in str(refused)
    assert victim.read_bytes() == VICTIM


@pytest.fixture(scope="module")
def foreign_journal(tmp_path_factory) -> bytes:
    """A hot rollback journal of another SQLite database: its writer was killed with SIGKILL mid-transaction, after
    its pages spilled into that database (so SQLite would roll the journal back on the next open)."""
    folder = tmp_path_factory.mktemp("other")
    other = folder / "other.db"
    code = (
        "import os, signal, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA journal_mode=DELETE'); c.execute('CREATE TABLE t(x)'); c.execute('PRAGMA cache_size=1')\n"
        "c.execute('BEGIN')\n"
        "for i in range(2000): c.execute('INSERT INTO t VALUES (?)', ('spilled' * 50,))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(other)], check=False)
    journal = folder / "other.db-journal"
    data = journal.read_bytes()
    assert data[:8] == bytes.fromhex("d9d505f920a163d7"), "not a hot journal"  # the rollback journal's magic
    return data


@pytest.mark.parametrize("when", ["on opening", "on the next connection"])
def test_a_rollback_journal_beside_the_database_is_refused_not_played_back(opened, foreign_journal, when):
    """The database is in WAL mode and never writes a rollback journal: one found beside it is another database's
    (or a stale one), and SQLite would copy its pages into the database. It is refused; the database is unchanged."""
    store, database = opened
    journal = database.with_name(database.name + "-journal")
    journal.write_bytes(foreign_journal)
    before = database.read_bytes()
    action = store.users if when == "on the next connection" else lambda: AnnotationStore(f"sqlite:///{database}")
    refused = bounded(action, None)
    assert isinstance(refused, AnnotateError), repr(refused)
    assert "\n" not in str(refused) and str(journal) in str(refused)
    assert database.read_bytes() == before
    journal.unlink()
    assert [user.name for user in store.users()] == ["ann1"]


@pytest.mark.parametrize("kind", ["link-to-valid-answer", "fifo", "not-utf8", "nested"])
def test_a_planted_llm_cache_file_is_not_replayed(tmp_path, kind):
    import json

    from oodbench.annotate.llm import LLMDescriber

    describer = LLMDescriber.__new__(LLMDescriber)
    cache = tmp_path / "cache" / "answer.json"
    cache.parent.mkdir()
    valid = {"description": "a tent", "closed_world": "tent", "open_world": None, "parse_error": False}
    if kind == "link-to-valid-answer":
        (tmp_path / "elsewhere.json").write_text(json.dumps(valid))
        cache.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "fifo":
        os.mkfifo(cache)
    elif kind == "not-utf8":
        cache.write_bytes(b"\xff" + json.dumps(valid).encode())
    else:
        cache.write_text("[" * 100_000 + "]" * 100_000)
    assert describer.cached(cache) is None


def test_an_image_that_is_a_fifo_is_one_line(tmp_path):
    from oodbench.annotate.llm import LLMDescriber

    describer = LLMDescriber.__new__(LLMDescriber)
    describer.cache_dir = tmp_path / "cache"
    image = tmp_path / "x.jpg"
    os.mkfifo(image)
    with pytest.raises(AnnotateError, match="not a regular file"):
        describer.describe(image, ["tent"])


# -- the project's own files: project.json, classes.json, secret.key, examples.json ---------------------------------
PROJECT_FILES = ["project.json", "classes.json", "secret.key", "examples.json"]


def _project(tmp_path):
    """A project folder with every file the app reads (examples.json written by hand: no example root is needed)."""
    from oodbench.annotate.project import Project
    from oodbench.text.classes import ClassList

    images = tmp_path / "images"
    images.mkdir()
    project = Project.create(tmp_path / "project", images, ClassList(("tent", "kite"), None, "test"))
    project.close()
    (project.dir / "examples.json").write_text('{"0": ["tent/a.png"]}')
    return project.dir


def _read_project(directory) -> None:
    """Everything `annotate status` and `annotate serve` read from the project folder."""
    from oodbench.annotate.project import Project

    project = Project.open(directory)
    try:
        assert project.secret and project.examples is not None
    finally:
        project.close()


def _plant_project_file(planted, kind, outside) -> None:
    outside.write_bytes(planted.read_bytes())  # a valid copy outside the project
    planted.unlink()
    if kind == "link-to-valid-copy":
        planted.symlink_to(outside)
    elif kind == "link-to-dev-zero":
        planted.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(planted)
    elif kind == "directory":
        planted.mkdir()
    else:  # larger than any file of this kind may be (sparse: nothing is written)
        with open(planted, "wb") as handle:
            handle.truncate(5000 if planted.name == "secret.key" else 64 * 2**20 + 1)


def test_the_intact_project_reads(tmp_path):
    _read_project(_project(tmp_path))


@pytest.mark.parametrize("name", PROJECT_FILES)
@pytest.mark.parametrize("kind", ["link-to-valid-copy", "link-to-dev-zero", "fifo", "directory", "too-large"])
def test_a_planted_project_file_is_refused(tmp_path, name, kind):
    """A link (even to a valid copy), a FIFO, a directory or an oversized file in place of a project file is one
    AnnotateError line naming it; a FIFO never blocks (a reader that did block is released, and the test fails)."""
    directory = _project(tmp_path)
    planted = directory / name
    _plant_project_file(planted, kind, tmp_path / f"outside-{name}")
    refused = bounded(lambda: _read_project(directory), planted if kind == "fifo" else None)
    assert isinstance(refused, AnnotateError), repr(refused)
    assert "\n" not in str(refused) and str(planted) in str(refused)


@pytest.mark.parametrize(("name", "command"), [("classes.json", ["status"]), ("secret.key", ["serve", "--port", "0"])])
def test_the_cli_refuses_a_fifo_project_file_at_once(tmp_path, name, command):
    """`annotate status` with a FIFO classes.json and `annotate serve` with a FIFO secret.key hung for ever."""
    directory = _project(tmp_path)
    (directory / name).unlink()
    os.mkfifo(directory / name)
    args = [sys.executable, "-m", "oodbench", "annotate", command[0], str(directory), *command[1:]]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"`oodbench annotate {command[0]}` blocked on the FIFO {name}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert name in lines[0] and "FIFO" in lines[0]
