"""Detectors that reshape the penultimate activations before the head: ReAct, ASH-S, SCALE, DICE."""

from __future__ import annotations

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import logsumexp_in_place
from ..core.outputs import Head, Outputs
from ._streaming import exact_percentile
from .base import Detector, Paper, Requirements, Summary
from .registry import register
from .shared import statistics_for
from .state import Array, Scalar


def _kept_count(num_features: int, percentile: float) -> int:
    """How many of D activations survive pruning the lowest `percentile` percent (the reference's rounding)."""
    return num_features - int(np.round(num_features * percentile / 100.0))


def _top_k(features: np.ndarray, kept: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the smallest kept value (the cut) and s1 / s2, the sum of all entries over the sum of the top `kept`."""
    split = features.shape[1] - kept
    partitioned = np.partition(features, split, axis=1)
    total = features.sum(axis=1, dtype=np.float64)
    kept_sum = partitioned[:, split:].sum(axis=1, dtype=np.float64)
    # An all-zero row has s1 = s2 = 0; any finite ratio leaves its (zero) shaped vector unchanged, so use 0.
    ratio = np.where(kept_sum != 0.0, total / np.where(kept_sum != 0.0, kept_sum, 1.0), 0.0)
    return partitioned[:, split], ratio


def top_k_mask(features: np.ndarray, cut: np.ndarray, kept: int, *, exact: bool = False) -> np.ndarray:
    """Mask of the top `kept` entries per row given the cut (the kept-th largest value); ties broken by position.

    Without `exact`, surplus entries equal to a zero cut stay in the mask: they change nothing where the kept values
    are summed or multiplied (ASH-S, ASH-P), and most rows of ReLU features have them. ASH-B gives every kept entry
    the same value, so it needs exactly `kept` entries whatever the ties.
    """
    mask = features >= cut[:, None]
    surplus = mask.sum(axis=1) > kept
    rows = np.flatnonzero(surplus if exact else surplus & (cut != 0))
    if rows.size:
        block, block_cut = features[rows], cut[rows, None]
        above, tied = block > block_cut, block == block_cut
        room = kept - above.sum(axis=1)
        mask[rows] = above | (tied & (np.cumsum(tied, axis=1) <= room[:, None]))
    return mask


def _as_float32(features: np.ndarray) -> np.ndarray:
    """Rows as float32 (the dtype the head products run in)."""
    return np.asarray(features, dtype=np.float32)


class _HeadDetector(Detector):
    """Shared by detectors that re-apply the head (W, b) to modified features.

    The products with W run in float32, as the network computes its logits (and at BLAS's float32 speed); sums of
    exponentials accumulate in float64.
    """

    state = {
        "weight_": Array("float32", ("C", "D")),
        "bias_": Array("float64", ("C",)),
        "bias_f32_": Array("float32", ("C",)),
    }

    def _store_head(self, head: Head) -> None:
        self.weight_ = np.asarray(head.weight, dtype=np.float32)
        self.bias_ = np.asarray(head.bias, dtype=np.float64)
        self.bias_f32_ = self.bias_.astype(np.float32)

    def _head_energy(self, features: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
        """Energy (log-sum-exp) of the float32 logits features @ W^T + b."""
        logits = features @ (self.weight_ if weight is None else weight).T
        logits += self.bias_f32_
        return logsumexp_in_place(logits)

    def _row_width(self, test: Outputs) -> int:
        return 3 * (test.num_features + self.weight_.shape[0])


@register("react")
class ReAct(_HeadDetector):
    """Energy of the logits after clipping activations at the p-th percentile c of all fit-set activations."""

    requires = Requirements.of(fit=("features",), score=("features",), head=True)
    paper = Paper(
        "Sun, Guo & Li, ReAct: Out-of-distribution Detection With Rectified Activations",
        "NeurIPS 2021",
        "https://arxiv.org/abs/2111.12797",
        "percentile=90: the paper's default and OpenOOD v1.5's react.yml; the percentile is exact "
        "(numpy's linear method) over every activation of the fit set, computed in streamed passes",
    )
    summary = Summary(
        "energy of W·min(z, c) + b, c the p-th percentile of all fit activations",
        defaults="paper; OpenOOD `react.yml`",
        also_in="pytorch-ood, OpenOOD",
    )

    state = {**_HeadDetector.state, "threshold_": Scalar(float)}

    def __init__(self, percentile: float = 90.0) -> None:
        self.percentile = percentile

    def _validate_params(self) -> None:
        if not isinstance(self.percentile, (int, float, np.integer, np.floating)) or not 0 <= self.percentile <= 100:
            raise DetectorError(f"react: percentile must lie in [0, 100]; got {self.percentile!r}")

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self._store_head(head)
        self.threshold_ = exact_percentile(fit_set.features, float(self.percentile), "react: activation percentile")

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return self._head_energy(np.minimum(_as_float32(chunk.features), np.float32(self.threshold_)))


ASH_PAPER = (
    "Djurisic et al., Extremely Simple Activation Shaping for Out-of-Distribution Detection",
    "ICLR 2023",
    "https://arxiv.org/abs/2209.09858",
)


class _ASH(_HeadDetector):
    """Shared by the three ASH variants: the head re-applied to the top (100 − p)% activations of each row."""

    requires = Requirements.of(score=("features",), head=True)
    state = {**_HeadDetector.state, "kept_": Scalar(int, 1, "D")}

    def _validate_params(self) -> None:
        self._check_percentile(percentile=self.percentile)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self._store_head(head)
        self.kept_ = _kept_count(fit_set.num_features, float(self.percentile))
        if self.kept_ < 1:
            raise DetectorError(
                f"{self.name}: percentile={self.percentile} prunes all {fit_set.num_features} activations; lower it"
            )


@register("ash_s")
class ASHS(_ASH):
    """ASH-S: keep the top (100 − p)% activations, scale them by exp(s1/s2), energy of the resulting logits."""

    paper = Paper(
        *ASH_PAPER,
        "percentile=90: the paper's ImageNet/ResNet-50 ASH-S@90 setting (OpenOOD's ash.yml runs ASH-B, see ash_b); "
        "applied to the penultimate (pooled) features; k = D - round(D p / 100) kept, as the reference",
    )
    summary = Summary(
        "ASH-S: keep the top (100−p)% of z, scale by exp(s1/s2), energy",
        defaults="the paper's ImageNet ASH-S@90",
        also_in="pytorch-ood",
        agreement="not compared; OpenOOD's `ash` postprocessor is ASH-B, see `ash_b`",
    )

    def __init__(self, percentile: float = 90.0) -> None:
        self.percentile = percentile

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = _as_float32(chunk.features)
        cut, ratio = _top_k(features, self.kept_)
        pruned = np.where(top_k_mask(features, cut, self.kept_), features, np.float32(0.0))
        # The scale e^(s1/s2) can exceed float32's range for sparse features: scale and add the bias in float64.
        logits = (pruned @ self.weight_.T).astype(np.float64)
        logits *= np.exp(ratio)[:, None]
        logits += self.bias_
        return logsumexp_in_place(logits)


@register("scale")
class SCALE(Detector):
    """SCALE: the whole feature vector scaled by exp(s1/s2), s2 the sum of its top (100 − p)%; energy of the logits."""

    # W (z e^r) + b = e^r (f - b) + b: the logits of the scaled features follow from the test logits and the bias,
    # so scoring needs no matmul with the head.
    requires = Requirements.of(score=("features", "logits"), head=True)
    paper = Paper(
        "Xu et al., Scaling for Training Time and Post-hoc Out-of-distribution Detection Enhancement",
        "ICLR 2024",
        "https://arxiv.org/abs/2310.00227",
        "percentile=85: the paper's ImageNet setting and OpenOOD v1.5's scale.yml; logits of the scaled "
        "features computed as e^r (f - b) + b from the test logits f (exact algebra)",
    )
    summary = Summary(
        "z·exp(s1/s2), s2 the sum of the top (100−p)%, energy",
        defaults="paper's ImageNet setting; OpenOOD `scale.yml`",
        also_in="pytorch-ood, OpenOOD",
    )

    state = {"bias_": Array("float64", ("C",)), "kept_": Scalar(int, 1, "D")}

    def __init__(self, percentile: float = 85.0) -> None:
        self.percentile = percentile

    def _validate_params(self) -> None:
        self._check_percentile(percentile=self.percentile)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self.bias_ = np.asarray(head.bias, dtype=np.float64)
        self.kept_ = _kept_count(fit_set.num_features, float(self.percentile))
        if self.kept_ < 1:
            raise DetectorError(
                f"scale: percentile={self.percentile} prunes all {fit_set.num_features} activations; lower it"
            )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        _, ratio = _top_k(_as_float32(chunk.features), self.kept_)
        logits = np.array(chunk.logits, dtype=np.float64)
        logits -= self.bias_
        logits *= np.exp(ratio)[:, None]
        logits += self.bias_
        return logsumexp_in_place(logits)


@register("dice")
class DICE(_HeadDetector):
    """DICE: keep the head weights whose contribution mean_fit(z) ⊙ W exceeds its p-th percentile; energy of (W⊙M)z + b."""

    requires = Requirements.of(fit=("features",), score=("features",), head=True)
    shared_statistics = frozenset({"mean"})
    state = {
        **_HeadDetector.state,
        "mean_activation_": Array("float64", ("D",)),
        "threshold_": Scalar(float),
        "mask_": Array("bool", ("C", "D")),
        "masked_weight_": Array("float32", ("C", "D")),
    }
    paper = Paper(
        "Sun & Li, DICE: Leveraging Sparsification for Out-of-Distribution Detection",
        "ECCV 2022",
        "https://arxiv.org/abs/2111.09805",
        "p=90: the default of RouteDICE in the official code and OpenOOD v1.5's dice.yml; the mean "
        "activation is taken over the fit set",
    )
    summary = Summary(
        "energy of (W⊙M)z + b, M keeps contributions mean_fit(z)⊙W above their p-th percentile",
        defaults="RouteDICE default in the official code; OpenOOD `dice.yml`",
        also_in="pytorch-ood, OpenOOD",
    )

    def __init__(self, p: float = 90.0) -> None:
        self.p = p

    def _validate_params(self) -> None:
        self._check_percentile(p=self.p)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self._store_head(head)
        self.mean_activation_ = statistics_for(self, fit_set).get("mean").mean
        contribution = self.mean_activation_[None, :] * np.asarray(head.weight, dtype=np.float64)
        self.threshold_ = float(np.percentile(contribution, float(self.p)))
        self.mask_ = contribution > self.threshold_
        self.masked_weight_ = np.where(self.mask_, self.weight_, np.float32(0.0))

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return self._head_energy(_as_float32(chunk.features), self.masked_weight_)
