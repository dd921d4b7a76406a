"""Read an evaluation run directory (results.parquet, scores/<model>/<dataset>.npz, run.json) for analysis and reports."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import AnalysisError
from ..core.results import ResultRow, read_rows
from ..core.rundir import RUN_KINDS, RunDir

__all__ = ["RunData", "RUN_KINDS", "load_run", "load_runs"]


@dataclass
class RunData:
    """The rows, run description and (lazily loaded) per-image scores of one evaluation run."""

    path: Path
    info: dict[str, Any]
    rows: list[ResultRow]
    _scores: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def is_zeroshot(self) -> bool:
        """Whether run.json marks a zero-shot run (``"kind": "zeroshot"``, or its ``zeroshot`` section in older runs)."""
        return self.info.get("kind") == "zeroshot" or isinstance(self.info.get("zeroshot"), dict)

    def pairs(self) -> list[tuple[str, str]]:
        """(model, ID dataset) pairs present in the rows, in row order."""
        return list(dict.fromkeys((r.model, r.id_dataset) for r in self.rows))

    def ood_datasets(self, model: str, id_dataset: str) -> list[str]:
        """OOD datasets evaluated for (model, ID set), in the run's order."""
        present = list(
            dict.fromkeys(r.ood_dataset for r in self.rows if (r.model, r.id_dataset) == (model, id_dataset))
        )
        declared = [d for d in self.info.get("ood_datasets", []) if d in present]
        return declared + [d for d in present if d not in declared]

    def detectors(self, model: str, id_dataset: str) -> list[str]:
        """Detectors with rows for (model, ID set), in the run's order."""
        return list(dict.fromkeys(r.detector for r in self.rows if (r.model, r.id_dataset) == (model, id_dataset)))

    def ood_plans(self, ood_datasets: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
        """(model, ID set, OOD set) of every OOD result in the run, or of the named OOD sets (all must be present)."""
        plans = [
            (m, i, o)
            for m, i in self.pairs()
            for o in self.ood_datasets(m, i)
            if ood_datasets is None or o in ood_datasets
        ]
        if ood_datasets is not None:
            unknown = sorted(set(ood_datasets) - {p[2] for p in plans})
            if unknown:
                raise AnalysisError(f"OOD datasets {unknown} are not in {self.path}")
        if not plans:
            raise AnalysisError(f"{self.path} has no OOD results")
        return plans

    def has_scores(self, model: str, dataset: str) -> bool:
        """Whether per-image scores of (model, dataset) were saved."""
        return RunDir(self.path).has_scores(model, dataset)

    def scores(self, model: str, dataset: str) -> dict[str, np.ndarray]:
        """{detector: per-image scores} of (model, dataset); cached after the first read."""
        key = (model, dataset)
        if key not in self._scores:
            if not self.path.is_dir():
                raise AnalysisError(f"{self.path} is a result file, not a run directory: it has no per-image scores")
            self._scores[key] = RunDir(self.path).load_scores(model, dataset)
        return self._scores[key]

    def paired_scores(
        self, model: str, id_dataset: str, ood_dataset: str, detectors: Sequence[str] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """ID and OOD scores of the detectors present in both (optionally restricted to `detectors`)."""
        id_scores = self.scores(model, id_dataset)
        ood_scores = self.scores(model, ood_dataset)
        names = [
            d
            for d in (detectors or self.detectors(model, id_dataset) or list(id_scores))
            if d in id_scores and d in ood_scores
        ]
        if detectors is not None:
            missing = [d for d in detectors if d not in names]
            if missing:
                raise AnalysisError(
                    f"no saved scores for {', '.join(missing)} on {model}/{id_dataset} vs {ood_dataset}; "
                    f"available: {', '.join(sorted(set(id_scores) & set(ood_scores)))}"
                )
        if not names:
            raise AnalysisError(
                f"no detector has scores for both {id_dataset} and {ood_dataset} of {model} in {self.path}"
            )
        return {d: id_scores[d] for d in names}, {d: ood_scores[d] for d in names}


def load_run(path: str | os.PathLike[str]) -> RunData:
    """A run directory (or a bare results .parquet file, which then has no scores)."""
    path = Path(path)
    if path.is_file():
        return RunData(path=path, info={}, rows=read_rows(path))
    if not path.exists():
        raise AnalysisError(f"no run directory at {path}")
    run_dir = RunDir(path)
    rows = run_dir.read_rows()
    info = run_dir.read_info()
    return RunData(path=path, info=info, rows=rows)


def load_runs(paths: Sequence[str | os.PathLike[str]]) -> list[RunData]:
    """Several runs (e.g. one per model), refusing duplicates of the same (model, ID, OOD, detector, metric).

    A zero-shot run and a supervised run may share a model id (e.g. CLIP zero-shot and its linear probe): their rows
    are told apart by the run kind, so only two runs of the same kind clash.
    """
    runs = [load_run(p) for p in paths]
    check_distinct(runs)
    return runs


def check_distinct(runs: Sequence[RunData]) -> None:
    """Refuse two runs of the same kind with a row of the same (model, ID, OOD, detector, metric)."""
    seen: dict[tuple[bool, str, str, str, str, str], Path] = {}
    for run in runs:
        for r in run.rows:
            key = (run.is_zeroshot, r.model, r.id_dataset, r.ood_dataset, r.detector, r.metric)
            if key in seen and seen[key] != run.path:
                raise AnalysisError(
                    f"{r.model}/{r.ood_dataset}/{r.detector}/{r.metric} appears in both {seen[key]} "
                    f"and {run.path}; pass each model's run once"
                )
            seen[key] = run.path
