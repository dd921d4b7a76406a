"""Helpers of the runner tests (a module of its own: conftest modules are not importable by name)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
# Few training epochs and draws: these tests check the runner's bookkeeping, not the CNN's accuracy.
FAST_DEMO = (
    "models[0].epochs=2",
    "report.score_figures=false",
    "analysis.subsample.draws=50",
    "analysis.intervals.resamples=50",
    "report.curve_draws=20",
    "report.resamples=50",
)


def demo_config(workdir: Path, *extra: str):
    """The shipped demo config with fast settings, writing into `workdir`."""
    from oodbench.runner.config import load_config

    return load_config(CONFIGS / "demo.toml", overrides=(*FAST_DEMO, *extra), workdir=workdir)
