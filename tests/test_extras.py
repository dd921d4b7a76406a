"""A missing optional extra names the command that installs it into the environment in use."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from oodbench.util import extras

SRC = Path(__file__).resolve().parents[1] / "src"


def test_install_command_uses_this_interpreter(monkeypatch) -> None:
    monkeypatch.setattr(extras, "_editable_source", lambda: None)
    assert shlex.split(extras.install_command("web")) == [sys.executable, "-m", "pip", "install", "oodbench[web]"]


def test_editable_install_points_at_its_checkout(monkeypatch) -> None:
    monkeypatch.setattr(extras, "_editable_source", lambda: "/src/my checkout")
    words = shlex.split(extras.install_command("web"))
    assert words == [sys.executable, "-m", "pip", "install", "-e", "/src/my checkout[web]"]


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
