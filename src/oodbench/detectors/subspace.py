"""Residual: ViM's feature-space term alone, the norm of z − u off the fit set's principal subspace."""

from __future__ import annotations

import numpy as np

from ..core.outputs import Head, Outputs
from .base import Paper, Requirements, Summary
from .hybrid import _ResidualSpace
from .registry import register


@register("residual")
class Residual(_ResidualSpace):
    """−‖(z − u) R‖, R the D − dim least-variance directions of the fit features about u = −pinv(W) b."""

    requires = Requirements.of(fit=("features",), score=("features",), head=True)
    shared_statistics = frozenset({"features"})
    paper = Paper(
        "Wang, Li, Feng & Zhang, ViM: Out-Of-Distribution with Virtual-logit Matching (the Residual score)",
        "CVPR 2022",
        "https://arxiv.org/abs/2203.10807",
        "dim=None picks the ViM paper's rule (D >= 2048: 1000, D >= 768: 512, else D/2), as `vim`; second moment "
        "of z − u (divide by N, as EmpiricalCovariance(assume_centered=True)); OpenOOD's residual.yml fixes dim=512",
    )
    summary = Summary(
        "−‖(z−u) off the principal subspace‖, ViM's feature term alone",
        defaults="None: by D as `vim`; OpenOOD fixes 512",
        also_in="OpenOOD",
        agreement="1.9e-14 relative (OpenOOD's formula, float64)",
    )

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self._fit_residual_space(fit_set, head)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        centred = np.asarray(chunk.features, dtype=np.float64) - self.origin_
        return -np.linalg.norm(centred @ self.residual_basis_, axis=1)

    def _row_width(self, test: Outputs) -> int:
        return 2 * test.num_features
