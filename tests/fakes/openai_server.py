"""The tests' one fake OpenAI server: a loopback ``/v1/chat/completions`` endpoint whose replies a test scripts.

Real HTTP on 127.0.0.1, so the clients under test (`oodbench.text.llm`, `oodbench.annotate.llm`) run unchanged:
status codes, headers such as ``Retry-After``, slow replies and malformed bodies all cross the socket.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from time import sleep as _sleep  # bound now: a test that records `time.sleep` must not see the server's delays
from typing import Any

__all__ = ["FakeOpenAIServer", "Reply", "chat_body"]

PATH = "/v1/chat/completions"

# reply(prompt, seen) -> (status, body bytes, headers, delay in seconds); `prompt` is the last message's content and
# `seen` how many times that same prompt was received before.
Reply = Callable[[Any, int], tuple[int, bytes, dict[str, str], float]]


def chat_body(content: str) -> bytes:
    """A chat.completion response body whose one choice says `content`."""
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        }
    ).encode()


class FakeOpenAIServer:
    """An OpenAI-compatible endpoint on loopback; every request is recorded in `requests` (path, auth, headers, body)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.script: list[tuple[Any, ...]] = []  # the steps of a `scripted` server not yet answered
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                with lock:
                    seen = sum(r["body"]["messages"][-1]["content"] == prompt for r in outer.requests)
                    outer.requests.append(
                        {
                            "path": self.path,
                            "auth": self.headers.get("Authorization"),
                            "headers": dict(self.headers),
                            "body": body,
                        }
                    )
                if self.path == PATH:
                    status, payload, headers, delay = outer.reply(prompt, seen)
                else:  # a client that builds the wrong URL fails on a 404, as against a real endpoint
                    status, payload, headers, delay = 404, b'{"error": "no such route"}', {}, 0.0
                if delay:
                    _sleep(delay)
                try:
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (timeout tests)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A short poll interval: `close()` waits for the serving loop's next poll (0.5 s by default, per test).
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @classmethod
    def scripted(cls, steps: Iterable[Sequence[Any]]) -> FakeOpenAIServer:
        """Replies from `script`, ``(status, text, delay[, headers])`` steps, one per request; then 200 with "{}".

        A test may append steps to ``server.script`` while the server runs.
        """
        lock = threading.Lock()

        def reply(prompt: Any, seen: int) -> tuple[int, bytes, dict[str, str], float]:
            with lock:
                step = server.script.pop(0) if server.script else (200, "{}", 0.0)
            status, text, delay, *rest = step
            return status, chat_body(text), dict(rest[0]) if rest else {}, delay

        server = cls(reply)
        server.script = [tuple(step) for step in steps]
        return server

    @property
    def prompts(self) -> list[Any]:
        """The last message's content of every request, in order."""
        return [r["body"]["messages"][-1]["content"] for r in self.requests]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON body of every request, in order."""
        return [r["body"] for r in self.requests]

    @property
    def headers(self) -> list[dict[str, str]]:
        """The HTTP headers of every request, in order."""
        return [r["headers"] for r in self.requests]

    def start(self) -> FakeOpenAIServer:
        """Serve on a daemon thread."""
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
