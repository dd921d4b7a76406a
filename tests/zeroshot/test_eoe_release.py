"""EOE with its released protocol around prompts from a user-given file, against a local OpenAI-compatible server.

The prompt texts here are stand-ins written for the test (EOE's own texts are not redistributable: its repository
declares no licence); what is checked is the protocol: placeholders, one conversation of size/50 requests for
far / fine-grained, one request per class for near, '- ' reply lines, and the release's filtering rules.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from oodbench.core.errors import ZeroShotError
from oodbench.text.classes import ClassList
from oodbench.zeroshot.vocab.eoe_release import (
    dash_lines,
    generate_released_eoe,
    load_prompt_file,
    release_names,
)

from ..fakes.openai_server import FakeOpenAIServer, chat_body
from .test_llm import client_for

PROMPTS = """
source = "stand-in texts for the test"
[far]
prompt = "Classes ({num_classes}): [{class_info}]. List {envision_nums} far outliers."
again = "{envision_nums} more, please."
[near]
prompt = "Class [{class_info}]: list {envision_nums} look-alikes."
[fine_grained]
prompt = "{num_classes} kinds of {class_type}: {class_info}. List {envision_nums} other kinds of {class_type}."
again = "{envision_nums} more kinds of {class_type}."
"""

CLASSES = ClassList(("cat", "hot dog"), ("n00000001", "n00000002"), "toy")


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "eoe_prompts.toml"
    path.write_text(PROMPTS)
    return path


def test_reply_lines_and_the_release_filter():
    assert dash_lines("Sure:\n- Red Fox\n-nope\n- \n  - indented\n- tabby cat") == ["Red Fox", "tabby cat"]
    kept, dropped = release_names(
        [["Red Fox", "CAT", "red fox"], ["Hot Dog", "dog house"]], ["cat", "hot dog"], style="far"
    )
    assert kept == ["red fox", "dog house"] and dropped == ["cat", "hot dog"]
    kept, dropped = release_names([["Red Fox", "dog house", "hot plate"]], ["cat", "hot dog"], style="near")
    assert kept == ["red fox"] and dropped == ["dog house", "hot plate"]  # near: a shared word with an ID name drops it


def test_prompt_files_are_checked(tmp_path, prompt_file):
    prompts = load_prompt_file(prompt_file)
    assert set(prompts.prompts) == {"far", "near", "fine_grained"} and prompts.source.startswith("stand-in")
    assert prompts.render("far", "again", envision_nums=50) == "50 more, please."
    with pytest.raises(ZeroShotError, match=r"uses \{class_type\}"):
        prompts.render("fine_grained", "prompt", num_classes=2, class_info="a; b", envision_nums=50)
    bad = tmp_path / "bad.toml"
    bad.write_text('[far]\nprompt = "List {n} names of {class_info}"\nagain = "more"\n')
    with pytest.raises(ZeroShotError, match=r"unknown placeholder\(s\) \{n\}"):
        load_prompt_file(bad)
    bad.write_text('[far]\nprompt = "List names"\n')
    with pytest.raises(ZeroShotError, match=r"\[far\] must hold exactly prompt and again"):
        load_prompt_file(bad)
    bad.write_text('[farr]\nprompt = "x"\n')
    with pytest.raises(ZeroShotError, match="unknown key"):
        load_prompt_file(bad)
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps({"near": {"prompt": "[{class_info}] {envision_nums}"}}))
    assert set(load_prompt_file(as_json).prompts) == {"near"}
    with pytest.raises(ZeroShotError, match="cannot read"):
        load_prompt_file(tmp_path / "missing.toml")


def test_far_is_one_conversation_of_size_over_50_requests(tmp_path, prompt_file):
    def reply(prompt, seen):
        return 200, chat_body(f"Here:\n- Outlier {len(prompt)} {seen}\n- Cat\n- shared\nnot a name"), {}, 0.0

    with FakeOpenAIServer(reply) as server:
        vocab = generate_released_eoe(
            CLASSES, client_for(server, tmp_path / "c"), load_prompt_file(prompt_file), style="far", size=150
        )
        assert len(server.bodies) == 3
        first, last = server.bodies[0]["messages"], server.bodies[2]["messages"]
        assert first == [{"role": "user", "content": "Classes (2): [cat; hot dog]. List 50 far outliers."}]
        assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
        assert last[2]["content"] == last[4]["content"] == "50 more, please."
        assert last[1]["content"].startswith("Here:\n- Outlier")
    assert vocab.name == "eoe-far" and vocab.kind == "eoe" and vocab.params["protocol"] == "released"
    assert "cat" not in vocab.labels and "shared" in vocab.labels  # ID name dropped; a shared word is kept for far
    assert vocab.labels == ["outlier 50 0", "shared", "outlier 16 0", "outlier 16 1"]  # lower-cased, first kept
    assert vocab.params["prompt_file_sha256"] == load_prompt_file(prompt_file).sha256
    with pytest.raises(ZeroShotError, match="multiple of 50"):
        generate_released_eoe(
            CLASSES, client_for(server, tmp_path / "d"), load_prompt_file(prompt_file), style="far", size=120
        )


def test_near_asks_once_per_class_and_fine_grained_needs_its_class_type(tmp_path, prompt_file):
    def reply(prompt, seen):
        name = prompt.split("[")[1].split("]")[0]
        return 200, chat_body(f"- {name} statue\n- Glass {name.split()[-1]}\n- Lamp"), {}, 0.0

    with FakeOpenAIServer(reply) as server:
        near = generate_released_eoe(
            CLASSES, client_for(server, tmp_path / "n"), load_prompt_file(prompt_file), style="near", per_class=3
        )
        assert sorted(server.prompts) == ["Class [cat]: list 3 look-alikes.", "Class [hot dog]: list 3 look-alikes."]
    assert near.labels == ["lamp"]  # every other name shares a word with an ID name
    assert near.name == "eoe-near" and near.params["per_class"] == 3
    prompts = load_prompt_file(prompt_file)
    with pytest.raises(ZeroShotError, match=r"uses \{class_type\}"):
        generate_released_eoe(CLASSES, client_for(server, tmp_path / "f"), prompts, style="fine_grained")


def test_cli_builds_with_a_prompt_file_and_refuses_a_bad_one_before_asking(tmp_path, prompt_file):
    from oodbench.cli.main import app

    classes = tmp_path / "classes.txt"
    classes.write_text("cat\nhot dog\n")
    with FakeOpenAIServer(lambda prompt, seen: (200, chat_body("- mushroom\n- violin"), {}, 0.0)) as server:
        base = ["zeroshot", "vocab", "build", "eoe", "--classes", str(classes), "--llm-base-url", server.url]
        base += ["--llm-model", "fake", "--vocab-dir", str(tmp_path / "vocab")]
        built = CliRunner().invoke(
            app,
            [*base, "--task", "fine_grained", "--prompts", str(prompt_file), "--class-type", "animal", "--size", "100"],
        )
        assert built.exit_code == 0, built.output
        assert "eoe@v1: 2 labels, kind eoe" in built.stdout  # the fine-grained list is Table 2's EOE
        assert server.prompts[0] == "2 kinds of animal: cat; hot dog. List 50 other kinds of animal."
        bad = tmp_path / "bad.toml"
        bad.write_text('[far]\nprompt = "{oops}"\nagain = "more"\n')
        refused = CliRunner().invoke(app, [*base, "--task", "far", "--prompts", str(bad)])
        assert refused.exit_code == 2 and "unknown placeholder" in refused.output
        for wrong, message in (
            (["--task", "farr", "--prompts", str(prompt_file)], "--task must be one of far, near, fine_grained"),
            (["--task", "far", "--prompts", str(prompt_file), "--generation", "-1"], "--generation must be >= 0"),
            (["--task", "far", "--classes", str(tmp_path / "none.txt")], "class list not found"),
        ):
            refused = CliRunner().invoke(app, [*base, *wrong])
            assert refused.exit_code == 2 and message in refused.output, refused.output
        assert len(server.prompts) == 2
