"""Helpers of the annotate tests: a generated project, logins, claims."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np
import pytest

from oodbench.annotate.importers import TableMapping, read_table
from oodbench.text.classes import ClassList

# Set OODBENCH_TEST_POSTGRES_URL (e.g. postgresql+psycopg://user@/db?host=/run/postgresql) to run the
# database-backed tests against PostgreSQL as well as SQLite; the database is emptied before each test.
POSTGRES_URL = os.environ.get("OODBENCH_TEST_POSTGRES_URL")
DB_BACKENDS = ["sqlite"] + (["postgresql"] if POSTGRES_URL else [])
CLASSES = ClassList(tuple(f"class-{i}" for i in range(10)), tuple(f"c{i:02d}" for i in range(10)))
PASSWORD = "correct horse battery"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def write_png(path: Path, seed: int) -> None:
    """A small generated PNG image."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def fresh_db_url(backend: str) -> str | None:
    """None (SQLite in the project folder) or the test PostgreSQL database, emptied."""
    if backend == "sqlite":
        return None
    from oodbench.annotate.db import AnnotationStore, Base

    store = AnnotationStore(POSTGRES_URL)
    Base.metadata.drop_all(store.engine)
    store.close()
    return POSTGRES_URL


def build_project(base: Path, n_images: int = 4, *, examples: bool = False, backend: str = "sqlite"):
    """A project with n generated images flagged 'no-class' (odd ones also 'uncertain')."""
    pytest.importorskip("sqlalchemy", reason="the annotation database needs the 'web' extra")
    from oodbench.annotate.project import Project, import_candidates

    root = base / "images"
    rows = []
    for i in range(n_images):
        write_png(root / f"sub{i % 2}" / f"img{i:03d}.png", i)
        rows.append({"path": f"sub{i % 2}/img{i:03d}.png", "label": i % 10, "no_class": 1, "uncertain": i % 2})
    table = base / "reannotation.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    example_root = None
    if examples:
        example_root = base / "train"
        for c in range(3):
            for j in range(2):
                write_png(example_root / f"c{c:02d}" / f"ex{j}.png", 100 + 10 * c + j)
    project = Project.create(
        base / "proj",
        root,
        CLASSES,
        example_root=str(example_root) if example_root else None,
        db_url=fresh_db_url(backend),
    )
    mapping = TableMapping(original_label="label", flags={"no-class": "no_class", "uncertain": "uncertain"})
    import_candidates(project, [read_table(table, mapping, class_names=CLASSES.names)])
    return project


def csrf_of(html: str) -> str:
    """The CSRF token embedded in a page."""
    match = CSRF.search(html)
    assert match, "page has no CSRF token"
    return match.group(1)


def login(client, name: str, password: str = PASSWORD):
    """Log a TestClient in; returns the landing page response."""
    page = client.get("/login")
    return client.post("/login", data={"username": name, "password": password, "csrf_token": csrf_of(page.text)})


def claim(client):
    """Take the next image into the client's Stage 1 queue (a POST); returns the page it lands on."""
    return client.post("/annotate", data={"csrf_token": csrf_of(client.get("/").text)})
