"""The OpenAI-compatible chat client of oodbench (vocabularies, EOE lists, the annotation app's image evidence).

- **Cache.** A reply is cached on disk, one JSON file per request key (model, messages, sampling settings,
  generation index, endpoint), written atomically, but only once the caller accepted it (`accept`): a reply that
  failed to parse is never cached, so a rerun asks again instead of replaying it. A rerun answers every accepted
  request from the cache and sends only what is missing. The API key is never written to the cache.
- **Retries.** Transient failures (timeouts, connection errors, HTTP 408/409/425/429/5xx, bodies that are not a
  chat completion) are retried up to `max_retries` times with exponential backoff and jitter; a ``Retry-After``
  header lengthens the wait (the larger of the two is taken), never shortens it. Other HTTP errors fail at once.
- **Time and size.** `timeout_s` bounds the whole request (connect, send, headers and body together), not each
  socket read, so a server trickling bytes cannot hold a worker forever; replies larger than `max_reply_bytes` and
  JSON nested deeper than `MAX_JSON_DEPTH` are refused as malformed.
- **Redirects are refused**, never followed: a redirect would re-send the API key to another origin. An
  ``http_proxy``/``https_proxy`` from the environment is used (``no_proxy`` honoured); an http:// endpoint
  behind an http proxy hands the proxy the request, API key included (https goes through a CONNECT tunnel).
- **Cancellation.** With several workers, the first fatal error (or Ctrl-C) stops the remaining work: queued
  requests are dropped and running ones give up before their next attempt; the error says how many replies were
  received (and cached) before the stop.
- A shared rate limiter spaces requests (requests per minute) across worker threads.
- **Settings, in order of precedence:** arguments (command-line options), then the JSON/TOML config file, then the
  environment: ``OODBENCH_LLM_BASE_URL`` (or ``OPENAI_BASE_URL``), ``OODBENCH_LLM_MODEL``,
  ``OODBENCH_LLM_API_KEY`` (or ``OPENAI_API_KEY``).

Only the Python standard library is used (http.client), so any server speaking ``POST {base_url}/chat/completions``
works: OpenAI, vLLM, llama.cpp's server, Ollama's ``/v1``, LM Studio, etc.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import http.client
import json
import os
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..core.errors import OodbenchError
from ..util.atomic import atomic_write_json, read_regular
from ..util.schema import Int, Record, Str, validate

__all__ = [
    "LLMConfig",
    "LLMError",
    "LLMInterrupted",
    "ChatClient",
    "RateLimiter",
    "Messages",
    "ChatAttemptError",
    "post_chat_completion",
    "json_depth_ok",
    "MAX_JSON_DEPTH",
]

Messages = list[dict[str, str]]
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
CACHE_FORMAT = 1
# A cache file as read back: the reply text under the request key it was asked with (other fields descriptive).
_CACHE_RECORD = Record(
    {"format": Int(CACHE_FORMAT, CACHE_FORMAT), "key": Str("[0-9a-f]{64}"), "content": str}, open=True
)
_CACHE_LIMIT = 64 * 2**20
# Deeper JSON than any chat completion or name list needs; deeper input would only exhaust the parser's stack.
MAX_JSON_DEPTH = 64
DEFAULT_MAX_REPLY_BYTES = 4 * 2**20


class LLMError(OodbenchError):
    """The chat endpoint could not give a usable answer (after retries where retrying makes sense)."""


class LLMInterrupted(LLMError):
    """The user interrupted (Ctrl-C) a batch of requests; what was received is cached."""

    exit_code = 130  # the CLI exits as an interrupted program does


@dataclass(frozen=True)
class LLMConfig:
    """Endpoint, model and request policy of a chat client."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    temperature: float = 1.0
    max_tokens: int = 2048
    seed: int | None = None
    timeout_s: float = 120.0
    max_retries: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    requests_per_minute: float | None = None
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES

    def __post_init__(self) -> None:
        if not str(self.base_url).startswith(("http://", "https://")):
            raise LLMError(f"LLM base URL must start with http:// or https://; got {self.base_url!r}")
        if not self.model:
            raise LLMError("no LLM model name given")
        if (
            self.timeout_s <= 0
            or self.max_retries < 0
            or self.backoff_s < 0
            or self.max_tokens <= 0
            or self.max_reply_bytes <= 0
        ):
            raise LLMError(
                "timeout_s, max_tokens and max_reply_bytes must be positive, max_retries and backoff_s non-negative"
            )
        if self.requests_per_minute is not None and self.requests_per_minute <= 0:
            raise LLMError(f"requests_per_minute must be positive; got {self.requests_per_minute}")
        object.__setattr__(self, "base_url", str(self.base_url).rstrip("/"))

    @classmethod
    def resolve(
        cls,
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        config_file: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> LLMConfig:
        """Settings from arguments, else the config file (JSON or TOML), else the environment (in that precedence)."""
        settings: dict[str, Any] = {}
        if config_file is not None:
            settings.update(_read_config(Path(config_file)))
        env = os.environ
        given = {"base_url": base_url, "model": model, "api_key": api_key, **options}
        settings.update({k: v for k, v in given.items() if v is not None})
        settings.setdefault("base_url", env.get("OODBENCH_LLM_BASE_URL") or env.get("OPENAI_BASE_URL"))
        settings.setdefault("model", env.get("OODBENCH_LLM_MODEL"))
        settings.setdefault("api_key", env.get("OODBENCH_LLM_API_KEY") or env.get("OPENAI_API_KEY"))
        if not settings.get("base_url"):
            raise LLMError(
                "no LLM endpoint: pass --llm-base-url, set base_url in the LLM config file, "
                "or set OODBENCH_LLM_BASE_URL (e.g. http://127.0.0.1:8000/v1 for a local server)"
            )
        if not settings.get("model"):
            raise LLMError(
                "no LLM model: pass --llm-model, set model in the LLM config file, or set OODBENCH_LLM_MODEL"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise LLMError(f"unknown LLM setting(s) {unknown}; known: {', '.join(sorted(known))}")
        return cls(**settings)

    def public(self) -> dict[str, Any]:
        """Settings without the API key (for provenance)."""
        return {k: v for k, v in asdict(self).items() if k != "api_key"}


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LLMError(f"LLM config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (ValueError, json.JSONDecodeError) as exc:
        raise LLMError(f"cannot parse LLM config {path}: {exc}") from None
    except RecursionError:
        raise LLMError(f"cannot parse LLM config {path}: nested too deeply") from None
    # Accept either a flat file or an [llm] / {"llm": {...}} section.
    data = data.get("llm", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise LLMError(f"LLM config {path} must hold a table/object of settings")
    return dict(data)


class RateLimiter:
    """Spaces calls at least 60 / requests_per_minute seconds apart, across threads."""

    def __init__(
        self,
        requests_per_minute: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.interval = 0.0 if not requests_per_minute else 60.0 / float(requests_per_minute)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._next = -float("inf")

    def acquire(self) -> float:
        """Wait for the next free slot; returns the time waited."""
        if self.interval <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        wait = start - now
        if wait > 0:
            self._sleep(wait)
        return wait


class ChatAttemptError(Exception):
    """One failed POST to a chat endpoint: what went wrong (`kind`: http, timeout, connection, malformed), in words."""

    def __init__(
        self, kind: str, problem: str, *, status: int | None = None, detail: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(problem)
        self.kind, self.problem, self.status, self.detail, self.retry_after = kind, problem, status, detail, retry_after

    @property
    def retryable(self) -> bool:
        """Whether asking again may help: anything but an HTTP status outside RETRY_STATUS (redirects included)."""
        return self.kind != "http" or self.status in RETRY_STATUS


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


_TAG = re.compile(r"<[^>]*>")


def _one_line(text: str, limit: int = 200) -> str:
    """A server's error body as one short line: markup removed, whitespace folded, cut at `limit` characters."""
    folded = " ".join(_TAG.sub(" ", text).split())
    return folded if len(folded) <= limit else folded[: limit - 1] + "…"


def json_depth_ok(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether brackets and braces outside JSON strings nest at most `limit` deep (one linear scan)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth = max(0, depth - 1)
    return True


def _content(body: bytes) -> tuple[str, dict[str, Any]]:
    """The assistant text of a chat-completion body; a `malformed` ChatAttemptError when the body is not one."""
    snippet = _one_line(body[:300].decode("utf-8", "replace"))
    if not json_depth_ok(body):
        raise ChatAttemptError("malformed", f"reply nested deeper than {MAX_JSON_DEPTH} levels: {snippet!r}")
    try:
        payload = json.loads(body.decode("utf-8"))
        content = payload["choices"][0]["message"]["content"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise ChatAttemptError(
            "malformed", f"malformed chat completion ({type(exc).__name__}): {snippet!r}", detail=snippet
        ) from None
    if not isinstance(content, str):
        raise ChatAttemptError(
            "malformed", f"chat completion content is not text: {_one_line(str(content))!r}", detail=snippet
        )
    return content, payload


def _connection(url: urllib.parse.SplitResult, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """(connection, request target) for `url`, through the environment's proxy unless no_proxy exempts the host."""
    secure = url.scheme == "https"
    host, port = url.hostname or "", url.port or (443 if secure else 80)
    path = url.path + (f"?{url.query}" if url.query else "")
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        proxy_host, proxy_port = via.hostname or "", via.port or 8080
        if secure:  # a CONNECT tunnel: the proxy sees the host name, not the request or the key
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                proxy_host, proxy_port, timeout=timeout_s, context=ssl.create_default_context()
            )
            conn.set_tunnel(host, port)
            return conn, path
        return http.client.HTTPConnection(proxy_host, proxy_port, timeout=timeout_s), url.geturl()
    if secure:
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=ssl.create_default_context()), path
    return http.client.HTTPConnection(host, port, timeout=timeout_s), path


def post_chat_completion(
    base_url: str,
    body: Mapping[str, Any],
    *,
    api_key: str | None,
    timeout_s: float,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> tuple[str, dict[str, Any]]:
    """One POST to `{base_url}/chat/completions`: the reply text and the whole response; ChatAttemptError on failure.

    `timeout_s` bounds the whole exchange: a watchdog shuts the socket down when it runs out. Redirects are refused.
    """
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    url = urllib.parse.urlsplit(f"{base_url}/chat/completions")
    conn, target = _connection(url, timeout_s)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout_s, expire)
    watchdog.daemon = True
    watchdog.start()
    chunks: list[bytes] = []
    try:
        conn.request("POST", target, body=json.dumps(body).encode("utf-8"), headers=headers)
        response = conn.getresponse()
        status, location = response.status, response.getheader("Location")
        retry_after = _retry_after(response.getheader("Retry-After"))
        if 300 <= status < 400:
            detail = f"redirect to {location or '(no Location)'} refused: the client never follows redirects"
            raise ChatAttemptError("http", f"HTTP {status}: {detail}", status=status, detail=detail)
        size = 0
        while chunk := response.read1(65536):
            size += len(chunk)
            if size > max_reply_bytes:
                raise ChatAttemptError("malformed", f"reply larger than {max_reply_bytes} bytes (max_reply_bytes)")
            chunks.append(chunk)
    except ChatAttemptError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise ChatAttemptError("timeout", f"no answer within {timeout_s:g} s (the whole request)") from None
        raise ChatAttemptError(
            "connection", f"connection failed ({type(exc).__name__}: {_one_line(str(exc))})"
        ) from None
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():  # the socket was shut down mid-body: what arrived is cut short
        raise ChatAttemptError("timeout", f"no answer within {timeout_s:g} s (the whole request)")
    data = b"".join(chunks)
    if status >= 400:
        detail = _one_line(data.decode("utf-8", "replace"))
        raise ChatAttemptError(
            "http", f"HTTP {status}: {detail}", status=status, detail=detail, retry_after=retry_after
        )
    return _content(data)


class ChatClient:
    """Chat completions with an on-disk cache, retries with backoff, rate limiting and a worker pool."""

    def __init__(
        self,
        config: LLMConfig,
        cache_dir: str | os.PathLike[str],
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        jitter_seed: int = 0,
    ) -> None:
        self.config = config
        self.cache_dir = Path(cache_dir)
        self._sleep = sleep
        self._limiter = RateLimiter(config.requests_per_minute, clock=clock, sleep=sleep)
        self._random = random.Random(jitter_seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()  # set when a batch is being cancelled
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0}

    # ----------------------------------------------------------------- cache
    def request_body(self, messages: Messages, generation: int = 0) -> dict[str, Any]:
        """The JSON body sent for (messages, generation)."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": list(messages),
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if self.config.seed is not None:
            # Distinct generations get distinct seeds so servers that honour seeds still sample anew.
            body["seed"] = int(self.config.seed) + int(generation)
        return body

    def request_key(self, messages: Messages, generation: int = 0) -> str:
        """Cache key of one request: endpoint, body and generation index (never the API key)."""
        payload = {
            "url": self.config.base_url,
            "body": self.request_body(messages, generation),
            "generation": int(generation),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def cached(self, messages: Messages, generation: int = 0) -> str | None:
        """The cached reply text, or None."""
        key = self.request_key(messages, generation)
        path = self._cache_path(key)
        if not os.path.lexists(path):
            return None
        try:  # a regular file (no link or FIFO), of the cache's form, for this very request
            record = validate(_CACHE_RECORD, json.loads(read_regular(path, _CACHE_LIMIT).decode("utf-8")))
        except (OSError, ValueError, RecursionError):  # SchemaError and JSONDecodeError are ValueErrors
            return None  # a damaged cache entry is simply asked again
        return record["content"] if record["key"] == key else None

    # ----------------------------------------------------------------- requests
    def complete(self, messages: Messages, *, generation: int = 0, accept: Callable[[str], bool] | None = None) -> str:
        """The assistant's reply to `messages` (`generation` distinguishes repeated samples).

        The reply is cached only when `accept` (if given) accepts it; a cached reply it rejects is asked again.
        """
        hit = self.cached(messages, generation)
        if hit is not None and (accept is None or accept(hit)):
            with self._lock:
                self.stats["cache_hits"] += 1
            return hit
        body = self.request_body(messages, generation)
        content, payload = self._post_with_retries(body)
        if accept is not None and not accept(content):
            return content  # unusable: never cached, so a rerun asks again
        key = self.request_key(messages, generation)
        atomic_write_json(
            self._cache_path(key),
            {
                "format": CACHE_FORMAT,
                "key": key,
                "url": self.config.base_url,
                "generation": int(generation),
                "request": body,
                "content": content,
                "response": payload,
                "received": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            },
        )
        return content

    def complete_many(
        self,
        requests: Sequence[tuple[Messages, int]],
        *,
        workers: int = 4,
        on_done: Callable[[int], None] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> list[str]:
        """Replies to many (messages, generation) requests, in order, using up to `workers` threads.

        The first fatal error, or Ctrl-C, stops the rest (queued requests are dropped, running ones stop before
        their next attempt) and raises an LLMError (LLMInterrupted for Ctrl-C) saying how many replies arrived.
        """
        if workers < 1:
            raise LLMError(f"workers must be >= 1; got {workers}")
        results: list[str | None] = [None] * len(requests)
        self._stop.clear()

        def run(index: int) -> None:
            if self._stop.is_set():
                return
            messages, generation = requests[index]
            try:
                results[index] = self.complete(messages, generation=generation, accept=accept)
            except BaseException:
                self._stop.set()  # the other workers give up before their next attempt
                raise
            if on_done is not None:
                on_done(index)

        pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 and len(requests) > 1 else None
        try:
            if pool is None:
                for index in range(len(requests)):
                    run(index)
            else:
                futures = [pool.submit(run, i) for i in range(len(requests))]
                for future in futures:
                    future.result()
        except BaseException as exc:
            self._stop.set()
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            received = sum(r is not None for r in results)
            saved = f"{received} of {len(requests)} replies were received (and cached) before the stop"
            if isinstance(exc, KeyboardInterrupt):
                raise LLMInterrupted(f"interrupted: {saved}; a rerun sends only the rest") from None
            if isinstance(exc, LLMError):
                raise LLMError(f"{exc}; stopped the remaining requests: {saved}") from None
            raise
        if pool is not None:
            pool.shutdown(wait=True)
        return [r if r is not None else "" for r in results]

    def _wait(self, seconds: float) -> None:
        """Back off for `seconds`, cut short when the batch is being stopped (with the real clock)."""
        if self._sleep is time.sleep:
            self._stop.wait(seconds)
        else:
            self._sleep(seconds)

    def _post_with_retries(self, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        attempts = self.config.max_retries + 1
        last: ChatAttemptError | None = None
        url = f"{self.config.base_url}/chat/completions"
        for attempt in range(attempts):
            if attempt:
                delay = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (attempt - 1))
                with self._lock:
                    delay *= 1.0 + 0.25 * self._random.random()
                    self.stats["retries"] += 1
                if last is not None and last.retry_after is not None:
                    # Retry-After lengthens the wait, never shortens it (a "0" must not turn off the backoff).
                    delay = max(delay, min(last.retry_after, self.config.backoff_max_s))
                self._wait(delay)
            if self._stop.is_set():
                raise LLMError(f"{url}: stopped after another request failed")
            self._limiter.acquire()
            with self._lock:
                self.stats["requests"] += 1
            try:
                return post_chat_completion(
                    self.config.base_url,
                    body,
                    api_key=self.config.api_key,
                    timeout_s=self.config.timeout_s,
                    max_reply_bytes=self.config.max_reply_bytes,
                )
            except ChatAttemptError as exc:
                if not exc.retryable:
                    hint = (
                        " (check the API key)"
                        if exc.status in (401, 403)
                        else " (check --llm-model)"
                        if exc.status == 404
                        else ""
                    )
                    raise LLMError(f"{url} answered HTTP {exc.status}{hint}: {exc.detail}") from None
                last = exc
        raise LLMError(f"{url} failed {attempts} time(s); last error: {last}")
