"""ASH-P and ASH-B, the pruning and binarising variants of activation shaping (ASH-S is in `activation`)."""

from __future__ import annotations

import numpy as np

from ..core.numerics import logsumexp_in_place
from ..core.outputs import Outputs
from .activation import _ASH, ASH_PAPER, _as_float32, top_k_mask
from .base import Paper, Summary
from .registry import register


def _cut(features: np.ndarray, kept: int) -> np.ndarray:
    """Per row, the kept-th largest value."""
    split = features.shape[1] - kept
    return np.partition(features, split, axis=1)[:, split]


@register("ash_p")
class ASHP(_ASH):
    """ASH-P: zero all but the top (100 − p)% activations of each row; energy of the logits of what is left."""

    paper = Paper(
        *ASH_PAPER,
        "percentile=65: the official code's ash_p default (github.com/andrijazz/ash, ash.py); k = D - round(D p / 100) "
        "kept, as that code; applied to the penultimate (pooled) features; ties at the cut kept by position",
    )
    summary = Summary(
        "ASH-P: keep the top (100−p)% of z, zero the rest, energy",
        defaults="the official code's `ash_p` default",
        also_in="pytorch-ood, OpenOOD",
        agreement="2.3e-7 relative (pytorch-ood)",
    )

    def __init__(self, percentile: float = 65.0) -> None:
        self.percentile = percentile

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = _as_float32(chunk.features)
        pruned = np.where(top_k_mask(features, _cut(features, self.kept_), self.kept_), features, np.float32(0.0))
        return self._head_energy(pruned)


@register("ash_b")
class ASHB(_ASH):
    """ASH-B: the top (100 − p)% activations all set to s1/k (s1 the row's sum, k kept), the rest zero; energy."""

    paper = Paper(
        *ASH_PAPER,
        "percentile=65: the official code's ash_b default (github.com/andrijazz/ash, ash.py); "
        "k = D - round(D p / 100) kept, each set to the row's sum over k; ties at the cut kept by position",
    )
    summary = Summary(
        "ASH-B: the top (100−p)% of z set to Σz/k, the rest zero, energy",
        defaults="the official code's `ash_b` default",
        also_in="pytorch-ood, OpenOOD (its `ash` postprocessor is ASH-B at percentile 90)",
        agreement="2.2e-7 relative (pytorch-ood); OpenOOD's `ash` (`ash.yml`: percentile 90) is this detector with percentile=90, to 1.8e-7 relative",
    )

    def __init__(self, percentile: float = 65.0) -> None:
        self.percentile = percentile

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = _as_float32(chunk.features)
        mask = top_k_mask(features, _cut(features, self.kept_), self.kept_, exact=True).astype(np.float32)
        fill = features.sum(axis=1, dtype=np.float64) / self.kept_
        # W (fill · mask) + b = fill · (W mask) + b: the 0/1 product in float32, its scaling and the bias in float64.
        logits = (mask @ self.weight_.T).astype(np.float64)
        logits *= fill[:, None]
        logits += self.bias_
        return logsumexp_in_place(logits)
