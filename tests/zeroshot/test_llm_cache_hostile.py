"""The LLM reply cache: an unparsable reply never enters it, and a cache file that is damaged, of another request,
not text, a link or a FIFO is never replayed (the request is asked again)."""

from __future__ import annotations

import json
import os

import pytest

from oodbench.text.llm import ChatClient, LLMConfig

from ..fakes.openai_server import FakeOpenAIServer, chat_body

pytestmark = pytest.mark.hostile

MESSAGES = [{"role": "user", "content": "list three animals"}]
GOOD = '["otter", "heron", "newt"]'


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def _client(server, cache) -> ChatClient:
    config = LLMConfig(server.url, "fake-model", api_key="sk-test", timeout_s=5, max_retries=1, backoff_s=0.01)
    return ChatClient(config, cache)


def _parses(reply: str) -> bool:
    try:
        return isinstance(json.loads(reply), list)
    except (ValueError, RecursionError):
        return False


@pytest.mark.parametrize(
    "reply", ["I cannot list animals.", "", '{"not": "a list"}', "[unclosed", "[" * 5000, "\x00\x01"]
)
def test_an_unparsable_reply_never_enters_the_cache(tmp_path, reply):
    with FakeOpenAIServer(lambda prompt, seen: (200, chat_body(reply if seen == 0 else GOOD), {}, 0.0)) as server:
        client = _client(server, tmp_path / "cache")
        assert client.complete(MESSAGES, accept=_parses) == reply
        assert not list((tmp_path / "cache").rglob("*.json"))
        assert client.cached(MESSAGES) is None
        assert _client(server, tmp_path / "cache").complete(MESSAGES, accept=_parses) == GOOD  # asked again
        assert len(server.prompts) == 2


def _damage(path, kind, tmp_path):
    record = json.loads(path.read_text())
    if kind == "content a dict":
        record["content"] = {"evil": 1}
    elif kind == "content a number":
        record["content"] = 5
    elif kind == "content missing":
        del record["content"]
    elif kind == "another request's key":
        record["key"] = "0" * 64
    elif kind == "format unknown":
        record["format"] = 99
    elif kind == "not an object":
        record = [record]
    if kind in ("link to a valid copy", "fifo", "not UTF-8", "nested deeply"):
        path.unlink()
        if kind == "link to a valid copy":
            copy = tmp_path / "copy.json"
            copy.write_text(json.dumps(record))
            path.symlink_to(copy)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "not UTF-8":
            path.write_bytes(b"\xff\xfe" + json.dumps(record).encode())
        else:
            path.write_text("[" * 100_000 + "]" * 100_000)
        return
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "kind",
    [
        "content a dict",
        "content a number",
        "content missing",
        "another request's key",
        "format unknown",
        "not an object",
        "link to a valid copy",
        "fifo",
        "not UTF-8",
        "nested deeply",
    ],
)
def test_a_damaged_or_planted_cache_file_is_asked_again(tmp_path, kind):
    with FakeOpenAIServer(lambda prompt, seen: (200, chat_body(GOOD), {}, 0.0)) as server:
        client = _client(server, tmp_path / "cache")
        assert client.complete(MESSAGES) == GOOD
        (path,) = list((tmp_path / "cache").rglob("*.json"))
        _damage(path, kind, tmp_path)
        assert client.cached(MESSAGES) is None
