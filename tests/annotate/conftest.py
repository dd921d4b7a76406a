"""Fixtures of the annotate tests: a tiny project with accounts, its web app, logged-in clients."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import DB_BACKENDS, PASSWORD, build_project, login


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch):
    """Argon2id with minimal cost: the tests check hashing is used, not how slow it is."""
    try:
        from argon2 import PasswordHasher

        from oodbench.annotate import security
    except ModuleNotFoundError:  # no 'web' extra: the tests that need it skip themselves
        return
    monkeypatch.setattr(security, "_HASHER", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@pytest.fixture(params=DB_BACKENDS)
def backend(request) -> str:
    """The database the test runs on: SQLite always, PostgreSQL when configured."""
    return request.param


@pytest.fixture
def project(tmp_path: Path, backend: str):
    """A 4-image project with accounts ann1..ann4 and the admin 'boss'."""
    proj = build_project(tmp_path, backend=backend)
    store = proj.store()
    for name in ("ann1", "ann2", "ann3", "ann4"):
        store.add_user(name, PASSWORD)
    store.add_user("boss", PASSWORD, is_admin=True)
    yield proj
    proj.close()


@pytest.fixture
def app(project):
    """The web app of the fixture project."""
    pytest.importorskip("fastapi", reason="the annotation app needs the 'web' extra")
    from oodbench.annotate.web import create_app

    return create_app(project)


@pytest.fixture
def client_for(app):
    """Factory of logged-in TestClients, one cookie jar per annotator."""
    from fastapi.testclient import TestClient

    clients = []

    def make(name: str):
        client = TestClient(app)
        clients.append(client)
        response = login(client, name)
        assert response.status_code == 200 and f">{name}<" in response.text
        return client

    yield make
    for client in clients:
        client.close()
