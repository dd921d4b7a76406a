"""Hostile files planted in an annotation project: the database and its journals are never reached through a link."""

from __future__ import annotations

import os

import pytest

from oodbench.annotate.db import AnnotationStore
from oodbench.core.errors import AnnotateError

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
