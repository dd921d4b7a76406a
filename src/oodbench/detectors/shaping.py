"""ASH-P and ASH-B, the pruning and binarising variants of activation shaping (ASH-S is in `activation`)."""

from __future__ import annotations

import numpy as np

from ..numerics import logsumexp_in_place
from ..outputs import Outputs
from .activation import _ASH, ASH_PAPER, _as_float32
from .base import Paper
from .registry import register


def exact_top_k(features: np.ndarray, kept: int) -> np.ndarray:
    """Mask of exactly `kept` entries per row: the largest values, ties at the cut broken by position (lowest first).

    ASH-B gives every kept entry the same value, so which of several equal entries are kept changes the score even
    when they are zero; the mask therefore holds exactly `kept` entries, whatever the ties.
    """
    split = features.shape[1] - kept
    cut = np.partition(features, split, axis=1)[:, split : split + 1]
    above = features > cut
    tied = features == cut
    room = kept - above.sum(axis=1, keepdims=True)
    return above | (tied & (np.cumsum(tied, axis=1) <= room))


@register("ash_p")
class ASHP(_ASH):
    """ASH-P: zero all but the top (100 − p)% activations of each row; energy of the logits of what is left."""

    paper = Paper(
        *ASH_PAPER,
        "percentile=65: the official code's ash_p default (github.com/andrijazz/ash, ash.py); k = D - round(D p / 100) "
        "kept, as that code; applied to the penultimate (pooled) features; ties at the cut kept by position",
    )

    def __init__(self, percentile: float = 65.0) -> None:
        self.percentile = percentile

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = _as_float32(chunk.features)
        pruned = np.where(exact_top_k(features, self.kept_), features, np.float32(0.0))
        return self._head_energy(pruned)


@register("ash_b")
class ASHB(_ASH):
    """ASH-B: the top (100 − p)% activations all set to s1/k (s1 the row's sum, k kept), the rest zero; energy."""

    paper = Paper(
        *ASH_PAPER,
        "percentile=65: the official code's ash_b default (github.com/andrijazz/ash, ash.py); "
        "k = D - round(D p / 100) kept, each set to the row's sum over k; ties at the cut kept by position",
    )

    def __init__(self, percentile: float = 65.0) -> None:
        self.percentile = percentile

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        features = _as_float32(chunk.features)
        mask = exact_top_k(features, self.kept_).astype(np.float32)
        fill = features.sum(axis=1, dtype=np.float64) / self.kept_
        # W (fill · mask) + b = fill · (W mask) + b: the 0/1 product in float32, its scaling and the bias in float64.
        logits = (mask @ self.weight_.T).astype(np.float64)
        logits *= fill[:, None]
        logits += self.bias_
        return logsumexp_in_place(logits)
