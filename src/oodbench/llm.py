"""A small client for OpenAI-compatible chat endpoints, built for long, resumable vocabulary generation runs.

- Every successful response is cached on disk, one JSON file per request key (model, messages, sampling settings,
  generation index, endpoint), written atomically; a rerun answers from the cache and sends only what is missing.
- Transient failures (timeouts, connection errors, HTTP 408/409/425/429/5xx, bodies that are not a chat completion)
  are retried with exponential backoff and jitter, honouring ``Retry-After``; other HTTP errors fail at once.
- A shared rate limiter spaces requests (requests per minute) across worker threads.
- Settings come from arguments, a JSON/TOML config file, or the environment: ``OODBENCH_LLM_BASE_URL`` (or
  ``OPENAI_BASE_URL``), ``OODBENCH_LLM_MODEL``, ``OODBENCH_LLM_API_KEY`` (or ``OPENAI_API_KEY``). The key is never
  written to the cache.

Only the Python standard library is used (urllib), so any server speaking ``POST {base_url}/chat/completions``
works: OpenAI, vLLM, llama.cpp's server, Ollama's ``/v1``, LM Studio, etc.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json
from .errors import OodbenchError

__all__ = ["LLMConfig", "LLMError", "ChatClient", "RateLimiter", "Messages", "ChatAttemptError", "post_chat_completion"]

Messages = list[dict[str, str]]
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
CACHE_FORMAT = 1


class LLMError(OodbenchError):
    """The chat endpoint could not give a usable answer (after retries where retrying makes sense)."""


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

    def __post_init__(self) -> None:
        if not str(self.base_url).startswith(("http://", "https://")):
            raise LLMError(f"LLM base URL must start with http:// or https://; got {self.base_url!r}")
        if not self.model:
            raise LLMError("no LLM model name given")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.max_tokens <= 0:
            raise LLMError("timeout_s and max_tokens must be positive, max_retries and backoff_s non-negative")
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
        """Settings from arguments, then the config file (JSON or TOML), then the environment."""
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
        """Whether asking again may help: anything but an HTTP status outside RETRY_STATUS."""
        return self.kind != "http" or self.status in RETRY_STATUS


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _content(body: bytes) -> tuple[str, dict[str, Any]]:
    """The assistant text of a chat-completion body; a `malformed` ChatAttemptError when the body is not one."""
    try:
        payload = json.loads(body.decode("utf-8"))
        content = payload["choices"][0]["message"]["content"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise ChatAttemptError(
            "malformed",
            f"malformed chat completion ({type(exc).__name__}): {body[:200]!r}",
            detail=body[:200].decode("utf-8", "replace"),
        ) from None
    if not isinstance(content, str):
        raise ChatAttemptError(
            "malformed",
            f"chat completion content is not text: {str(content)[:200]!r}",
            detail=body[:200].decode("utf-8", "replace"),
        )
    return content, payload


def post_chat_completion(
    base_url: str, body: Mapping[str, Any], *, api_key: str | None, timeout_s: float
) -> tuple[str, dict[str, Any]]:
    """One POST to `{base_url}/chat/completions`: the reply text and the whole response; ChatAttemptError on failure."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace") if exc.fp is not None else ""
        raise ChatAttemptError(
            "http",
            f"HTTP {exc.code}: {detail}",
            status=exc.code,
            detail=detail,
            retry_after=_retry_after(exc.headers.get("Retry-After")),
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise ChatAttemptError("timeout", f"no answer within {timeout_s:g} s") from None
        raise ChatAttemptError("connection", f"connection failed ({type(exc).__name__}: {reason})") from None
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
        path = self._cache_path(self.request_key(messages, generation))
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return str(record["content"])
        except (OSError, json.JSONDecodeError, KeyError):
            return None  # a damaged cache entry is simply asked again

    # ----------------------------------------------------------------- requests
    def complete(self, messages: Messages, *, generation: int = 0) -> str:
        """The assistant's reply to `messages` (cached; `generation` distinguishes repeated samples)."""
        hit = self.cached(messages, generation)
        if hit is not None:
            with self._lock:
                self.stats["cache_hits"] += 1
            return hit
        body = self.request_body(messages, generation)
        content, payload = self._post_with_retries(body)
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
    ) -> list[str]:
        """Replies to many (messages, generation) requests, in order, using up to `workers` threads."""
        if workers < 1:
            raise LLMError(f"workers must be >= 1; got {workers}")
        results: list[str | None] = [None] * len(requests)

        def run(index: int) -> None:
            messages, generation = requests[index]
            results[index] = self.complete(messages, generation=generation)
            if on_done is not None:
                on_done(index)

        if workers == 1 or len(requests) <= 1:
            for index in range(len(requests)):
                run(index)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for future in [pool.submit(run, i) for i in range(len(requests))]:
                    future.result()
        return [r if r is not None else "" for r in results]

    def _post_with_retries(self, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        attempts = self.config.max_retries + 1
        last: ChatAttemptError | None = None
        for attempt in range(attempts):
            if attempt:
                delay = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (attempt - 1))
                with self._lock:
                    delay *= 1.0 + 0.25 * self._random.random()
                    self.stats["retries"] += 1
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(last.retry_after, self.config.backoff_max_s))
                self._sleep(delay)
            self._limiter.acquire()
            with self._lock:
                self.stats["requests"] += 1
            try:
                return post_chat_completion(
                    self.config.base_url, body, api_key=self.config.api_key, timeout_s=self.config.timeout_s
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
                    raise LLMError(
                        f"{self.config.base_url}/chat/completions answered HTTP {exc.status}{hint}: {exc.detail}"
                    ) from None
                last = exc
        raise LLMError(f"{self.config.base_url}/chat/completions failed {attempts} time(s); last error: {last}")
