"""Residual: ViM's feature-space term alone, the norm of z − u off the fit set's principal subspace."""

from __future__ import annotations

import numpy as np

from ..errors import DetectorError
from ..outputs import Head, Outputs
from ._gaussian import symmetric_eigh
from .base import Detector, Paper, Requirements
from .hybrid import _min_norm_solution, vim_default_dim
from .registry import register
from .shared import statistics_for
from .state import Array, Scalar


@register("residual")
class Residual(Detector):
    """−‖(z − u) R‖, R the D − dim least-variance directions of the fit features about u = −pinv(W) b."""

    requires = Requirements.of(fit=("features",), score=("features",), head=True)
    shared_statistics = frozenset({"features"})
    # r = D - dim_, the residual directions kept.
    state = {
        "dim_": Scalar(int, 1, "D"),
        "origin_": Array("float64", ("D",)),
        "residual_basis_": Array("float64", ("D", "r")),
    }
    state_dims = {"r": "D"}
    paper = Paper(
        "Wang, Li, Feng & Zhang, ViM: Out-Of-Distribution with Virtual-logit Matching (the Residual score)",
        "CVPR 2022",
        "https://arxiv.org/abs/2203.10807",
        "dim=None picks the ViM paper's rule (D >= 2048: 1000, D >= 768: 512, else D/2), as `vim`; second moment "
        "of z − u (divide by N, as EmpiricalCovariance(assume_centered=True)); OpenOOD's residual.yml fixes dim=512",
    )

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim

    def _validate_params(self) -> None:
        if self.dim is not None:
            self._check_int(dim=self.dim)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        num_features = fit_set.num_features
        self.dim_ = vim_default_dim(num_features) if self.dim is None else int(self.dim)
        if not 1 <= self.dim_ < num_features:
            raise DetectorError(f"residual: dim={self.dim_} must lie in [1, D) for D={num_features} features")
        weight = np.asarray(head.weight, dtype=np.float64)
        self.origin_ = -_min_norm_solution(weight, np.asarray(head.bias, dtype=np.float64))
        moment = statistics_for(self, fit_set).get("features").moment_about(self.origin_)
        _, vectors = symmetric_eigh(moment)
        self.residual_basis_ = np.ascontiguousarray(vectors[:, self.dim_ :])

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        centred = np.asarray(chunk.features, dtype=np.float64) - self.origin_
        return -np.linalg.norm(centred @ self.residual_basis_, axis=1)

    def _row_width(self, test: Outputs) -> int:
        return 2 * test.num_features
