"""Shared fixtures of the runner tests: a demo experiment file and one completed demo run to copy from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .helpers import demo_config


@pytest.fixture(autouse=True)
def offline_hubs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A demo work directory after one complete run, and that run's report."""
    from oodbench.runner.executor import run_experiment

    workdir = tmp_path_factory.mktemp("demo") / "run"
    report = run_experiment(demo_config(workdir), progress=False)
    return workdir, report


@pytest.fixture
def demo_copy(finished_demo: tuple[Path, object], tmp_path: Path) -> Path:
    """A private copy of the finished demo's work directory."""
    target = tmp_path / "run"
    shutil.copytree(finished_demo[0], target)
    return target
