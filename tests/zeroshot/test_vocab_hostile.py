"""Hostile vocabulary directories: a vocabulary is data, read only from regular files inside the directory.

A FIFO named like an artefact must not hang `vocab list`; a name such as ``../elsewhere`` (on the command line, in
a config's ``ref``, or on a `Vocabulary` being saved) must not reach outside the directory; a link in place of an
artefact or a name folder is refused, not followed; a non-UTF-8 artefact and one whose fields have the wrong types
are one `ZeroShotError` line (exit status 2), never an "unexpected" exit 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from oodbench.core.errors import ZeroShotError
from oodbench.zeroshot.vocab import artefact
from oodbench.zeroshot.vocab.artefact import VocabStore, Vocabulary

from ..cli_once import main
from ..hostile import bounded

pytestmark = pytest.mark.hostile

LABELS = ["zebra crossing", "spaceship", "lighthouse"]


def _store(root: Path, name: str = "myv") -> tuple[VocabStore, Path]:
    """A store with one vocabulary; its artefact's path."""
    store = VocabStore(root)
    vocab = store.save(Vocabulary(name, "custom", list(LABELS), params={"k": 2}, provenance={"source": "test"}))
    return store, root / name / f"v001-{vocab.hash[:12]}.json"


def _refused(exc: BaseException | None, *words: str) -> str:
    assert isinstance(exc, ZeroShotError), f"expected a ZeroShotError, got {exc!r}"
    message = str(exc)
    assert "\n" not in message and len(message) <= 500, message
    for word in words:
        assert word in message, message
    return message


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`oodbench ARGV` in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def _one_line_exit_2(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err and "unexpected" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _cli_process(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m oodbench ARGV` in a subprocess with a timeout: a command that blocks fails the test."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    try:
        return subprocess.run(
            [sys.executable, "-m", "oodbench", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"oodbench {' '.join(argv)} blocked (a FIFO was opened for reading)")


# ----------------------------------------------------------------------------------------------- 1. FIFOs
@pytest.mark.parametrize("command", ["list", "show"])
def test_a_fifo_named_like_an_artefact_does_not_hang_the_cli(tmp_path, command):
    _, path = _store(tmp_path / "vd")
    path.unlink()
    os.mkfifo(path)
    args = ["zeroshot", "vocab", command] + (["myv"] if command == "show" else []) + ["--vocab-dir", "vd"]
    done = _cli_process(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    line = _one_line_exit_2(done.returncode, done.stderr)
    assert "FIFO" in line, line


@pytest.mark.parametrize("action", ["load", "summaries", "save", "load_many all"])
def test_a_fifo_artefact_is_refused_by_the_api(tmp_path, action):
    store, path = _store(tmp_path / "vd")
    path.unlink()
    os.mkfifo(path)
    run = {
        "load": lambda: store.load("myv"),
        "summaries": store.summaries,
        # identical content: save reads the stored version back
        "save": lambda: store.save(Vocabulary("myv", "custom", list(LABELS), params={"k": 2})),
        "load_many all": lambda: store.load_many(["all"]),
    }[action]
    _refused(bounded(run, path), "FIFO")


# ----------------------------------------------------------------------------------------------- 2. names as paths
def test_show_refuses_a_name_that_leaves_the_vocab_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, path = _store(tmp_path / "vd")
    outside = tmp_path / "outsidev" / "secretv"
    outside.mkdir(parents=True)
    shutil.copy(path, outside / path.name)
    code, out, err = _cli(capsys, "zeroshot", "vocab", "show", "../outsidev/secretv", "--vocab-dir", "vd")
    line = _one_line_exit_2(code, err)
    assert "not a valid name" in line, line
    assert "spaceship" not in out + err


BAD_NAMES = [
    "../outsidev/secretv",
    "../outsidev/secretv@v1",
    "..",
    "../x",
    "a/b",
    "/etc",
    "evil\n",
    "evil\n@v1",
    ".hidden",
    "",
    "@v1",
]


@pytest.mark.parametrize("ref", BAD_NAMES)
def test_load_refuses_names_outside_the_name_rule(tmp_path, ref):
    store, path = _store(tmp_path / "vd")
    # a valid artefact wherever a traversing name would point
    for folder in (tmp_path / "outsidev" / "secretv", tmp_path / "x", tmp_path / "vd" / "a" / "b"):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    _refused(bounded(lambda: store.load(ref)), "not a valid name")


def test_a_config_ref_cannot_leave_the_vocab_store(tmp_path):
    from oodbench.runner.plan import load_ref_vocabularies

    _, path = _store(tmp_path / "vd")
    outside = tmp_path / "outsidev" / "secretv"
    outside.mkdir(parents=True)
    shutil.copy(path, outside / path.name)
    spec = SimpleNamespace(vocab_store=str(tmp_path / "vd"), vocabularies={"neg": {"ref": "../outsidev/secretv@v1"}})
    found, problems = load_ref_vocabularies(SimpleNamespace(zeroshot=spec))
    assert found == {}
    assert "not a valid name" in problems["zeroshot.vocabularies.neg.ref"]


def test_save_refuses_a_name_changed_after_construction(tmp_path):
    vocab = Vocabulary("myv", "custom", list(LABELS))
    vocab.name = "../escaped"
    _refused(bounded(lambda: VocabStore(tmp_path / "vd").save(vocab)), "not a valid name")
    assert not (tmp_path / "escaped").exists()


# ----------------------------------------------------------------------------------------------- links, other objects
KINDS = ("link-to-copy", "link-to-victim", "link-to-dev-zero", "link-loop", "directory", "dangling-link")


def _plant(path: Path, kind: str, victim: Path) -> None:
    original = path.read_bytes()
    path.unlink()
    if kind == "link-to-copy":
        copy = victim.parent / f"copy-of-{path.name}"
        copy.write_bytes(original)
        path.symlink_to(copy)
    elif kind == "link-to-victim":
        path.symlink_to(victim)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-loop":
        other = path.with_name(path.name + ".loop")
        path.symlink_to(other.name)
        other.symlink_to(path.name)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling-link":
        path.symlink_to(victim.parent / "nothing-here")


@pytest.mark.parametrize("kind", KINDS)
def test_an_artefact_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    store, path = _store(tmp_path / "vd")
    victim = tmp_path / "victim.json"
    victim.write_text('{"precious": true}\n')
    _plant(path, kind, victim)
    for action in (lambda: store.load("myv"), store.summaries):
        message = _refused(bounded(action))
        assert "myv" in message, message
    assert victim.read_text() == '{"precious": true}\n'


@pytest.mark.parametrize("target", ["copy", "outside-folder"])
def test_a_name_folder_that_is_a_link_is_refused(tmp_path, capsys, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    _, path = _store(tmp_path / "vd")
    elsewhere = tmp_path / "elsewhere" / "linked"
    elsewhere.mkdir(parents=True)
    shutil.copy(path, elsewhere / path.name)
    if target == "copy":  # the name folder itself replaced by a link to a valid copy
        shutil.rmtree(tmp_path / "vd" / "myv")
        (tmp_path / "vd" / "myv").symlink_to(elsewhere)
        name = "myv"
    else:  # a second, linked name folder next to a valid one
        name = "linked"
        (tmp_path / "vd" / name).symlink_to(elsewhere)
    store = VocabStore(tmp_path / "vd")
    for action in (lambda: store.load(name), store.summaries, store.names, lambda: store.load_many(["all"])):
        _refused(bounded(action), "symbolic link")
    _refused(bounded(lambda: store.save(Vocabulary(name, "custom", ["new label"]))), "symbolic link")
    assert sorted(p.name for p in elsewhere.iterdir()) == [path.name]  # nothing written through the link
    for argv in (["list"], ["show", name]):
        code, out, err = _cli(capsys, "zeroshot", "vocab", *argv, "--vocab-dir", "vd")
        assert "symbolic link" in _one_line_exit_2(code, err)
        assert "spaceship" not in out


def test_the_vocab_dir_itself_may_be_a_link(tmp_path):
    _store(tmp_path / "real")
    (tmp_path / "vd").symlink_to(tmp_path / "real")
    assert VocabStore(tmp_path / "vd").load("myv").labels == LABELS


def test_a_named_json_path_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "named.json"
    os.mkfifo(fifo)
    _refused(bounded(lambda: VocabStore(tmp_path / "vd").load(str(fifo)), fifo), "FIFO")


def test_size_is_checked_before_reading(tmp_path, monkeypatch):
    store, path = _store(tmp_path / "vd")
    monkeypatch.setattr(artefact, "MAX_BYTES", 64)
    _refused(bounded(lambda: store.load("myv")), "more than the 64 allowed")


# ----------------------------------------------------------------------------------------------- 3. not UTF-8
@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"\x00\x01\x02", b'{"name": "caf\xe9"}'])
def test_a_non_utf8_artefact_is_one_line(tmp_path, capsys, monkeypatch, content):
    monkeypatch.chdir(tmp_path)
    _, path = _store(tmp_path / "vd")
    path.write_bytes(content)
    code, _, err = _cli(capsys, "zeroshot", "vocab", "list", "--vocab-dir", "vd")
    assert "UTF-8" in _one_line_exit_2(code, err) or "JSON" in err


# ----------------------------------------------------------------------------------------------- 4. every field checked
def _damage(data: dict, change: str) -> dict | object:
    data = dict(data)
    data.pop("hash")  # hash-less artefacts are still checked field by field
    edits: dict[str, Callable[[dict], object]] = {
        "labels of mixed types": lambda d: d.update(labels=[{"a": 1}, 5, None]),
        "labels a string": lambda d: d.update(labels="spaceship"),
        "labels an object": lambda d: d.update(labels={"a": "b"}),
        "labels null": lambda d: d.update(labels=None),
        "labels missing": lambda d: d.pop("labels"),
        "name a number": lambda d: d.update(name=5),
        "name traversing": lambda d: d.update(name="../x"),
        "name with newline": lambda d: d.update(name="myv\n"),
        "name another vocabulary": lambda d: d.update(name="other"),
        "kind unknown": lambda d: d.update(kind="pickle"),
        "kind a list": lambda d: d.update(kind=["custom"]),
        "params a list": lambda d: d.update(params=[1, 2]),
        "params.k a string": lambda d: d.update(params={"k": "2"}),
        "params.k negative": lambda d: d.update(params={"k": -1}),
        "params.m a float": lambda d: d.update(params={"m": 2.5}),
        "params.k true": lambda d: d.update(params={"k": True}),
        "provenance a string": lambda d: d.update(provenance="me"),
        "deployable a string": lambda d: d.update(deployable="yes"),
        "version a string": lambda d: d.update(version="1"),
        "version zero": lambda d: d.update(version=0),
        "version another": lambda d: d.update(version=7),
        "hash a number": lambda d: d.update(hash=5),
        "hash not hex": lambda d: d.update(hash="z" * 64),
        "size a string": lambda d: d.update(size="3"),
        "size wrong": lambda d: d.update(size=99),
        "format 2": lambda d: d.update(format=2),
        "unknown field": lambda d: d.update(code="import os"),
        "ranked a list": lambda d: d.update(ranked=["a"]),
        "ranked bad key": lambda d: d.update(ranked={"verb": ["a"]}),
        "ranked labels numbers": lambda d: d.update(ranked={"noun": [1, 2]}),
        "per_class a list": lambda d: d.update(per_class=[["a"]]),
        "per_class values strings": lambda d: d.update(per_class={"cat": "kitty"}),
        "per_class nested": lambda d: d.update(per_class={"cat": [["kitty"]]}),
    }
    if change == "a list":
        return [data]
    if change == "null":
        return None
    edits[change](data)
    return data


DAMAGE = [
    "a list",
    "null",
    "labels of mixed types",
    "labels a string",
    "labels an object",
    "labels null",
    "labels missing",
    "name a number",
    "name traversing",
    "name with newline",
    "name another vocabulary",
    "kind unknown",
    "kind a list",
    "params a list",
    "params.k a string",
    "params.k negative",
    "params.m a float",
    "params.k true",
    "provenance a string",
    "deployable a string",
    "version a string",
    "version zero",
    "version another",
    "hash a number",
    "hash not hex",
    "size a string",
    "size wrong",
    "format 2",
    "unknown field",
    "ranked a list",
    "ranked bad key",
    "ranked labels numbers",
    "per_class a list",
    "per_class values strings",
    "per_class nested",
]


@pytest.mark.parametrize("change", DAMAGE)
def test_every_field_is_checked(tmp_path, change):
    store, path = _store(tmp_path / "vd")
    path.write_text(json.dumps(_damage(json.loads(path.read_text()), change)))
    for action in (lambda: store.load("myv"), store.summaries):
        _refused(bounded(action))


RAW = {
    "NaN in params": '"params": {"k": 2, "tau": NaN}',
    "Infinity in provenance": '"provenance": {"x": -Infinity}',
    "1e400 in params": '"params": {"k": 2, "tau": 1e400}',
    "deep provenance": '"provenance": ' + "[" * 40 + "]" * 40,
    "parser-deep provenance": '"provenance": ' + "[" * 100000 + "]" * 100000,
    "truncated": '"labels": ["a"',
}


@pytest.mark.parametrize("case", sorted(RAW))
def test_non_finite_deep_or_malformed_json_is_one_line(tmp_path, case):
    store, path = _store(tmp_path / "vd")
    data = json.loads(path.read_text())
    data.pop("hash")
    data.pop("params" if "params" in RAW[case] else "provenance", None)
    text = json.dumps(data)
    path.write_text(text[:-1] + ", " + RAW[case] + "}")
    _refused(bounded(lambda: store.load("myv")))


def test_the_file_name_hash_is_checked_when_the_hash_field_is_removed(tmp_path):
    store, path = _store(tmp_path / "vd")
    data = json.loads(path.read_text())
    data.pop("hash")
    data["labels"] = ["smuggled"]
    data["size"] = 1
    path.write_text(json.dumps(data))
    _refused(bounded(lambda: store.load("myv")), "does not match its file name")


def test_damaged_labels_on_the_cli_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, path = _store(tmp_path / "vd")
    data = json.loads(path.read_text())
    data.pop("hash")
    data["labels"] = [{"a": 1}, 5, None]
    path.write_text(json.dumps(data))
    for argv in (["show", "myv"], ["list"]):
        code, _, err = _cli(capsys, "zeroshot", "vocab", *argv, "--vocab-dir", "vd")
        assert "labels[0]: expected a string" in _one_line_exit_2(code, err)


def test_from_json_checks_in_memory_data():
    with pytest.raises(ZeroShotError, match="labels"):
        Vocabulary.from_json({"name": "v", "kind": "custom", "labels": [1]})
    good = Vocabulary("v", "custom", ["a", "b"], params={"k": 1}, ranked={"noun": ["a"], "adjective": ["b"]})
    assert Vocabulary.from_json(good.to_json()).hash == good.hash


def test_a_clean_store_still_lists_and_loads(tmp_path):
    store, _ = _store(tmp_path / "vd")
    (tmp_path / "vd" / ".llm-cache").mkdir()  # the default LLM cache lives in the vocab dir
    (tmp_path / "vd" / "notes.txt").write_text("not a vocabulary\n")
    store.save(Vocabulary("myv", "custom", ["other"]))
    assert store.names() == ["myv"]
    assert [row["version"] for row in store.summaries()] == [1, 2]
    assert store.load("myv@v1").labels == LABELS and store.load("myv").labels == ["other"]
