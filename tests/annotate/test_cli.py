"""`oodbench annotate …` end to end on small real inputs."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest

from .helpers import write_png

pytest.importorskip("sqlalchemy", reason="the annotation database needs the 'web' extra")
from typer.testing import CliRunner  # noqa: E402

from oodbench.annotate.cli import app  # noqa: E402

runner = CliRunner()


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def test_init_on_shipped_real_and_mturk_files(tmp_path):
    from oodbench.annotate.importers import builtin_file

    real = index = mturk_file = "builtin"  # the copies shipped with timm (ReaL) and oodbench (Northcutt et al.)
    empty = [i + 1 for i, labels in enumerate(json.loads(builtin_file("real").read_text())) if not labels][:3]
    with gzip.open(builtin_file("mturk"), "rt") as handle:
        neither = [r for r in json.load(handle) if r["mturk"]["neither"] >= 3][:2]
    images = tmp_path / "val"
    for number in empty:  # flat layout for ReaL candidates ...
        write_png(images / f"ILSVRC2012_val_{number:08d}.JPEG", number)
    for row in neither:  # ... and synset folders for MTurk ones
        write_png(images / "val" / row["url"].split("/")[-2] / f"ILSVRC2012_val_{row['id']:08d}.JPEG", row["id"])
    project = tmp_path / "proj"
    result = invoke(
        "init", project, "--images", images, "--real", real, "--original-labels", index, "--mturk", mturk_file
    )
    assert result.exit_code == 2 and "are not under" in result.output and "--skip-missing" in result.output
    result = invoke(
        "init",
        project,
        "--images",
        images,
        "--real",
        real,
        "--original-labels",
        index,
        "--mturk",
        mturk_file,
        "--skip-missing",
    )
    assert result.exit_code == 0, result.output
    assert "real: 3163 candidates" in result.output and "mturk: 293 candidates" in result.output
    overlap = len(
        {f"ILSVRC2012_val_{n:08d}.JPEG" for n in empty} & {f"ILSVRC2012_val_{r['id']:08d}.JPEG" for r in neither}
    )
    assert f"{5 - overlap} images added" in result.output

    from oodbench.annotate.project import Project

    proj = Project.open(project)
    images_in = {img.key: img for img in proj.store().images()}
    row = neither[0]
    img = images_in[f"ILSVRC2012_val_{row['id']:08d}.JPEG"]
    assert img.path.startswith("val/n") and img.original_label == row["given_original_label"]
    assert img.evidence["original"]["name"] == proj.classes.names[row["given_original_label"]]
    assert img.evidence["reverse_search"]["url"] == row["url"]
    real_img = images_in[f"ILSVRC2012_val_{empty[0]:08d}.JPEG"]
    assert "no public URL" in real_img.evidence["reverse_search"]["absent"]
    conf = real_img.evidence["confusions"]
    assert conf["source"] == "real+mturk" and conf["classes"][0]["count"] >= conf["classes"][-1]["count"]
    proj.close()
    # A rerun adds nothing twice.
    again = invoke("init", project, "--images", images, "--real", real, "--original-labels", index, "--skip-missing")
    assert again.exit_code == 0 and "0 images added" in again.output


def test_init_users_status_export(tmp_path, monkeypatch):
    images = tmp_path / "imgs"
    for i in range(3):
        write_png(images / f"p{i}.png", i)
    table = tmp_path / "cands.csv"
    table.write_text("path,uncertain\np0.png,1\np1.png,0\np2.png,yes\n")
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"flags": {"uncertain": "uncertain"}}))
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    project = tmp_path / "proj"
    result = invoke("init", project, "--images", images, "--table", table, "--mapping", mapping, "--classes", classes)
    assert result.exit_code == 0, result.output
    assert "2 images added" in result.output and "user add" in result.output
    result = invoke("user", "add", project, "alice", "--admin", input="s3cret-pass\ns3cret-pass\n")
    assert result.exit_code == 0 and "created admin user alice" in result.output
    monkeypatch.setenv("OODBENCH_PASSWORD", "an0ther-pass")
    assert invoke("user", "add", project, "bob").exit_code == 0
    dup = invoke("user", "add", project, "bob")
    assert dup.exit_code == 2 and "already exists" in dup.output
    assert invoke("user", "list", project).output.split() == ["alice", "(admin)", "bob"]

    from oodbench.annotate.project import Project
    from oodbench.annotate.protocol import Judgement, Verdict

    proj = Project.open(project)
    store = proj.store()
    alice, bob = sorted(store.users(), key=lambda u: u.name)
    for _ in range(2):
        image_id = store.next_stage1(alice)
        assert store.next_stage1(bob) == image_id
        for user in (alice, bob):
            store.submit_stage1(user, image_id, Judgement(Verdict.OOD, label="axolotl"))
    proj.close()
    status = invoke("status", project)
    assert status.exit_code == 0 and "2 final" in status.output and "| uncertain | 2 | 2 | 2 | 100.0 |" in status.output
    out = tmp_path / "bench"
    result = invoke("export", project, out, "--name", "fi-mini")
    assert result.exit_code == 0 and "2 OOD" in result.output
    with open(out / "fi-mini.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["path"].rsplit("/", 1)[-1] for r in rows) == ["p0.png", "p2.png"]
    match = invoke("match", project, "axolotl", "mexican walking fish", "--by", "bob")
    assert match.exit_code == 2 and "not an admin" in match.output
    assert invoke("match", project, "axolotl", "mexican walking fish", "--by", "alice").exit_code == 0


def test_cli_errors_are_one_line(tmp_path):
    missing = invoke("status", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "is not an annotation project" in missing.output
    images = tmp_path / "imgs"
    images.mkdir()
    none = invoke("init", tmp_path / "p", "--images", images)
    assert none.exit_code == 2 and "at least one candidate source" in none.output
    bad_classes = invoke(
        "init", tmp_path / "p", "--images", images, "--real", tmp_path / "x.json", "--classes", "nope.txt"
    )
    assert bad_classes.exit_code == 2 and "class list not found" in bad_classes.output


def test_evidence_command(tmp_path):
    images = tmp_path / "imgs"
    for i in range(2):
        write_png(images / f"p{i}.png", i)
    (tmp_path / "c.csv").write_text("path,f\np0.png,1\np1.png,1\n")
    (tmp_path / "m.json").write_text(json.dumps({"flags": {"f": "f"}}))
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    train = tmp_path / "train"
    for c in "abc":
        write_png(train / c / "x.png", ord(c))
    project = tmp_path / "proj"
    assert (
        invoke(
            "init",
            project,
            "--images",
            images,
            "--table",
            tmp_path / "c.csv",
            "--mapping",
            tmp_path / "m.json",
            "--classes",
            tmp_path / "classes.txt",
            "--examples",
            train,
        ).exit_code
        == 0
    )
    np.save(tmp_path / "img.npy", np.array([[1.0, 0, 0], [0, 0, 1.0]], dtype=np.float32))
    np.save(tmp_path / "txt.npy", np.eye(3, dtype=np.float32))
    (tmp_path / "keys.txt").write_text("p0.png\np1.png\n")
    result = invoke(
        "evidence",
        project,
        "--image-embeddings",
        tmp_path / "img.npy",
        "--keys",
        tmp_path / "keys.txt",
        "--text-embeddings",
        tmp_path / "txt.npy",
        "--k",
        2,
        "--model",
        "toy",
    )
    assert result.exit_code == 0, result.output
    assert "VLM evidence added to 2 images" in result.output and "indexed for 3 classes" in result.output
    from oodbench.annotate.project import Project

    proj = Project.open(project)
    top = {img.key: [c["name"] for c in img.evidence["vlm"]["classes"]] for img in proj.store().images()}
    assert top["p0.png"][0] == "a" and top["p1.png"][0] == "c"
    assert proj.example_file(2, 0) == (train / "c" / "x.png").resolve()
    proj.close()


def test_init_demo_builds_a_working_sample_project(tmp_path):
    pytest.importorskip("fastapi", reason="the annotation app needs the 'web' extra")
    import re

    from fastapi.testclient import TestClient

    from oodbench.annotate.project import Project
    from oodbench.annotate.web import create_app

    from .helpers import login

    result = invoke("init", tmp_path / "sample", "--demo")
    assert result.exit_code == 0, result.output
    password = re.search(r"password for all: (\S+)", result.output).group(1)
    project = Project.open(tmp_path / "sample")
    images = {img.key: img for img in project.store().images()}
    assert len(images) == 18 and "oodbench annotate serve" in result.output
    # Real candidates: validation image 1 has no ReaL label and is a 'sea snake' (class 65) in the original labels.
    first = images["ILSVRC2012_val_00000001.JPEG"]
    assert first.flags == ("real:no-label",) and first.original_label == 65
    assert sum(img.flags == ("mturk:neither",) for img in images.values()) == 6
    for img in images.values():  # every image has a file, confusions (E), the tiny model's top 5 (D), examples
        assert project.image_file(img) is not None
        assert len(img.evidence["vlm"]["classes"]) == 5 and "not a VLM" in img.evidence["vlm"]["model"]
        assert img.evidence["confusions"]["classes"] and img.original_label in project.examples
    with TestClient(create_app(project)) as client:
        assert "Hello, ann1" in login(client, "ann1", password).text
    project.close()
    again = invoke("init", tmp_path / "sample", "--demo")
    assert again.exit_code == 2 and "already holds a project" in again.output
    mixed = invoke("init", tmp_path / "other", "--demo", "--real", "builtin")
    words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", mixed.output).split())  # typer wraps usage errors in a box
    assert mixed.exit_code == 2 and "give it only the project folder" in words


def test_evidence_from_a_feature_store_entry(tmp_path):
    """The bridge: an extracted store entry (features, index, items.txt, head) feeds evidence D directly."""
    from oodbench.annotate.project import Project
    from oodbench.core.outputs import Head, Outputs
    from oodbench.core.store import Store

    from .helpers import build_project

    project = build_project(tmp_path)  # images sub{i%2}/img00{i}.png, classes class-0..class-9
    project.close()
    rng = np.random.default_rng(0)
    head = rng.normal(size=(10, 16)).astype(np.float32)
    items = ["sub0/img000.png", "sub1/img001.png", "sub0/img002.png", "sub1/img003.png", "sub0/unrelated.png"]
    # Row i of the features is image i pushed towards class 7 - i: the head's nearest row by cosine.
    features = np.stack([head[7 - i] + 0.01 * rng.normal(size=16) for i in range(5)]).astype(np.float32)
    store = Store(tmp_path / "store")
    entry = store.write_outputs("m", "d", Outputs(features=features), provenance={"model": "m"})
    (entry / "items.txt").write_text("".join(f"{item}\n" for item in items))
    store.write_head("m", Head(head, np.zeros(10, np.float32)), provenance={"model": "m"})

    result = invoke("evidence", project.dir, "--store", tmp_path / "store", "--entry", "m/d", "--k", 3)
    assert result.exit_code == 0, result.output
    assert "VLM evidence added to 4 images" in result.output
    proj = Project.open(project.dir)
    for image in proj.store().images():
        row = items.index(image.path)
        vlm = image.evidence["vlm"]
        assert vlm["model"] == "m (classifier head)" and vlm["classes"][0]["class"] == 7 - row
    proj.close()
    missing = invoke("evidence", project.dir, "--store", tmp_path / "store", "--entry", "m/nothing")
    assert missing.exit_code == 2 and "has no entry m/nothing" in missing.output
    (entry / "items.txt").unlink()
    unlisted = invoke("evidence", project.dir, "--store", tmp_path / "store", "--entry", "m/d")
    assert unlisted.exit_code == 2 and "records no item list" in unlisted.output


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Prepended to the server's command by `_serve(..., cheap_hashing=True)`: Argon2id at the test fixtures' minimal cost.
_CHEAP_HASHING = (
    "from argon2 import PasswordHasher; from oodbench.annotate import security; "
    "security._HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1); "
)


def _serve(project_dir, *options, cheap_hashing: bool = False):
    """`oodbench annotate serve` in its own process (the real uvicorn settings); yields its URL.

    With `cheap_hashing`, the server hashes passwords at the test fixtures' minimal cost: for tests whose promise is
    not about logging in, where each login's rehash to the full cost would take most of the test's time.
    """
    import os
    import subprocess
    import sys
    import time

    httpx = pytest.importorskip("httpx")
    port = _free_port()
    command = (_CHEAP_HASHING if cheap_hashing else "") + "from oodbench.cli import main; main()"
    args = ["annotate", "serve", str(project_dir), "--port", str(port), *options]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-c", command, *args], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, timeout=2, verify=False) as client:  # plain HTTP on loopback: no TLS set-up
        while time.monotonic() < deadline:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.1)
    return server, url


def test_the_real_server_ignores_spoofed_forwarding_headers(tmp_path):
    """All clients of `serve` reach it from 127.0.0.1 (an SSH tunnel); X-Forwarded-For must not tell them apart.

    uvicorn trusts that header from 127.0.0.1 by default: with it, each spoofed address got its own budget.
    """
    pytest.importorskip("uvicorn", reason="the annotation app needs the 'web' extra")
    import httpx

    from .helpers import CSRF, PASSWORD, build_project

    project = build_project(tmp_path)
    project.store().add_user("ann1", PASSWORD)  # hashed with the cheap test parameters, which verify cheaply
    project.close()

    def attempt(client, password: str, address: str) -> str:
        token = CSRF.search(client.get("/login").text).group(1)
        data = {"username": "ann1", "password": password, "csrf_token": token}
        return client.post("/login", data=data, headers={"X-Forwarded-For": address}, follow_redirects=True).text

    server, url = _serve(project.dir)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            answers = [attempt(client, "guess guess", f"203.0.113.{i}") for i in range(6)]
            assert all("Wrong name or password" in a for a in answers[:5]) and "Too many failed" in answers[5]
            assert "Too many failed" in attempt(client, PASSWORD, "198.51.100.7")  # a claimed new address: no
    finally:
        server.terminate()
        server.wait(timeout=30)
    server, url = _serve(project.dir, "--trusted-proxy", "127.0.0.1")  # a real proxy on this host
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            answers = [attempt(client, "guess guess", "203.0.113.1") for _ in range(6)]
            assert "Too many failed" in answers[5]
            assert "Hello, ann1" in attempt(client, PASSWORD, "198.51.100.7")  # the proxy's word is taken
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_serve_refuses_a_bad_trusted_proxy(tmp_path):
    from .helpers import build_project

    build_project(tmp_path).close()
    result = invoke("serve", tmp_path / "proj", "--trusted-proxy", "localhost")
    assert result.exit_code == 2 and "--trusted-proxy 'localhost' is not an IP address or network" in result.output
