"""Evidence (A): an open-vocabulary description of an image by a multimodal LLM.

Talks to any OpenAI-compatible `/chat/completions` endpoint. The model answers in two formats:
closed-world (pick one of the candidate ID classes shown, or NONE) and open-world (name the main
object freely), plus a one-sentence description. Answers that parse are cached on disk per image and
prompt, so reruns never pay twice (an unparseable reply is never cached: a rerun asks again); transient failures (timeouts, 429, 5xx) are retried with backoff. The HTTP
exchange itself is the core LLM client's (`oodbench.text.llm.post_chat_completion`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import AnnotateError
from ..text.llm import ChatAttemptError, json_depth_ok, post_chat_completion
from ..util.atomic import atomic_write_text, read_file_bytes, read_regular
from .protocol import label_match_key

PROMPT_VERSION = "closed-open-v1"
_MIME = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp", ".gif": "image/gif"}

SYSTEM_PROMPT = (
    "You help verify out-of-distribution images for an image-classification benchmark. "
    "Look at the image and answer only with one JSON object."
)
USER_PROMPT = """Candidate classes of the in-distribution label set:
{candidates}

Answer with a JSON object with exactly these keys:
"description": one sentence describing what the image shows;
"closed_world": the single candidate class above that best names the main object, copied exactly,
or "NONE" if no candidate fits;
"open_world": a short noun phrase naming the main object in your own words, not restricted to the candidates."""


@dataclass(frozen=True)
class LLMConfig:
    """Where and how to reach the chat endpoint."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 1.0
    max_tokens: int = 300

    @classmethod
    def resolve(
        cls, base_url: str | None = None, model: str | None = None, api_key: str | None = None, **options: Any
    ) -> LLMConfig:
        """Settings from the arguments, else OODBENCH_LLM_BASE_URL/_MODEL/_API_KEY, else OPENAI_BASE_URL/_API_KEY."""
        env = os.environ
        base_url = base_url or env.get("OODBENCH_LLM_BASE_URL") or env.get("OPENAI_BASE_URL")
        model = model or env.get("OODBENCH_LLM_MODEL")
        api_key = api_key or env.get("OODBENCH_LLM_API_KEY") or env.get("OPENAI_API_KEY")
        if not base_url:
            raise AnnotateError(
                "no LLM endpoint: set llm.base_url in project.json, --llm-base-url or OODBENCH_LLM_BASE_URL"
            )
        if not model:
            raise AnnotateError("no LLM model: set llm.model in project.json, --llm-model or OODBENCH_LLM_MODEL")
        if not base_url.startswith(("http://", "https://")):
            raise AnnotateError(f"LLM base URL must be http(s), got {base_url!r}")
        return cls(base_url=base_url.rstrip("/"), model=model, api_key=api_key, **options)


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a reply (models often wrap it in prose or code fences); None for absurd nesting."""
    if not json_depth_ok(text):
        return None  # deeper than any answer needs: json.loads would exhaust the stack (RecursionError)
    decoder = json.JSONDecoder()  # raw_decode reads one value and knows about braces inside strings
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def parse_answer(text: str, candidates: Sequence[str]) -> dict[str, Any]:
    """Structured closed-/open-world answer from the model's reply text."""
    data = _json_object(text)
    if data is None:
        return {"description": text.strip(), "closed_world": None, "open_world": None, "parse_error": True}
    closed = str(data.get("closed_world") or "").strip()
    by_norm = {label_match_key(c): c for c in candidates}
    closed_match = by_norm.get(label_match_key(closed)) if closed else None
    return {
        "description": str(data.get("description") or "").strip(),
        # None: the model said no candidate fits; a name outside the list is kept but marked.
        "closed_world": None if label_match_key(closed) in {"none", ""} else (closed_match or closed),
        "closed_world_in_list": closed_match is not None,
        "open_world": str(data.get("open_world") or "").strip() or None,
        "parse_error": False,
    }


class LLMDescriber:
    """Describes images through a chat endpoint, with an on-disk cache per image and prompt."""

    def __init__(self, config: LLMConfig, cache_dir: str | Path) -> None:
        self.config = config
        self.cache_dir = Path(cache_dir)

    def _cache_path(self, image_digest: str, candidates: Sequence[str]) -> Path:
        setting = json.dumps([PROMPT_VERSION, self.config.model, list(candidates)]).encode()
        return self.cache_dir / f"{image_digest[:24]}-{hashlib.sha256(setting).hexdigest()[:16]}.json"

    def cached(self, cache: Path) -> dict[str, Any] | None:
        """A usable cached answer, or None (absent, damaged, or an unparseable reply an older version kept)."""
        try:
            answer = json.loads(read_regular(cache, 2**24).decode("utf-8"))  # no link or FIFO in the cache
        except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return None
        return answer if isinstance(answer, dict) and answer.get("parse_error") is False else None

    def describe(self, image_path: str | Path, candidates: Sequence[str], *, refresh: bool = False) -> dict[str, Any]:
        """The model's answer for one image: from the cache when it holds one, unless `refresh` asks again.

        Only an answer that parsed is cached: an unparseable reply is returned (marked `parse_error`) but
        asked again next time, as the core LLM client does.
        """
        image_path = Path(image_path)
        try:
            data = read_file_bytes(image_path, 512 * 2**20)  # a regular file, read once (a FIFO would block)
        except ValueError as exc:
            raise AnnotateError(f"cannot read image {image_path}: {exc}") from None
        cache = self._cache_path(hashlib.sha256(data).hexdigest(), candidates)
        if not refresh and (hit := self.cached(cache)) is not None:
            return hit
        mime = _MIME.get(image_path.suffix.lower(), "image/jpeg")
        reply = self._complete(self._messages(data, mime, candidates))
        answer = {
            **parse_answer(reply, candidates),
            "model": self.config.model,
            "prompt": PROMPT_VERSION,
            "candidates": list(candidates),
            "raw": reply,
        }
        if not answer["parse_error"]:
            atomic_write_text(cache, json.dumps(answer))
        return answer

    @staticmethod
    def _messages(image: bytes, mime: str, candidates: Sequence[str]) -> list[dict[str, Any]]:
        listing = "\n".join(f"- {c}" for c in candidates) or "- (none given)"
        url = f"data:{mime};base64,{base64.b64encode(image).decode('ascii')}"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": USER_PROMPT.format(candidates=listing)},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            },
        ]

    def _complete(self, messages: list[dict[str, Any]]) -> str:
        cfg = self.config
        body = {"model": cfg.model, "messages": messages, "temperature": 0, "max_tokens": cfg.max_tokens}
        url = f"{cfg.base_url}/chat/completions"
        problem = ""
        for attempt in range(cfg.max_retries + 1):
            wait = cfg.backoff * 2**attempt
            try:
                return post_chat_completion(cfg.base_url, body, api_key=cfg.api_key, timeout_s=cfg.timeout)[0]
            except ChatAttemptError as exc:
                if exc.kind == "malformed":
                    raise AnnotateError(f"LLM endpoint {url} returned an unexpected body: {exc.detail}") from None
                problem = exc.problem
                if not exc.retryable:
                    break
                if exc.retry_after is not None:  # lengthens the backoff, never shortens it ("Retry-After: 0")
                    wait = max(wait, min(exc.retry_after, 30.0))
            if attempt < cfg.max_retries:
                time.sleep(wait)
        raise AnnotateError(f"LLM endpoint {url} failed after {attempt + 1} attempt(s): {problem}")
