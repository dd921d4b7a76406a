from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .helpers import make_run  # noqa: E402


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real evaluation run directory (5 logit detectors, 3 OOD sets of 300/260/220 images)."""
    return make_run(tmp_path_factory.mktemp("analysis-run"))
