"""Hyper-parameter sweeps from cached arrays: fit and score per grid point, no forward passes."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import DetectorError
from ..core.metrics import METRIC_NAMES, evaluate
from ..core.outputs import Head, Outputs
from .registry import create, get_class
from .shared import FitStatistics

__all__ = ["TunePoint", "TuneResult", "tune", "expand_grid"]

# FPR@95 is an error rate; every other metric is better when higher.
_LOWER_IS_BETTER = {"fpr95"}


@dataclass(frozen=True)
class TunePoint:
    """One grid point: its parameters, metrics per OOD set, and the tuned metric averaged over the OOD sets."""

    params: dict[str, Any]
    metrics: dict[str, dict[str, float]]
    value: float


@dataclass(frozen=True)
class TuneResult:
    """Every grid point of a sweep, in grid order, and the best one under `metric`."""

    detector: str
    metric: str
    points: list[TunePoint] = field(default_factory=list)

    @property
    def best(self) -> TunePoint:
        """The point with the best value (lowest for fpr95, highest otherwise); the first on ties."""
        sign = 1.0 if self.metric in _LOWER_IS_BETTER else -1.0
        return min(self.points, key=lambda point: sign * point.value)

    def table(self) -> str:
        """The sweep as a Markdown table (one row per grid point, best marked)."""
        names = sorted({key for point in self.points for key in point.params})
        best = self.best
        lines = ["| " + " | ".join(names + [self.metric, ""]) + " |", "|" + "---|" * (len(names) + 2)]
        for point in self.points:
            cells = [repr(point.params.get(name)) for name in names] + [
                f"{point.value:.4f}",
                "best" if point is best else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def expand_grid(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Grid points: the cartesian product of a {name: values} mapping, or an explicit list of parameter dicts."""
    if isinstance(grid, Mapping):
        for name, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
                raise DetectorError(f"tune: grid[{name!r}] must be a non-empty list of values; got {values!r}")
        names = list(grid)
        return [
            dict(zip(names, combination, strict=True))
            for combination in itertools.product(*(grid[name] for name in names))
        ]
    points = [dict(point) for point in grid]
    if not points:
        raise DetectorError("tune: the grid is empty")
    return points


def tune(
    detector_name: str,
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
    fit: Outputs,
    head: Head | None,
    id_val: Outputs,
    ood_val: Outputs | Mapping[str, Outputs],
    metric: str = "auroc",
    *,
    gram_dtype: str = "float64",
) -> TuneResult:
    """Fit and score `detector_name` at every grid point on cached arrays; report every point and the best.

    `gram_dtype="float32"` builds the shared Gram matrices in float32 (detectors.shared.FitStatistics)."""
    get_class(detector_name)  # unknown names fail before any work
    if metric not in METRIC_NAMES:
        raise DetectorError(f"tune: metric must be one of {', '.join(METRIC_NAMES)}; got {metric!r}")
    ood_sets = {"ood": ood_val} if isinstance(ood_val, Outputs) else dict(ood_val)
    if not ood_sets:
        raise DetectorError("tune: give at least one OOD validation set")
    points = expand_grid(grid)
    detectors = [create(detector_name, **params) for params in points]  # validates every point up front
    result = TuneResult(detector=detector_name, metric=metric)
    # Every grid point learns from the same fit set: one pass of the statistics they share (e.g. NECO's covariance).
    shared = FitStatistics.for_detectors(fit, detectors, head, gram_dtype=gram_dtype)
    for params, detector in zip(points, detectors, strict=True):
        detector.fit(fit, head, stats=shared)
        id_scores = detector.score(id_val)
        metrics = {name: evaluate(id_scores, detector.score(ood)) for name, ood in ood_sets.items()}
        value = float(np.mean([per_set[metric] for per_set in metrics.values()]))
        result.points.append(TunePoint(params=params, metrics=metrics, value=value))
    return result
