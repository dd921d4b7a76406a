"""Hostile files planted in an annotation project: the database and its journals are never reached through a link."""

from __future__ import annotations

import os

import pytest

from oodbench.annotate.db import AnnotationStore
from oodbench.core.errors import AnnotateError

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
