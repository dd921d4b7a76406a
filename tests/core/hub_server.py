"""A Hugging Face Hub stand-in on 127.0.0.1 speaking the parts of the Hub API that pack push and pull use.

Routes (as ``huggingface_hub`` calls them): ``POST /api/repos/create``, ``POST /api/datasets/{repo}/preupload/{rev}``
(files above 1 kB go through LFS), ``POST /api/validate-yaml``
(the card's front matter), ``POST /datasets/{repo}.git/info/lfs/objects/batch`` (basic transfer),
``PUT /lfs/{oid}`` (checked against its SHA-256), ``POST /api/datasets/{repo}/commit/{rev}`` (NDJSON), and
``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}`` with ``Range``. Every request is logged; ``break_after``
cuts a file's next download after that many bytes, and ``refuse`` answers 503 to that many further downloads, to
interrupt a pull. Any other route answers 404 and is logged, so a test sees what the client needed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_PREUPLOAD = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)$")
_COMMIT = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)$")
_BATCH = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$")
_LFS = re.compile(r"^/lfs/(?P<oid>[0-9a-f]{64})$")


class HubState:
    """Repositories (commit, files), uploaded LFS objects, the request log and the failures to inject."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Any]] = {}
        self.lfs: dict[str, bytes] = {}
        self.log: list[tuple[str, str, dict[str, str]]] = []
        self.unknown: list[str] = []
        self.cards: list[Any] = []
        self.break_after: dict[str, int] = {}
        self.refuse: dict[str, int] = {}
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    state: HubState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: the state keeps the log
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, payload: Any, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        with self.state.lock:
            self.state.log.append((self.command, self.path, dict(self.headers)))

    def _missing(self) -> None:
        self.state.unknown.append(f"{self.command} {self.path}")
        body = self._body() if self.command in ("POST", "PUT") else b""
        del body
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    # --------------------------------------------------------------- writing
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self._record()
        path = self.path.split("?")[0]
        state = self.state
        if path == "/api/repos/create":
            body = json.loads(self._body())
            repo = f"{body.get('organization') or 'user'}/{body['name']}" if "/" not in body["name"] else body["name"]
            with state.lock:
                state.repos.setdefault(repo, {"commit": "0" * 40, "files": {}, "count": 0})
            return self._json({"url": f"http://{self.headers['Host']}/datasets/{repo}", "name": repo})
        if path == "/api/validate-yaml":
            # The dataset card's front matter must be a YAML mapping with the fields the Hub reads.
            content = json.loads(self._body())["content"]
            errors = []
            parts = content.split("---\n")
            if not content.startswith("---\n") or len(parts) < 3:
                errors.append({"message": "no YAML front matter"})
            else:
                import yaml

                front = yaml.safe_load(parts[1])
                if not isinstance(front, dict) or not isinstance(front.get("license"), str):
                    errors.append({"message": "front matter must be a mapping with a license"})
                state.cards.append(front)
            return self._json({"errors": errors, "warnings": []}, 400 if errors else 200)
        if match := _PREUPLOAD.match(path):
            body = json.loads(self._body())
            files = [
                {"path": f["path"], "uploadMode": "lfs" if f["size"] > 1000 else "regular", "shouldIgnore": False}
                for f in body["files"]
            ]
            return self._json({"files": files, "commitOid": self.state.repos[match["repo"]]["commit"]})
        if _BATCH.match(path):
            body = json.loads(self._body())
            host = self.headers["Host"]
            objects = [
                {
                    "oid": o["oid"],
                    "size": o["size"],
                    "authenticated": True,
                    "actions": {"upload": {"href": f"http://{host}/lfs/{o['oid']}"}},
                }
                for o in body["objects"]
                if o["oid"] not in state.lfs
            ]
            return self._json({"transfer": "basic", "objects": objects})
        if match := _COMMIT.match(path):
            repo = state.repos.get(match["repo"])
            if repo is None:
                return self._json({"error": "Repository not found"}, 404)
            lines = [json.loads(line) for line in self._body().decode().splitlines() if line.strip()]
            with state.lock:
                for line in lines:
                    value = line["value"]
                    if line["key"] == "file":
                        repo["files"][value["path"]] = base64.b64decode(value["content"])
                    elif line["key"] == "lfsFile":
                        repo["files"][value["path"]] = state.lfs[value["oid"]]
                repo["count"] += 1
                repo["commit"] = hashlib.sha1(f"{match['repo']}:{repo['count']}".encode()).hexdigest()
            host = self.headers["Host"]
            return self._json(
                {
                    "commitUrl": f"http://{host}/datasets/{match['repo']}/commit/{repo['commit']}",
                    "commitOid": repo["commit"],
                    "pullRequestUrl": None,
                }
            )
        return self._missing()

    def do_PUT(self) -> None:  # noqa: N802
        self._record()
        match = _LFS.match(self.path.split("?")[0])
        if not match:
            return self._missing()
        data = self._body()
        if hashlib.sha256(data).hexdigest() != match["oid"]:
            return self._json({"error": "checksum mismatch"}, 400)
        with self.state.lock:
            self.state.lfs[match["oid"]] = data
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # --------------------------------------------------------------- reading
    def _file(self) -> tuple[dict[str, Any], str, bytes] | None:
        match = _RESOLVE.match(self.path.split("?")[0])
        if not match:
            return None
        repo = self.state.repos.get(match["repo"])
        if repo is None or match["path"] not in repo["files"]:
            return None
        return repo, match["path"], repo["files"][match["path"]]

    def _headers(self, repo: dict[str, Any], data: bytes) -> None:
        self.send_header("X-Repo-Commit", repo["commit"])
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")

    def do_HEAD(self) -> None:  # noqa: N802
        self._record()
        found = self._file()
        if found is None:
            return self._missing()
        repo, _, data = found
        self.send_response(200)
        self._headers(repo, data)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        found = self._file()
        if found is None:
            return self._missing()
        repo, path, data = found
        state = self.state
        with state.lock:  # a cut comes first; the refusals answer the downloads after it
            cut = state.break_after.pop(path, None)
            refuse = state.refuse.get(path, 0) if cut is None else 0
            if refuse:
                state.refuse[path] = refuse - 1
        if refuse:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        if match := re.match(r"bytes=(\d+)-$", self.headers.get("Range", "")):
            start = int(match[1])
        part = data[start:]
        self.send_response(206 if start else 200)
        self._headers(repo, data)
        self.send_header("Content-Length", str(len(part)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if cut is not None:
            self.wfile.write(part[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(part)


class HubServer:
    """The stand-in, serving on 127.0.0.1 in a thread; `url` is its endpoint (use as HF_ENDPOINT)."""

    def __init__(self) -> None:
        self.state = HubState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        # A client that hangs up mid-answer (a cut pull, a refused oversized file) is expected here, not printed.
        self.server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
