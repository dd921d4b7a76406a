"""Loopback load test of the annotation web app (`oodbench annotate serve`).

Builds a throw-away project of generated images, starts the real `serve` command in a separate
process on 127.0.0.1, and lets N concurrent annotators (asyncio + httpx) work through Stage 1 and
then Stage 3 exactly as a browser would: next item, page, image, POST verdict; joint-review pages,
votes, and closing reviews without consensus. It stops by itself when every image is final (or at
--deadline). Afterwards it checks the database: every acknowledged verdict (HTTP 303) is in the
event log exactly once, nothing else is, every image has exactly two Stage 1 annotators and a final
outcome. Reports p50/p95/p99 latency per request kind and throughput.

    python benchmarks/annotate_load.py --annotators 20 --images 1000 --out load.json

With --kill-after S the server is killed with SIGKILL S seconds into Stage 1, mid-traffic; the check
is then that no acknowledged verdict is missing from the log (a verdict committed whose answer the
kill swallowed may be logged unacknowledged) and that SQLite's integrity check passes.

    python benchmarks/annotate_load.py --annotators 20 --images 1000 --kill-after 30
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from oodbench.annotate.importers import TableMapping, read_table
from oodbench.annotate.project import Project, import_candidates
from oodbench.annotate.protocol import Status
from oodbench.text.classes import ClassList

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
PASSWORD = "load-test-password"
LABELS = ("kayak", "yurt", "snow globe", "hot air balloon", "axolotl")
REASONS = ("corrupted", "degraded")


def build(base: Path, n_images: int, n_annotators: int) -> Project:
    """A project with n tiny generated PNGs and n annotator accounts (default Argon2 cost)."""
    from PIL import Image

    root = base / "images"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n_images):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / f"img{i:05d}.png")
        rows.append({"path": f"img{i:05d}.png", "label": i % 10, "flag": "a" if i % 3 else "b"})
    table = base / "candidates.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "label", "flag"])
        writer.writeheader()
        writer.writerows(rows)
    classes = ClassList(tuple(f"class-{i}" for i in range(10)))
    project = Project.create(base / "proj", root, classes)
    mapping = TableMapping(original_label="label", flags={"no-class": "flag"}, include_all=True)
    import_candidates(project, [read_table(table, mapping)])
    for k in range(n_annotators):
        project.store().add_user(f"ann{k:02d}", PASSWORD)
    project.close()
    return Project.open(base / "proj")


def truth(image_id: int) -> dict[str, str]:
    """The answer most annotators give for an image (so that most pairs agree)."""
    kind = image_id % 5
    if kind < 2:
        return {"verdict": "ood", "label": LABELS[image_id % len(LABELS)]}
    if kind < 4:
        return {"verdict": "id", "class": str(image_id % 10)}
    return {"verdict": "ambiguous", "reason": REASONS[image_id % 2]}


def answer(image_id: int, annotator: int, seed: int) -> dict[str, str]:
    """An annotator's answer: the common one 75% of the time, otherwise another."""
    rng = random.Random(seed * 1_000_003 + image_id * 101 + annotator)
    if rng.random() < 0.75:
        return truth(image_id)
    return rng.choice(
        [
            {"verdict": "ood", "label": rng.choice(LABELS)},
            {"verdict": "id", "class": str(rng.randrange(10))},
            {"verdict": "ambiguous", "reason": rng.choice(REASONS)},
        ]
    )


class ServerGone(Exception):
    """The server stopped answering (killed on purpose with --kill-after)."""


class Annotator:
    """One simulated annotator with its own cookie jar."""

    def __init__(self, index: int, url: str, timings: dict, acks: list, seed: int) -> None:
        self.index = index
        self.name = f"ann{index:02d}"
        self.client = httpx.AsyncClient(base_url=url, timeout=60.0)
        self.timings = timings
        self.acks = acks
        self.seed = seed

    async def timed(self, kind: str, method: str, path: str, **kwargs) -> httpx.Response:
        start = time.perf_counter()
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerGone(str(exc)) from None
        self.timings[kind].append(time.perf_counter() - start)
        if response.status_code >= 500:
            raise RuntimeError(f"{self.name}: {method} {path} -> {response.status_code}")
        return response

    async def login(self) -> None:
        page = await self.timed("login page", "GET", "/login")
        response = await self.timed(
            "login",
            "POST",
            "/login",
            data={"username": self.name, "password": PASSWORD, "csrf_token": CSRF.search(page.text).group(1)},
        )
        if response.status_code != 303 or response.headers["location"] != "/":
            raise RuntimeError(f"{self.name} could not log in")
        home = await self.timed("home", "GET", "/")
        self.csrf = CSRF.search(home.text).group(1)  # one token per session: it serves every form

    async def claim(self) -> httpx.Response:
        """Take the next image (claims are POSTs; GET /annotate never writes)."""
        return await self.timed("next (claim)", "POST", "/annotate", data={"csrf_token": self.csrf})

    async def stage1(self, deadline: float) -> None:
        nxt = await self.claim()
        while time.monotonic() < deadline:
            if nxt.status_code == 200:  # the empty-queue page
                return
            location = nxt.headers["location"]
            if location == "/annotate":  # the queue ran dry after the last verdict
                nxt = await self.claim()
                continue
            image_id = int(location.rsplit("/", 1)[1])
            page = await self.timed("Stage 1 page", "GET", location)
            await self.timed("image", "GET", f"/image/{image_id}")
            fields = answer(image_id, self.index, self.seed)
            response = await self.timed(
                "Stage 1 POST", "POST", location, data={"csrf_token": CSRF.search(page.text).group(1), **fields}
            )
            if response.status_code != 303:
                raise RuntimeError(f"{self.name}: verdict on {image_id} refused ({response.status_code})")
            self.acks.append(("stage1", image_id, self.name, fields))
            nxt = response  # its redirect names the next image (the POST claims it)

    async def stage3(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            listing = await self.timed("Stage 3 list", "GET", "/stage3")
            ids = [int(i) for i in re.findall(r'href="/stage3/(\d+)"', listing.text)]
            random.Random(self.index).shuffle(ids)
            acted = False
            for image_id in ids:
                page = await self.timed("Stage 3 page", "GET", f"/stage3/{image_id}")
                token = CSRF.search(page.text).group(1)
                if 'id="close-form"' in page.text:
                    response = await self.timed(
                        "Stage 3 POST", "POST", f"/stage3/{image_id}/close", data={"csrf_token": token}
                    )
                    kind, fields = "close", {}
                elif (
                    'id="verdict-form"' in page.text
                    and f"<strong>{self.name}</strong>: " not in page.text.split("<h2>Panel")[-1]
                ):
                    fields = (
                        truth(image_id)
                        if random.Random(image_id + self.index).random() < 0.8
                        else answer(image_id, self.index, self.seed + 1)
                    )
                    response = await self.timed(
                        "Stage 3 POST", "POST", f"/stage3/{image_id}/vote", data={"csrf_token": token, **fields}
                    )
                    kind = "stage3"
                else:
                    continue
                if response.status_code == 303:
                    self.acks.append((kind, image_id, self.name, fields))
                    acted = True
                elif response.status_code != 400:  # 400: someone else filled the panel or closed it first
                    raise RuntimeError(f"{self.name}: {kind} on {image_id} -> {response.status_code}")
            if not ids or not acted:
                if not ids:
                    return
                await asyncio.sleep(0.05)  # wait for the other panel members

    async def close(self) -> None:
        await self.client.aclose()


def percentiles(values: list[float]) -> dict[str, float]:
    """Milliseconds at p50/p95/p99/max."""
    if not values:
        return {"n": 0}
    arr = np.asarray(values) * 1000
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(arr, 50)), 1),
        "p95_ms": round(float(np.percentile(arr, 95)), 1),
        "p99_ms": round(float(np.percentile(arr, 99)), 1),
        "max_ms": round(float(arr.max()), 1),
    }


async def baseline(url: str, n: int = 200) -> dict[str, dict[str, float]]:
    """Latency of one client alone: the floor that concurrency adds to (healthz = no app work)."""
    timings: dict[str, list[float]] = defaultdict(list)
    probe = Annotator(0, url, timings, [], 0)
    await probe.login()
    claim = await probe.claim()
    page_path = claim.headers["location"]
    for _ in range(n):
        await probe.timed("healthz", "GET", "/healthz")
        await probe.timed("Stage 1 page", "GET", page_path)
    await probe.close()
    return {kind: percentiles(timings[kind]) for kind in ("healthz", "Stage 1 page")}


async def throttle_probe(url: str, owner: str) -> dict:
    """Login throttling seen from outside: a stranger and a sprayer fail on purpose, then the owner logs in.

    Clients are told apart by X-Forwarded-For, which the server reads because it runs with
    `--trusted-proxy 127.0.0.1`.
    """

    async def attempts(address: str, pairs: list[tuple[str, str]]) -> tuple[list[float], list[bool]]:
        times, refused = [], []
        async with httpx.AsyncClient(base_url=url, timeout=60.0, headers={"X-Forwarded-For": address}) as client:
            for name, password in pairs:
                page = await client.get("/login")
                start = time.perf_counter()
                response = await client.post(
                    "/login",
                    data={"username": name, "password": password, "csrf_token": CSRF.search(page.text).group(1)},
                )
                times.append(time.perf_counter() - start)
                refused.append("Too+many" in response.headers.get("location", ""))
        return times, refused

    stranger_t, stranger_refused = await attempts("203.0.113.5", [(owner, f"guess {i}") for i in range(30)])
    sprayer_t, sprayer_refused = await attempts("203.0.113.9", [(f"user{i}", "Summer2026!") for i in range(40)])
    owner_t, _ = await attempts("198.51.100.7", [(owner, PASSWORD)])
    hashed = [t for t, r in zip(stranger_t + sprayer_t, stranger_refused + sprayer_refused, strict=True) if not r]
    throttled = [t for t, r in zip(stranger_t + sprayer_t, stranger_refused + sprayer_refused, strict=True) if r]
    async with httpx.AsyncClient(base_url=url, headers={"X-Forwarded-For": "198.51.100.7"}) as client:
        page = await client.get("/login")
        done = await client.post(
            "/login", data={"username": owner, "password": PASSWORD, "csrf_token": CSRF.search(page.text).group(1)}
        )
    return {
        "stranger_attempts_on_owner": len(stranger_t),
        "stranger_attempts_checked": stranger_refused.index(True) if True in stranger_refused else len(stranger_t),
        "sprayer_names_tried": len(sprayer_t),
        "sprayer_attempts_checked": sprayer_refused.index(True) if True in sprayer_refused else len(sprayer_t),
        "owner_logs_in_from_elsewhere": done.status_code == 303 and done.headers["location"] == "/",
        "checked_attempt_ms_p50": round(float(np.median(hashed)) * 1000, 1) if hashed else None,
        "throttled_attempt_ms_p50": round(float(np.median(throttled)) * 1000, 1) if throttled else None,
        "owner_login_ms": round(owner_t[0] * 1000, 1),
    }


async def until_gone(work) -> None:
    """Run an annotator's work until it ends or the server is gone."""
    try:
        await work
    except ServerGone:
        pass


async def run_clients(
    url: str, n: int, seed: int, deadline_s: float, kill: tuple[float, Any] | None = None
) -> tuple[dict, list, dict]:
    timings: dict[str, list[float]] = defaultdict(list)
    acks: list = []
    phases: dict = {"single_client": await baseline(url), "throttle": await throttle_probe(url, "ann00")}
    annotators = [Annotator(k, url, timings, acks, seed) for k in range(n)]
    await asyncio.gather(*(a.login() for a in annotators))
    deadline = time.monotonic() + deadline_s
    if kill is not None:  # (seconds into Stage 1, the function that kills the server)
        asyncio.get_running_loop().call_later(*kill)
    start = time.perf_counter()
    await asyncio.gather(*(until_gone(a.stage1(deadline)) for a in annotators))
    phases["stage1_s"] = time.perf_counter() - start
    start = time.perf_counter()
    await asyncio.gather(*(until_gone(a.stage3(deadline)) for a in annotators))
    phases["stage3_s"] = time.perf_counter() - start
    for a in annotators:
        await a.close()
    return timings, acks, phases


def verify(project: Project, acks: list) -> dict:
    """Compare acknowledged verdicts with the event log; check protocol completeness."""
    store = project.store()
    events = store.events()
    logged = Counter()
    for e in events:
        fields = {"verdict": e["verdict"]} if e["verdict"] else {}
        if e["label"]:
            fields["label"] = e["label"]
        if e["class_index"] is not None:
            fields["class"] = str(e["class_index"])
        if e["reason"]:
            fields["reason"] = e["reason"]
        logged[(e["kind"], e["image_id"], e["annotator"], json.dumps(fields, sort_keys=True))] += 1
    acked = Counter((k, i, n, json.dumps(f, sort_keys=True)) for k, i, n, f in acks)
    outcomes = store.replay_all()
    return {
        "acknowledged": sum(acked.values()),
        "logged": len(events),
        "lost": sum((acked - logged).values()),
        "unacknowledged_in_log": sum((logged - acked).values()),
        "images": len(outcomes),
        "images_with_two_stage1": sum(len(o.stage1) == 2 for o in outcomes.values()),
        "final": sum(o.status is Status.FINAL for o in outcomes.values()),
        "decided_in_stage3": sum(o.decided_in == 3 for o in outcomes.values()),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--images", type=int, default=1000, help="Stage 1 verdicts = 2 × images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds; the run stops by itself")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--kill-after", type=float, help="SIGKILL the server this many seconds into Stage 1")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="annotate-load-") as tmp:
        t0 = time.perf_counter()
        project = build(Path(tmp), args.images, args.annotators)
        setup_s = time.perf_counter() - t0
        port = free_port()
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from oodbench.annotate.cli import app; app()",
                "serve",
                str(project.dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                # The probe plays a reverse proxy to tell its simulated clients apart by X-Forwarded-For.
                "--trusted-proxy",
                "127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            else:
                raise RuntimeError("the server did not start: " + server.stderr.read().decode()[-2000:])
            kill = None if args.kill_after is None else (args.kill_after, server.kill)
            timings, acks, phases = asyncio.run(run_clients(url, args.annotators, args.seed, args.deadline, kill))
        finally:
            server.terminate()
            server.wait(timeout=30)
        check = verify(project, acks)
        if args.kill_after is not None:
            with sqlite3.connect(project.dir / "annotate.db") as conn:
                check["integrity_check"] = conn.execute("PRAGMA integrity_check").fetchone()[0]
            check["killed"] = server.returncode == -9
        project.close()

    requests = sum(len(v) for v in timings.values())
    verdict_posts = sum(len(timings[k]) for k in ("Stage 1 POST", "Stage 3 POST"))
    pages = timings["Stage 1 page"] + timings["Stage 3 page"] + timings["Stage 3 list"] + timings["next (claim)"]
    report = {
        "annotators": args.annotators,
        "images": args.images,
        "cpu_count": os.cpu_count(),
        "setup_s": round(setup_s, 1),
        "stage1_s": round(phases["stage1_s"], 1),
        "stage3_s": round(phases["stage3_s"], 1),
        "requests": requests,
        "requests_per_s": round(requests / max(phases["stage1_s"] + phases["stage3_s"], 1e-9), 1),
        "verdicts_per_s_stage1": round(len(timings["Stage 1 POST"]) / max(phases["stage1_s"], 1e-9), 1),
        "verdict_posts": verdict_posts,
        "latency": {kind: percentiles(v) for kind, v in sorted(timings.items())},
        "all_pages": percentiles(pages),
        "single_client": phases["single_client"],
        "throttle": phases["throttle"],
        "check": check,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.kill_after is not None:
        ok = check["lost"] == 0 and check.get("integrity_check") == "ok" and check["killed"]
        print("OK: killed mid-traffic, no acknowledged verdict lost" if ok else "FAILED: see check", file=sys.stderr)
        return 0 if ok else 1
    ok = (
        check["lost"] == 0
        and check["unacknowledged_in_log"] == 0
        and check["images_with_two_stage1"] == check["images"]
        and check["final"] == check["images"]
    )
    print("OK: no verdict lost, every image final" if ok else "FAILED: see check", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
