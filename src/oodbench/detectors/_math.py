"""Numerically stable softmax-family helpers shared by detectors (float64, row-wise)."""
from __future__ import annotations

import numpy as np


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """Row-wise log Σ exp, stable for large logits."""
    # One float64 (rows x C) copy, shifted and exponentiated in place: fresh large temporaries cost page faults.
    shifted = np.array(logits, dtype=np.float64)
    peak = shifted.max(axis=1, keepdims=True)
    shifted -= peak
    # exp is slow near float64 underflow; terms below exp(-300) cannot change a sum that holds exp(0) = 1.
    np.maximum(shifted, -300.0, out=shifted)
    np.exp(shifted, out=shifted)
    return peak[:, 0] + np.log(shifted.sum(axis=1))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64."""
    shifted = np.array(logits, dtype=np.float64)
    shifted -= shifted.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=1, keepdims=True)
    return shifted


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy T · log Σ exp(f / T) (higher = more ID)."""
    return temperature * logsumexp(np.asarray(logits, dtype=np.float64) / temperature)


def l2_normalize(features: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit ℓ2 norm (float64); all-zero rows stay zero."""
    features = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, eps)
