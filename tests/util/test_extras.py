"""A missing optional extra names the command that installs it into the environment in use."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from oodbench.util import extras

SRC = Path(__file__).resolve().parents[2] / "src"


def _records_elsewhere(entry: str) -> bool:
    """Whether a sys.path entry holds a distribution record of oodbench (the venv's install, a checkout's egg-info)."""
    folder = Path(entry or ".")
    return any(folder.glob("oodbench-*.dist-info")) or (folder / "oodbench.egg-info").is_dir()


def _site(tmp_path: Path, monkeypatch, *records: tuple[str, str | None]) -> None:
    """sys.path with only the given oodbench records, as `(folder name, direct_url.json text or None)`, in order.

    Each record is a real metadata folder that importlib.metadata finds on sys.path: a ``*.dist-info`` as pip
    installs it (PEP 610: ``direct_url.json`` says how) or a checkout's ``*.egg-info`` (no ``direct_url.json``).
    """
    entries = []
    for i, (name, direct_url) in enumerate(records):
        record = tmp_path / f"site{i}" / name
        record.mkdir(parents=True)
        head = "PKG-INFO" if name.endswith(".egg-info") else "METADATA"
        (record / head).write_text("Metadata-Version: 2.1\nName: oodbench\nVersion: 0.1.0\n")
        if direct_url is not None:
            (record / "direct_url.json").write_text(direct_url)
        entries.append(str(record.parent))
    monkeypatch.setattr(sys, "path", [*entries, *(p for p in sys.path if not _records_elsewhere(p))])


def test_install_from_an_index_names_the_package_and_this_interpreter(tmp_path, monkeypatch) -> None:
    wheel = {"url": "https://files.example/oodbench-0.1.0-py3-none-any.whl", "archive_info": {"hashes": {}}}
    _site(tmp_path, monkeypatch, ("oodbench-0.1.0.dist-info", json.dumps(wheel)))
    assert shlex.split(extras.install_command("web")) == [sys.executable, "-m", "pip", "install", "oodbench[web]"]


def test_editable_install_points_at_its_checkout(tmp_path, monkeypatch) -> None:
    # A checkout's egg-info comes first on sys.path (src/ is on it) and has no direct_url.json; the installed record
    # after it says editable, with a percent-encoded file URL.
    editable = {"url": "file:///src/my%20checkout", "dir_info": {"editable": True}}
    _site(tmp_path, monkeypatch, ("oodbench.egg-info", None), ("oodbench-0.1.0.dist-info", json.dumps(editable)))
    words = shlex.split(extras.install_command("web"))
    assert words == [sys.executable, "-m", "pip", "install", "-e", "/src/my checkout[web]"]


def test_a_local_non_editable_install_or_an_unreadable_record_is_not_taken_for_a_checkout(tmp_path, monkeypatch):
    local = {"url": "file:///src/built", "dir_info": {}}  # `pip install .`: a copy, not the checkout
    _site(tmp_path, monkeypatch, ("oodbench-0.1.0.dist-info", json.dumps(local)), ("oodbench-0.0.9.dist-info", "{"))
    assert "-e" not in shlex.split(extras.install_command("web"))


def test_annotate_without_the_web_extra(tmp_path) -> None:
    """sqlalchemy blocked (as if the extra were not installed): one line with the fixing command, exit 2."""
    code = "import sys; sys.modules['sqlalchemy'] = None; from oodbench.cli import main; main(sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code, "annotate", "status", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sqlalchemy is not installed")
    assert extras.install_command("web") in lines[0] and sys.executable in lines[0]
