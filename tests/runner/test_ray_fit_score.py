"""The Ray engine's fit+score tasks (one per model) give the local engine's scores to the bit, for every detector."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from oodbench.runner.executor import run_experiment

from .helpers import demo_config

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_fit_score_gives_the_local_scores_of_all_detectors(finished_demo, tmp_path: Path) -> None:
    local = finished_demo[0]
    remote = tmp_path / "ray"
    for part in ("store", "ledger/extract"):  # the extraction as the local run left it; nothing scored yet
        shutil.copytree(local / part, remote / part)
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}}
    )
    try:
        report = run_experiment(
            demo_config(remote, "engine.cpus_per_score=2"), engine="ray", only="score", progress=False, device="cpu"
        )
    finally:
        ray.shutdown()
    assert report.executed["extract"] == []
    files = sorted(p.relative_to(local) for p in (local / "units" / "scores").rglob("*.npy"))
    detectors = {f.parts[3] for f in files}
    assert len(report.executed["fit"]) == len(detectors) >= 21
    assert len(report.executed["score"]) == len(files)
    for relative in files:
        np.testing.assert_array_equal(np.load(remote / relative), np.load(local / relative), err_msg=str(relative))
