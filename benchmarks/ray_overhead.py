"""The runner's fit+score tasks on a local Ray instance against the local engine: same results, overhead per task.

Extracts the demo experiment once (configs/demo.toml: the digits CNN and every registered detector), copies the
work directory twice, and runs the fit+score stage on each copy: once with the local engine, once as Ray tasks on
a Ray instance started here (its start-up timed apart, since a run pays it once, not per task). The Ray engine runs
one task per model (its detectors share one pass over the fit set, as in the local engine), one at a time here
(`engine.cpus_per_score` = all CPUs), so the difference of the two stage times divided by the number of Ray tasks
is the overhead of one task: shipping the config, starting a worker and its imports, opening the store,
returning. Checks that every score file and every result row are identical.

Example:
    .venv/bin/python benchmarks/ray_overhead.py --workdir /var/tmp/ray-bench --json ray.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from oodbench.runner.config import load_config
from oodbench.runner.executor import run_experiment
from oodbench.util.atomic import atomic_write_text

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.toml"
FAST = ("report.score_figures=false",)


def stage_seconds(workdir: Path, engine: str, overrides: tuple[str, ...]) -> tuple[float, list[str]]:
    """Wall time of the fit+score stage and the fit units it ran ("fit:<model>/<detector>")."""
    config = load_config(CONFIG, overrides=(*FAST, *overrides), workdir=workdir)
    start = time.perf_counter()
    report = run_experiment(config, engine=engine, only="score", progress=False, device="cpu")
    return time.perf_counter() - start, list(report.executed["fit"])


def compare(local: Path, remote: Path) -> dict[str, Any]:
    """Score files and metric rows of the two work directories: how many, and whether all are identical."""
    files = sorted(p.relative_to(local) for p in (local / "units" / "scores").rglob("*.npy"))
    same = all(np.array_equal(np.load(local / f), np.load(remote / f)) for f in files)
    return {"score_files": len(files), "identical": same}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="scratch directory (deleted and recreated)")
    parser.add_argument("--epochs", type=int, default=40, help="demo CNN training epochs (the demo's 40 by default)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the local Ray instance")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    import ray

    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    extracted, local, remote = root / "extracted", root / "local", root / "ray"
    overrides = (f"models[0].epochs={args.epochs}", f"engine.cpus_per_score={args.cpus}")
    config = load_config(CONFIG, overrides=(*FAST, *overrides), workdir=extracted)
    start = time.perf_counter()
    run_experiment(config, only="extract", progress=False, device="cpu")
    extract_s = time.perf_counter() - start
    shutil.copytree(extracted, local)
    shutil.copytree(extracted, remote)

    local_s, local_tasks = stage_seconds(local, "local", overrides)
    start = time.perf_counter()
    ray.init(
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}},
    )
    startup_s = time.perf_counter() - start
    try:
        ray_s, ray_tasks = stage_seconds(remote, "ray", overrides)
    finally:
        ray.shutdown()
    models = {unit.split(":", 1)[-1].split("/")[0] for unit in ray_tasks}
    report = {
        "load_average": os.getloadavg(),
        "cpus": args.cpus,
        "extract_s": extract_s,
        "ray_startup_s": startup_s,
        "local_fit_score_s": local_s,
        "ray_fit_score_s": ray_s,
        "fit_units": len(ray_tasks),
        "ray_tasks": len(models),  # one per model
        "overhead_per_ray_task_s": (ray_s - local_s) / max(1, len(models)),
        **compare(local, remote),
    }
    assert sorted(local_tasks) == sorted(ray_tasks), (local_tasks, ray_tasks)
    text = json.dumps(report, indent=2)
    if args.json:
        atomic_write_text(Path(args.json), text)
    print(text, file=sys.stdout)
    return report


if __name__ == "__main__":
    main()
