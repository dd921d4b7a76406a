"""Evidence (A) through an OpenAI-compatible endpoint, served by a tiny loopback server."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from ..fakes.openai_server import FakeOpenAIServer
from .helpers import build_project

pytest.importorskip("httpx", reason="the LLM client needs the 'web' extra")

from oodbench.annotate.llm import LLMConfig, LLMDescriber, parse_answer  # noqa: E402
from oodbench.core.errors import AnnotateError  # noqa: E402

ANSWER = json.dumps({"description": "A kayak on a lake.", "closed_world": "Class-3", "open_world": "sea kayak"})


@pytest.fixture
def fake():
    servers = []

    def start(script):
        server = FakeOpenAIServer.scripted(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_describe_retries_then_caches(tmp_path, fake):
    server = fake([(503, "busy", 0), (200, "Sure! ```json\n" + ANSWER + "\n```", 0)])
    config = LLMConfig(server.url, "toy-vlm", api_key="sk-test", backoff=0.01)
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG fake bytes")
    describer = LLMDescriber(config, tmp_path / "cache")
    answer = describer.describe(image, ["class-3", "class-4"])
    assert answer["description"] == "A kayak on a lake."
    assert answer["closed_world"] == "class-3" and answer["closed_world_in_list"]
    assert answer["open_world"] == "sea kayak" and answer["model"] == "toy-vlm"
    assert len(server.requests) == 2
    request = server.requests[-1]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["body"]["model"] == "toy-vlm"
    parts = request["body"]["messages"][1]["content"]
    assert "- class-3\n- class-4" in parts[0]["text"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    # Second call: answered from the on-disk cache, no request; other candidates mean a new question.
    assert LLMDescriber(config, tmp_path / "cache").describe(image, ["class-3", "class-4"]) == answer
    assert len(server.requests) == 2
    LLMDescriber(config, tmp_path / "cache").describe(image, ["class-5"])
    assert len(server.requests) == 3


def test_timeouts_and_client_errors_fail_clearly(tmp_path, fake):
    image = tmp_path / "x.jpg"
    image.write_bytes(b"jpeg")
    slow = fake([(200, ANSWER, 1.0), (200, ANSWER, 1.0)])
    config = LLMConfig(slow.url, "m", timeout=0.2, max_retries=1, backoff=0.01)
    with pytest.raises(AnnotateError, match=r"failed after 2 attempt\(s\): no answer within 0.2 s"):
        LLMDescriber(config, tmp_path / "c").describe(image, [])
    refused = fake([(401, "bad key", 0), (200, ANSWER, 0)])
    with pytest.raises(AnnotateError, match="after 1 attempt.*HTTP 401"):
        LLMDescriber(LLMConfig(refused.url, "m", backoff=0.01), tmp_path / "c").describe(image, [])
    assert not list((tmp_path / "c").glob("*.json"))  # failures are not cached


def test_parse_answer_formats():
    assert parse_answer('{"description": "d", "closed_world": "NONE", "open_world": "yurt"}', ["tent"]) == {
        "description": "d",
        "closed_world": None,
        "closed_world_in_list": False,
        "open_world": "yurt",
        "parse_error": False,
    }
    out = parse_answer('{"closed_world": "igloo", "open_world": ""}', ["tent"])
    assert out["closed_world"] == "igloo" and not out["closed_world_in_list"] and out["open_world"] is None
    assert parse_answer("I cannot tell.", ["tent"])["parse_error"]


def test_parse_answer_reads_braces_inside_strings():
    # Before: braces were counted by hand, so a "}" inside a string cut the object short and the answer was lost.
    reply = 'Here: {"description": "a sign reading }{", "closed_world": "tent", "open_world": "sign"} done'
    out = parse_answer(reply, ["tent"])
    assert not out["parse_error"] and out["closed_world"] == "tent" and out["open_world"] == "sign"
    assert out["description"] == "a sign reading }{"


def test_config_from_environment(monkeypatch):
    for var in (
        "OODBENCH_LLM_BASE_URL",
        "OODBENCH_LLM_MODEL",
        "OODBENCH_LLM_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(AnnotateError, match="no LLM endpoint"):
        LLMConfig.resolve()
    monkeypatch.setenv("OODBENCH_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("OODBENCH_LLM_MODEL", "m")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    config = LLMConfig.resolve()
    assert (config.base_url, config.model, config.api_key) == ("http://127.0.0.1:9/v1", "m", "k")


def test_describe_images_fills_project_evidence(tmp_path, fake):
    from oodbench.annotate.project import describe_images

    project = build_project(tmp_path, n_images=2)
    server = fake([(200, ANSWER, 0), (200, ANSWER, 0)])
    describer = LLMDescriber(LLMConfig(server.url, "toy", backoff=0.01), project.llm_cache)
    assert describe_images(project, describer) == 2
    assert describe_images(project, describer) == 0  # nothing left to describe
    images = project.store().images()
    assert all(img.evidence["llm"]["open_world"] == "sea kayak" for img in images)
    # The closed world offered to the model is the image's evidence classes (here: its original label).
    assert "- class-0" in server.requests[0]["body"]["messages"][1]["content"][0]["text"]
    project.close()


def test_describe_command(tmp_path, fake, monkeypatch):
    from typer.testing import CliRunner

    from oodbench.annotate.cli import app

    project = build_project(tmp_path, n_images=2)
    project.close()
    server = fake([(200, ANSWER, 0), (429, "slow down", 0), (200, ANSWER, 0)])
    monkeypatch.setenv("OODBENCH_LLM_API_KEY", "sk-cli")
    result = CliRunner().invoke(
        app, ["describe", str(project.dir), "--base-url", server.url, "--model", "toy", "--no-progress", "--limit", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "described 1 images" in result.output and server.requests[0]["auth"] == "Bearer sk-cli"
    result = CliRunner().invoke(
        app,
        ["describe", str(project.dir), "--base-url", server.url, "--model", "toy", "--no-progress", "--retries", "0"],
    )
    assert result.exit_code == 2 and "HTTP 429" in result.output  # a refusal is reported, not hidden
    monkeypatch.delenv("OODBENCH_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    result = CliRunner().invoke(app, ["describe", str(project.dir), "--model", "toy"])
    assert result.exit_code == 2 and "no LLM endpoint" in result.output


def test_retry_after_zero_does_not_turn_off_the_backoff(tmp_path, fake, monkeypatch):
    # Before: "Retry-After: 0" replaced the backoff, so a persistent 429 was retried with no pause.
    import oodbench.annotate.llm as annotate_llm

    waits: list[float] = []
    # The client's pause is recorded, not slept; the fake server's own delays use a sleep bound before this patch.
    monkeypatch.setattr(annotate_llm.time, "sleep", waits.append)
    server = fake([(429, "slow down", 0, {"Retry-After": "0"}), (200, ANSWER, 0)])
    image = tmp_path / "x.png"
    image.write_bytes(b"png")
    answer = LLMDescriber(LLMConfig(server.url, "m", backoff=0.5), tmp_path / "c").describe(image, [])
    assert answer["open_world"] == "sea kayak" and len(server.requests) == 2
    assert waits == [0.5]  # the larger of Retry-After (0) and the backoff (0.5)
    waits.clear()
    server = fake([(429, "slow down", 0, {"Retry-After": "120"}), (200, ANSWER, 0)])
    LLMDescriber(LLMConfig(server.url, "m", backoff=0.5), tmp_path / "d").describe(image, [])
    assert waits == [30.0]  # a longer Retry-After lengthens the pause, up to the client's 30 s cap


def test_describe_honours_the_projects_timeout_and_retries(tmp_path, fake):
    # Before: the command's own defaults (60 s, 3 retries) replaced the project's llm settings.
    from typer.testing import CliRunner

    from oodbench.annotate.cli import app

    project = build_project(tmp_path, n_images=1)
    project.close()
    config = json.loads((project.dir / "project.json").read_text())
    config["llm"] = {"max_retries": 0, "timeout": 5}
    (project.dir / "project.json").write_text(json.dumps(config))
    server = fake([(429, "slow down", 0), (200, ANSWER, 0)])
    result = CliRunner().invoke(app, ["describe", str(project.dir), "--base-url", server.url, "--model", "toy"])
    assert result.exit_code == 2 and "HTTP 429" in result.output and len(server.requests) == 1
    result = CliRunner().invoke(
        app, ["describe", str(project.dir), "--base-url", server.url, "--model", "toy", "--retries", "1"]
    )
    assert result.exit_code == 0, result.output  # an option still overrides the project


def test_a_deeply_nested_answer_is_a_parse_error_not_a_crash():
    # Before: json.loads of 3,000 nested braces raised RecursionError.
    answer = parse_answer('{"a": ' * 3000 + "1" + "}" * 3000, ["class-1"])
    assert answer["parse_error"] and answer["closed_world"] is None


def test_an_unparseable_reply_is_never_cached_and_redo_asks_again(tmp_path, fake):
    """An answer that does not parse is kept as evidence (marked) but asked again; --redo always asks again."""
    from typer.testing import CliRunner

    from oodbench.annotate.cli import app
    from oodbench.annotate.project import Project

    project = build_project(tmp_path, n_images=1)
    project.close()
    server = fake([(200, "I cannot tell what this is.", 0), (200, "Still no JSON.", 0), (200, ANSWER, 0)])
    describe = ["describe", str(project.dir), "--base-url", server.url, "--model", "toy", "--no-progress"]

    def evidence() -> dict:
        proj = Project.open(project.dir)
        try:
            return proj.store().images()[0].evidence["llm"]
        finally:
            proj.close()

    assert CliRunner().invoke(app, [*describe, "--redo"]).exit_code == 0
    assert len(server.requests) == 1 and evidence()["parse_error"] is True
    assert not list(project.llm_cache.glob("*.json"))  # nothing cached
    assert CliRunner().invoke(app, [*describe, "--redo"]).exit_code == 0  # --redo: the server is asked again
    assert len(server.requests) == 2 and evidence()["description"] == "Still no JSON."
    result = CliRunner().invoke(app, describe)  # a plain rerun also retries the unparseable one
    assert result.exit_code == 0 and "described 1 images" in result.output and len(server.requests) == 3
    assert evidence()["parse_error"] is False and evidence()["open_world"] == "sea kayak"
    assert len(list(project.llm_cache.glob("*.json"))) == 1  # the usable answer is cached
    assert "described 0 images" in CliRunner().invoke(app, describe).output and len(server.requests) == 3
    server.script.append((200, ANSWER.replace("sea kayak", "canoe"), 0))
    assert CliRunner().invoke(app, [*describe, "--redo"]).exit_code == 0  # a usable answer too: asked again
    assert len(server.requests) == 4 and evidence()["open_world"] == "canoe"


def test_an_unparseable_answer_cached_by_an_older_version_is_asked_again(tmp_path, fake):
    server = fake([(200, ANSWER, 0)])
    config = LLMConfig(server.url, "toy-vlm", backoff=0.01)
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG fake bytes")
    describer = LLMDescriber(config, tmp_path / "cache")
    cache = describer._cache_path(hashlib.sha256(image.read_bytes()).hexdigest(), ["class-3"])
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({**parse_answer("no JSON here", ["class-3"]), "raw": "no JSON here"}))
    assert describer.describe(image, ["class-3"])["open_world"] == "sea kayak" and len(server.requests) == 1
    assert json.loads(cache.read_text())["parse_error"] is False
