"""The LLM client and LLM-made vocabularies against a local OpenAI-compatible server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from typing import Any

import pytest

from oodbench.cli.main import OodbenchGroup
from oodbench.core.errors import ZeroShotError
from oodbench.text.classes import ClassList
from oodbench.text.llm import ChatClient, LLMConfig, LLMError, LLMInterrupted, RateLimiter
from oodbench.zeroshot.vocab.artefact import VocabStore
from oodbench.zeroshot.vocab.eoe import generate_eoe_outliers
from oodbench.zeroshot.vocab.parsing import parse_name_list
from oodbench.zeroshot.vocab.siblings import generate_siblings

from ..fakes.openai_server import FakeOpenAIServer, chat_body


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def client_for(server: FakeOpenAIServer, cache, **options: Any) -> ChatClient:
    # The timeout is a bound only a broken test reaches: a short one would turn a busy machine's slow reply into an
    # extra retry. A test of the timeout passes its own and holds the reply until the client has given up.
    settings = {"timeout_s": 60.0, "max_retries": 3, "backoff_s": 0.01, "backoff_max_s": 0.05, **options}
    return ChatClient(LLMConfig(server.url, "fake-model", api_key="sk-test", **settings), cache)


def quoted_name(prompt: str) -> str:
    return re.search(r'"([^"]+)"', prompt)[1]


def siblings_reply(prompt: str, seen: int) -> tuple[int, bytes, dict[str, str], float]:
    name = quoted_name(prompt)
    good = chat_body(
        json.dumps(
            ["Kitty", "dog", f"{name} relative 1", f"{name} relative 2", f"{name} relative 3", f"{name} relative 4"]
        )
    )
    if name == "prose" and seen == 0:
        return 200, chat_body("I am not able to list such categories, sorry."), {}, 0.0
    if name == "flaky" and seen == 0:
        return 500, b'{"error": "overloaded"}', {}, 0.0
    if name == "throttled" and seen == 0:
        return 429, b'{"error": "rate limit"}', {"Retry-After": "0"}, 0.0
    if name == "garbage" and seen == 0:
        return 200, b"<html>proxy error</html>", {"Content-Type": "text/html"}, 0.0
    return 200, good, {}, 0.0


CLASSES = ClassList(
    ("cat", "dog", "prose", "flaky", "throttled", "garbage"),
    ("n00000001", "n00000002", None, None, None, None),
    "toy",
)


def test_siblings_survive_failures_and_a_resumed_run_sends_nothing(tmp_path, toy_lexicon):
    with FakeOpenAIServer(siblings_reply) as server:
        client = client_for(server, tmp_path / "cache")
        vocab = generate_siblings(
            CLASSES, client, per_class=6, k=3, seed=1, workers=3, lexicon=toy_lexicon, min_items=3
        )
        # 6 first requests + prose re-asked + one retry each for 500, 429 and the bad body (timeouts: see below).
        assert len(server.prompts) == 10
        assert client.stats == {"requests": 10, "cache_hits": 0, "retries": 3}
        assert server.headers[0]["Authorization"] == "Bearer sk-test"
        for key, siblings in vocab.per_class.items():
            # 'Kitty' is a WordNet synonym of the ID class cat, 'dog' an ID name: both removed everywhere.
            assert sorted(siblings) == sorted(f"{key} relative {i}" for i in range(1, 5))
        assert len(vocab.labels) == 3 * len(CLASSES)
        assert vocab.provenance["classes_without_enough_names"] == []
        assert "sk-test" not in json.dumps(vocab.to_json())
        assert not any("sk-test" in p.read_text() for p in (tmp_path / "cache").rglob("*.json"))

        resumed = client_for(server, tmp_path / "cache")
        again = generate_siblings(
            CLASSES, resumed, per_class=6, k=3, seed=1, workers=2, lexicon=toy_lexicon, min_items=3
        )
        # Nothing usable is sent twice; the unparseable first reply of 'prose' was not cached, so it is asked again.
        assert len(server.prompts) == 11 and quoted_name(server.prompts[-1]) == "prose"
        assert resumed.stats["requests"] == 1 and resumed.stats["cache_hits"] == 5
        assert again.hash == vocab.hash
        third = client_for(server, tmp_path / "cache")
        generate_siblings(CLASSES, third, per_class=6, k=3, seed=1, workers=2, lexicon=toy_lexicon, min_items=3)
        assert third.stats["requests"] == 0 and len(server.prompts) == 11


def test_a_request_that_times_out_is_retried(tmp_path):
    # The first attempt is held until the test ends, so it times out however busy the machine is; later attempts
    # are answered at once (one more may time out on a very busy machine: the outcome is the same).
    release = threading.Event()

    def reply(prompt: str, seen: int):
        if seen == 0:
            release.wait()
        return 200, chat_body('["a b"]'), {}, 0.0

    with FakeOpenAIServer(reply) as server:
        try:
            client = client_for(server, tmp_path / "c", timeout_s=0.5, max_retries=5)
            assert client.complete([{"role": "user", "content": "hi"}]) == '["a b"]'
        finally:
            release.set()
        assert client.stats["retries"] >= 1 and len(server.prompts) >= 2


def test_siblings_order_is_seeded_per_class_and_generations_merge(tmp_path, toy_lexicon):
    def reply(prompt: str, seen: int):
        name = quoted_name(prompt)
        return 200, chat_body("\n".join(f"{i}. {name} sib {seen * 3 + i}" for i in range(1, 4))), {}, 0.0

    classes = ClassList(("cat", "dog"), None, "two")
    with FakeOpenAIServer(reply) as server:
        client = client_for(server, tmp_path / "cache", temperature=0.9)
        vocab = generate_siblings(
            classes, client, per_class=3, generations=2, k=2, seed=5, lexicon=toy_lexicon, min_items=1, workers=1
        )
        assert len(server.prompts) == 4
        assert sorted(vocab.per_class["cat"]) == sorted(f"cat sib {i}" for i in range(1, 7))
        other_seed = generate_siblings(
            classes, client, per_class=3, generations=2, k=2, seed=6, lexicon=toy_lexicon, min_items=1, workers=1
        )
        assert len(server.prompts) == 4  # same requests: reordering needs no LLM
        assert sorted(other_seed.per_class["cat"]) == sorted(vocab.per_class["cat"])
        assert other_seed.per_class != vocab.per_class
        assert vocab.select(k=1) == [vocab.per_class["cat"][0], vocab.per_class["dog"][0]]
        assert len(vocab.select(k=6)) == 12


def test_unrecoverable_http_errors_and_exhausted_retries(tmp_path):
    with FakeOpenAIServer(lambda prompt, seen: (401, b'{"error": "bad key"}', {}, 0.0)) as server:
        with pytest.raises(LLMError, match="HTTP 401 .check the API key"):
            client_for(server, tmp_path / "a").complete([{"role": "user", "content": "hi"}])
        assert len(server.prompts) == 1
    with FakeOpenAIServer(lambda prompt, seen: (503, b"busy", {}, 0.0)) as server:
        client = client_for(server, tmp_path / "b", max_retries=2)
        with pytest.raises(LLMError, match="failed 3 time"):
            client.complete([{"role": "user", "content": "hi"}])
        assert len(server.prompts) == 3
        assert not list((tmp_path / "b").rglob("*.json"))  # failures are never cached


def test_eoe_far_asks_again_until_enough_names_and_resumes(tmp_path, toy_lexicon):
    def reply(prompt: str, seen: int):
        if seen == 1:
            return 200, chat_body("Sorry, I cannot do that right now."), {}, 0.0
        names = [f"outlier {seen * 4 + i}" for i in range(4)] + ["cat", "kitty"]
        return 200, chat_body("Here you go:\n```json\n" + json.dumps(names) + "\n```"), {}, 0.0

    classes = ClassList(("cat", "dog"), ("n00000001", "n00000002"), "toy")
    with FakeOpenAIServer(reply) as server:
        vocab = generate_eoe_outliers(
            classes, client_for(server, tmp_path / "c"), task="far", size=10, lexicon=toy_lexicon
        )
        assert len(server.prompts) == 4  # 4 + 0 (unusable reply) + 4 + 4 names, then stop
        assert vocab.labels == [f"outlier {i}" for i in (0, 1, 2, 3, 8, 9, 10, 11, 12, 13)]
        assert vocab.kind == "eoe" and vocab.params["task"] == "far"
        assert vocab.provenance["unusable_replies"] == 1
        assert "cat; dog" in server.prompts[0]
        # The unusable reply was not cached: a rerun asks that request again (and gets names this time).
        again = generate_eoe_outliers(
            classes, client_for(server, tmp_path / "c"), task="far", size=10, lexicon=toy_lexicon
        )
        assert len(server.prompts) == 5 and again.provenance["unusable_replies"] == 0
        third = generate_eoe_outliers(
            classes, client_for(server, tmp_path / "c"), task="far", size=10, lexicon=toy_lexicon
        )
        assert len(server.prompts) == 5 and third.hash == again.hash

        near = generate_eoe_outliers(
            classes, client_for(server, tmp_path / "d"), task="near", per_class=3, lexicon=toy_lexicon, min_items=1
        )
        assert {p.split('"')[1] for p in server.prompts[5:]} == {"cat", "dog"}
        assert "cat" not in near.labels and "kitty" not in near.labels
    with pytest.raises(ZeroShotError, match="super-category"):
        generate_eoe_outliers(classes, client_for(server, tmp_path / "e"), task="fine_grained")


def test_rate_limiter_spaces_requests_with_a_fake_clock():
    now = [100.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(120, clock=lambda: now[0], sleep=sleep)  # one request per 0.5 s
    starts = []
    for _ in range(4):
        limiter.acquire()
        starts.append(now[0])
    assert starts == [100.0, 100.5, 101.0, 101.5]
    now[0] += 10.0  # idle: no waiting afterwards
    limiter.acquire()
    assert waits == [0.5, 0.5, 0.5]


def test_config_from_environment_and_files(tmp_path, monkeypatch):
    for name in (
        "OODBENCH_LLM_BASE_URL",
        "OPENAI_BASE_URL",
        "OODBENCH_LLM_MODEL",
        "OODBENCH_LLM_API_KEY",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LLMError, match="no LLM endpoint"):
        LLMConfig.resolve()
    monkeypatch.setenv("OODBENCH_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("OODBENCH_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    config = LLMConfig.resolve()
    assert (config.base_url, config.model, config.api_key) == ("http://127.0.0.1:9/v1", "env-model", "sk-env")
    assert "sk-env" not in repr(config) and "api_key" not in config.public()
    toml = tmp_path / "llm.toml"
    toml.write_text('[llm]\nmodel = "file-model"\nrequests_per_minute = 30\ntemperature = 0.2\n')
    config = LLMConfig.resolve(config_file=toml, max_retries=1)
    assert (config.model, config.requests_per_minute, config.max_retries) == ("file-model", 30, 1)
    assert LLMConfig.resolve(config_file=toml, model="arg-model").model == "arg-model"
    bad = tmp_path / "bad.json"
    bad.write_text('{"modle": "typo"}')
    with pytest.raises(LLMError, match="unknown LLM setting"):
        LLMConfig.resolve(config_file=bad)
    with pytest.raises(LLMError, match="http"):
        LLMConfig("ftp://x", "m")


@pytest.mark.parametrize(
    "reply, expected",
    [
        ('["Snow leopard", "ocelot", "Snow leopard"]', ["snow leopard", "ocelot"]),
        ('Sure!\n```json\n{"siblings": ["a b", "c"]}\n```\nEnjoy.', ["a b", "c"]),
        (
            "Here are 3:\n1. Snow leopard - a big cat\n2) **Clouded leopard**\n- Ocelot (small)\nHope it helps!",
            ["snow leopard", "clouded leopard", "ocelot"],
        ),
        ("margay, serval; caracal", ["margay", "serval", "caracal"]),
        (
            "Golden retriever\nLabrador retriever\nflat-coated retriever",
            ["golden retriever", "labrador retriever", "flat-coated retriever"],
        ),
        ("I'm sorry, I cannot provide that list.", []),
        ("", []),
        ('{"a": 1}\n- real name\n- 1999', ["real name"]),
    ],
)
def test_parse_name_list(reply, expected):
    assert parse_name_list(reply) == expected


def test_vocabulary_artefacts_are_versioned_cached_and_checked(tmp_path, toy_lexicon):
    def reply(prompt: str, seen: int):
        return 200, chat_body(json.dumps([f"{quoted_name(prompt)} x{i}" for i in range(4)])), {}, 0.0

    classes = ClassList(("cat", "dog"), None, "two")
    store = VocabStore(tmp_path / "vocab")
    with FakeOpenAIServer(reply) as server:
        client = client_for(server, tmp_path / "cache")
        first = store.save(generate_siblings(classes, client, per_class=4, k=2, lexicon=toy_lexicon))
        same = store.save(generate_siblings(classes, client, per_class=4, k=2, lexicon=toy_lexicon))
        other = store.save(generate_siblings(classes, client, per_class=4, k=3, lexicon=toy_lexicon))
    assert (first.version, same.version, other.version) == (1, 1, 2)
    assert store.load("siblings").hash == other.hash
    assert store.load("siblings@v1").hash == first.hash == store.load(f"siblings@{first.hash[:8]}").hash
    assert [row["version"] for row in store.summaries()] == [1, 2]
    assert first.provenance["llm"]["model"] == "fake-model" and "created" in first.provenance
    path = next((tmp_path / "vocab" / "siblings").glob("v001-*.json"))
    data = json.loads(path.read_text())
    data["labels"].append("smuggled")
    path.write_text(json.dumps(data))
    with pytest.raises(ZeroShotError, match="recorded hash"):
        store.load("siblings@v1")
    with pytest.raises(ZeroShotError, match="no vocabulary 'nope'"):
        store.load("nope")


def test_cli_builds_llm_vocabularies_and_resumes(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from oodbench.zeroshot.cli import register

    for name in ("OODBENCH_LLM_BASE_URL", "OPENAI_BASE_URL", "OODBENCH_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    classes = tmp_path / "classes.txt"
    classes.write_text("tench\ngoldfish\n")
    vocab = tmp_path / "vocab"

    def reply(prompt: str, seen: int):
        if "JSON array of 500" in prompt:
            return 200, chat_body(json.dumps([f"far thing {i}" for i in range(300)] + ["Tinca tinca"])), {}, 0.0
        return siblings_reply(prompt, seen)

    with FakeOpenAIServer(reply) as server:
        args = [
            "zeroshot",
            "vocab",
            "build",
            "siblings",
            "--classes",
            str(classes),
            "--llm-base-url",
            server.url,
            "--llm-model",
            "fake",
            "--vocab-dir",
            str(vocab),
            "--k",
            "2",
            "--workers",
            "2",
            "--retries",
            "1",
        ]
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        assert "siblings@v1: 4 labels" in first.stdout and "LLM requests sent 2, answered from cache 0" in first.stdout
        second = CliRunner().invoke(app, args)
        assert "LLM requests sent 0, answered from cache 2" in second.stdout
        assert "siblings@v1" in second.stdout  # same content: no new version
        far = CliRunner().invoke(
            app,
            [
                "zeroshot",
                "vocab",
                "build",
                "eoe",
                "--classes",
                str(classes),
                "--task",
                "far",
                "--llm-base-url",
                server.url,
                "--llm-model",
                "fake",
                "--vocab-dir",
                str(vocab),
                "--max-requests",
                "1",
            ],
        )
        assert far.exit_code == 0, far.output
        assert "eoe-far@v1: 300 labels, kind eoe" in far.stdout  # 'Tinca tinca' is a synonym of the ID class tench
    missing = CliRunner().invoke(
        app, ["zeroshot", "vocab", "build", "siblings", "--classes", str(classes), "--vocab-dir", str(vocab)]
    )
    assert missing.exit_code == 2 and "no LLM endpoint" in missing.output
    unknown = CliRunner().invoke(
        app,
        [
            "zeroshot",
            "evaluate",
            "--store",
            str(tmp_path),
            "--model",
            "m",
            "--id",
            "a",
            "--ood",
            "b",
            "--vocab",
            "nope",
            "--vocab-dir",
            str(vocab),
            "--classes",
            str(classes),
        ],
    )
    assert unknown.exit_code == 2 and "no vocabulary 'nope'" in unknown.output


# ----------------------------------------------------------------------------------------------- faults (issue 19)
def test_a_redirect_is_refused_and_the_key_never_reaches_the_other_host(tmp_path):
    # Before: urllib followed the 302 and sent Authorization to the other host, whose answer was cached and used.
    with FakeOpenAIServer(lambda prompt, seen: (200, chat_body('["elsewhere"]'), {}, 0.0)) as other:
        location = other.url + "/chat/completions"
        with FakeOpenAIServer(lambda prompt, seen: (302, b"", {"Location": location}, 0.0)) as server:
            with pytest.raises(LLMError, match=r"HTTP 302.*redirect to .* refused"):
                client_for(server, tmp_path / "c").complete([{"role": "user", "content": "hi"}])
            assert len(server.prompts) == 1  # not retried either
        assert other.prompts == [] and other.headers == []
    assert not list((tmp_path / "c").rglob("*.json"))


def test_unusable_replies_are_not_cached_and_unanswered_classes_are_refused(tmp_path, toy_lexicon):
    # Before: prose replies were cached and saved as a 0-label vocabulary; a rerun sent 0 requests.
    prose = chat_body("I am sorry, I cannot list categories for that.")
    classes = ClassList(("cat", "dog"), None, "two")
    with FakeOpenAIServer(lambda prompt, seen: (200, prose, {}, 0.0)) as server:
        for run in (1, 2):
            client = client_for(server, tmp_path / "cache")
            with pytest.raises(ZeroShotError, match="2 of 2 classes got no usable list of siblings in 2 attempt"):
                generate_siblings(classes, client, per_class=4, lexicon=toy_lexicon, max_attempts=2, workers=1)
            assert client.stats["requests"] == 4 and len(server.prompts) == 4 * run  # asked again on the rerun
        assert not list((tmp_path / "cache").rglob("*.json"))
        partial = generate_siblings(
            classes, client, per_class=4, lexicon=toy_lexicon, max_attempts=1, workers=1, allow_incomplete=True
        )
        assert partial.provenance["classes_without_enough_names"] == ["cat", "dog"] and len(partial) == 0


def test_cli_exposes_the_reask_limit_and_refuses_unanswered_classes(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from oodbench.zeroshot.cli import register

    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    classes = tmp_path / "classes.txt"
    classes.write_text("tench\ngoldfish\n")
    prose = chat_body("I am unable to provide such a list today.")
    with FakeOpenAIServer(lambda prompt, seen: (200, prose, {}, 0.0)) as server:
        args = ["zeroshot", "vocab", "build", "siblings", "--classes", str(classes), "--llm-base-url", server.url]
        args += ["--llm-model", "fake", "--vocab-dir", str(tmp_path / "vocab"), "--workers", "1"]
        result = CliRunner().invoke(app, [*args, "--max-attempts", "1"])
        assert result.exit_code == 2 and "--allow-incomplete" in result.output and len(server.prompts) == 2
        assert not (tmp_path / "vocab" / "siblings").exists()
        result = CliRunner().invoke(app, [*args, "--max-attempts", "1", "--allow-incomplete"])
        assert result.exit_code == 0 and "siblings@v1: 0 labels" in result.stdout


def test_the_first_fatal_error_cancels_the_remaining_requests(tmp_path, toy_lexicon):
    # Before: every submitted class was still sent (8 classes, 8 requests for a key the server refuses).
    classes = ClassList(tuple(f"class {i}" for i in range(8)), None, "eight")
    with FakeOpenAIServer(lambda prompt, seen: (401, b'{"error": "bad key"}', {}, 0.05)) as server:
        with pytest.raises(LLMError, match=r"HTTP 401.*stopped the remaining requests: 0 of 8 replies"):
            generate_siblings(classes, client_for(server, tmp_path / "c"), per_class=4, lexicon=toy_lexicon, workers=2)
        assert len(server.prompts) <= 2  # the two in flight when the first failed


@pytest.mark.parametrize("workers", [1, 3])
def test_ctrl_c_cancels_the_remaining_requests_and_reports_what_was_saved(tmp_path, workers):
    # Before: SIGINT after 2 of 20 requests still sent all 20. No timing decides anything here: the server answers
    # "0" and "1" and holds every later request until `release`; once it holds `workers` of them (so both replies
    # were received), a real SIGINT goes to the main thread, as Ctrl-C does. The client's timeout is never reached.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a Ctrl-C reaches only the main thread, and this test does not run there")
    held, finished, release = threading.Semaphore(0), threading.Semaphore(0), threading.Event()

    def reply(prompt: str, seen: int):
        if int(quoted_name(prompt)) >= 2:
            held.release()
            release.wait()
        return 200, chat_body('["a b", "c d", "e f"]'), {}, 0.0

    def ctrl_c() -> None:
        for _ in range(workers):
            held.acquire()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    requests = [([{"role": "user", "content": f'name "{i}"'}], 0) for i in range(20)]
    interrupter = threading.Thread(target=ctrl_c, daemon=True)
    with FakeOpenAIServer(reply) as server:
        try:
            client = client_for(server, tmp_path / "c", timeout_s=600, max_retries=0)
            interrupter.start()
            with pytest.raises(LLMInterrupted, match=r"interrupted: 2 of 20 replies were received"):
                client.complete_many(requests, workers=workers, on_done=lambda index: finished.release())
            interrupter.join()
            assert len(server.prompts) == 2 + workers  # the two answered and the held ones; nothing queued was sent
        finally:
            release.set()
        # Requests already running in worker threads finish and are cached; the main thread's own was abandoned.
        running = workers if workers > 1 else 0
        for _ in range(2 + running):
            finished.acquire()
        assert len(server.prompts) == 2 + workers and client.stats["requests"] == 2 + workers
        assert len(list((tmp_path / "c").rglob("*.json"))) == 2 + running


def test_deeply_nested_replies_are_refused_without_a_recursion_error(tmp_path):
    # Before: 3 KB of '[' raised RecursionError while parsing, and the cached reply crashed every rerun.
    assert parse_name_list("[" * 3000) == []
    assert parse_name_list("[" * 3000 + "\n- real name\n- other name") == ["real name", "other name"]
    nested_body = b'{"choices": [{"message": {"content": ' + b"[" * 3000 + b"}}]}"
    with FakeOpenAIServer(lambda prompt, seen: (200, nested_body, {}, 0.0)) as server:
        with pytest.raises(LLMError, match="nested deeper than 64 levels"):
            client_for(server, tmp_path / "c", max_retries=1).complete([{"role": "user", "content": "hi"}])
        assert len(server.prompts) == 2


def test_a_trickling_server_times_out_on_the_whole_request(tmp_path):
    # Before: the timeout bounded each socket read, so one byte every 0.1 s never timed out (0.5 s per read).
    body = chat_body('["a", "b"]')
    server = FakeOpenAIServer(lambda prompt, seen: (200, body, {}, 0.0))
    handler = server.server.RequestHandlerClass

    def do_post(self) -> None:  # one byte per 0.1 s, for at most len(body) bytes (bounded)
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append({"path": self.path, "auth": None, "headers": dict(self.headers), "body": asked})
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass

    handler.do_POST = do_post
    with server:
        with pytest.raises(LLMError, match=r"no answer within 0.5 s \(the whole request\)"):
            client_for(server, tmp_path / "c", timeout_s=0.5, max_retries=0).complete(
                [{"role": "user", "content": "hi"}]
            )
        assert server.prompts == ["hi"]  # one request, not retried


def test_reply_size_and_name_count_are_capped(tmp_path, toy_lexicon):
    # Before: a 200k-name reply was kept whole for a class where 20 names were asked.
    many = chat_body(json.dumps([f"thing {i}" for i in range(5000)]))
    classes = ClassList(("cat",), None, "one")
    with FakeOpenAIServer(lambda prompt, seen: (200, many, {}, 0.0)) as server:
        vocab = generate_siblings(classes, client_for(server, tmp_path / "a"), per_class=6, k=50, lexicon=toy_lexicon)
        assert len(vocab.per_class["cat"]) == 6
        with pytest.raises(LLMError, match="reply larger than 10000 bytes"):
            client_for(server, tmp_path / "b", max_reply_bytes=10_000, max_retries=0).complete(
                [{"role": "user", "content": "hi"}]
            )


def test_server_errors_are_reported_on_one_line(tmp_path):
    html = b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<h1>Bad Gateway</h1>\n</body>\n</html>\n"
    with FakeOpenAIServer(lambda prompt, seen: (502, html, {"Content-Type": "text/html"}, 0.0)) as server:
        with pytest.raises(LLMError) as info:
            client_for(server, tmp_path / "c", max_retries=0).complete([{"role": "user", "content": "hi"}])
    message = str(info.value)
    assert "\n" not in message and "<" not in message and "502 Bad Gateway Bad Gateway" in message


def test_api_key_precedence_is_arguments_then_config_file_then_environment(tmp_path, monkeypatch):
    # Before: the CLI read OODBENCH_LLM_API_KEY as if it were --llm-api-key, so it beat the config file's key.
    import typer
    from typer.testing import CliRunner

    from oodbench.zeroshot.cli import register

    for name in ("OODBENCH_LLM_BASE_URL", "OPENAI_BASE_URL", "OODBENCH_LLM_MODEL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OODBENCH_LLM_API_KEY", "sk-env")
    config = tmp_path / "llm.toml"
    config.write_text('[llm]\napi_key = "sk-file"\n')
    assert LLMConfig.resolve(base_url="http://x", model="m", config_file=config).api_key == "sk-file"
    assert LLMConfig.resolve(base_url="http://x", model="m", config_file=config, api_key="sk-arg").api_key == "sk-arg"
    assert LLMConfig.resolve(base_url="http://x", model="m").api_key == "sk-env"
    app = typer.Typer(cls=OodbenchGroup)  # the root CLI's error handling
    register(app)
    classes = tmp_path / "classes.txt"
    classes.write_text("tench\n")
    with FakeOpenAIServer(siblings_reply) as server:
        args = ["zeroshot", "vocab", "build", "siblings", "--classes", str(classes), "--llm-base-url", server.url]
        args += ["--llm-model", "fake", "--vocab-dir", str(tmp_path / "vocab"), "--llm-config", str(config)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert server.headers[0]["Authorization"] == "Bearer sk-file"
