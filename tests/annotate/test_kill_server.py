"""kill -9 of a real `annotate serve` process while 20 annotators submit Stage 1 verdicts in parallel: no verdict the
server acknowledged (answered with its redirect) is lost; the database opens cleanly afterwards."""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from .helpers import CSRF, PASSWORD, build_project
from .test_cli import _serve

pytestmark = pytest.mark.hostile

ANNOTATORS = 20
KILL_AFTER = 40  # acknowledged verdicts before the kill


def test_kill_9_under_20_annotators_loses_no_acknowledged_verdict(tmp_path):
    pytest.importorskip("uvicorn", reason="the annotation app needs the 'web' extra")
    import httpx

    from oodbench.annotate.project import Project

    project = build_project(tmp_path, n_images=60)
    store = project.store()
    names = [f"ann{i:02d}" for i in range(ANNOTATORS)]
    for name in names:
        store.add_user(name, PASSWORD)
    project.close()
    server, url = _serve(project.dir, cheap_hashing=True)  # the accounts' cheap hashes are not rehashed at login
    acknowledged: list[tuple[str, int]] = []
    lock, enough, ready = threading.Lock(), threading.Event(), threading.Barrier(ANNOTATORS + 1)

    def annotate(name: str) -> None:
        with httpx.Client(base_url=url, timeout=60, verify=False) as client:  # plain HTTP: no TLS set-up
            page = client.get("/login")
            token = CSRF.search(page.text).group(1)
            client.post("/login", data={"username": name, "password": PASSWORD, "csrf_token": token})
            csrf = CSRF.search(client.get("/").text).group(1)
            ready.wait()
            try:
                while True:
                    claimed = client.post("/annotate", data={"csrf_token": csrf})
                    found = re.search(r"/annotate/(\d+)$", claimed.headers.get("location", ""))
                    if claimed.status_code != 303 or not found:
                        return  # nothing left to claim
                    image_id = int(found[1])
                    answer = client.post(
                        f"/annotate/{image_id}", data={"csrf_token": csrf, "verdict": "id", "class": "1"}
                    )
                    if answer.status_code == 303:  # the acknowledgement: the verdict is stored
                        with lock:
                            acknowledged.append((name, image_id))
                            if len(acknowledged) >= KILL_AFTER:
                                enough.set()
            except httpx.TransportError:
                return  # the server was killed

    threads = [threading.Thread(target=annotate, args=(name,)) for name in names]
    try:
        for thread in threads:
            thread.start()
        ready.wait()
        enough.wait(timeout=600)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=60)
        for thread in threads:
            thread.join(timeout=120)
    assert enough.is_set() and server.returncode == -signal.SIGKILL
    reopened = Project.open(project.dir)
    stored = {(e["annotator"], e["image_id"]) for e in reopened.store().events() if e["kind"] == "stage1"}
    reopened.close()
    lost = set(acknowledged) - stored
    assert len(acknowledged) >= KILL_AFTER and not lost, (
        f"{len(lost)} of {len(acknowledged)} acknowledged verdicts lost"
    )
