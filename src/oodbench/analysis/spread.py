"""Between-dataset spread versus sampling noise (the Fi-ImageNet-1k paper's §4.6): are OOD sets really different, or just small?

Per (model, ID set): the spread is the standard deviation, across OOD sets, of the best detector's full-set FPR@95;
the sampling noise is the mean, across the same sets, of the FPR@95 standard deviation over subsets of n images.
A ratio well above 1 means the differences between benchmarks are not explained by their size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.errors import AnalysisError
from .records import plain_dict
from .subsample import SubsampleSummary

__all__ = ["SpreadSummary", "spread_vs_noise"]


@dataclass(frozen=True)
class SpreadSummary:
    """Spread of FPR@95 across OOD sets compared with the sampling std at subset size n."""

    model: str
    id_dataset: str
    datasets: tuple[str, ...]
    n: int
    spread: float  # std (ddof=1) across datasets of the best detector's full FPR@95
    range: float  # max - min of the same values
    sampling_std: float  # mean over datasets of the empirical std over draws
    sampling_se: float  # mean over datasets of the closed-form standard error
    ratio: float  # spread / sampling_std

    def as_dict(self) -> dict[str, object]:
        """Plain dict (for JSON)."""
        return {**plain_dict(self), "datasets": list(self.datasets)}  # a NaN or inf ratio becomes null


def spread_vs_noise(summaries: Sequence[SubsampleSummary]) -> list[SpreadSummary]:
    """One summary per (model, ID set) with at least two OOD sets subsampled at the same n."""
    groups: dict[tuple[str, str], list[SubsampleSummary]] = {}
    for summary in summaries:
        groups.setdefault((summary.model, summary.id_dataset), []).append(summary)
    results = []
    for (model, id_dataset), members in groups.items():
        sizes = {m.n for m in members}
        if len(sizes) != 1:
            raise AnalysisError(f"{model}: OOD sets were subsampled at different n {sorted(sizes)}; compare at one n")
        if len(members) < 2:
            continue
        full = np.array([m.full for m in members])
        sampling_std = float(np.mean([m.std for m in members]))
        spread = float(full.std(ddof=1))
        ratio = spread / sampling_std if sampling_std > 0 else (float("inf") if spread > 0 else float("nan"))
        results.append(
            SpreadSummary(
                model,
                id_dataset,
                tuple(m.ood_dataset for m in members),
                sizes.pop(),
                spread,
                float(full.max() - full.min()),
                sampling_std,
                float(np.mean([m.se for m in members])),
                ratio,
            )
        )
    return results
