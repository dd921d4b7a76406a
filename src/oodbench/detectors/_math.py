"""Numerically stable softmax-family helpers shared by detectors (float64, row-wise)."""
from __future__ import annotations

import numpy as np


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """Row-wise log Σ exp, stable for large logits."""
    logits = np.asarray(logits, dtype=np.float64)
    peak = logits.max(axis=1, keepdims=True)
    return (peak + np.log(np.exp(logits - peak).sum(axis=1, keepdims=True)))[:, 0]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy T · log Σ exp(f / T) (higher = more ID)."""
    return temperature * logsumexp(np.asarray(logits, dtype=np.float64) / temperature)


def l2_normalize(features: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit ℓ2 norm (float64); all-zero rows stay zero."""
    features = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, eps)
