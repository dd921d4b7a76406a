"""Numerically stable softmax-family helpers (row-wise, float64 results), shared by detectors and zero-shot scores."""

from __future__ import annotations

import numpy as np

# exp is slow near its underflow threshold; terms below exp(floor) cannot change a float64 sum that holds exp(0) = 1.
_FLOOR = {np.dtype(np.float32): np.float32(-80.0), np.dtype(np.float64): -300.0}


def logsumexp_in_place(logits: np.ndarray, peak: np.ndarray | None = None) -> np.ndarray:
    """log Σ_c exp(logits[:, c]) per row (float64); overwrites `logits` (float32 or float64) with scratch values.

    `peak`, when the caller has it, is logits.max(axis=1, keepdims=True) (the same values): not computed again.
    """
    # Reusing the input's memory: at (rows x C) chunk sizes, fresh large temporaries cost page faults.
    if peak is None:
        peak = logits.max(axis=1, keepdims=True)
    logits -= peak
    np.maximum(logits, _FLOOR[logits.dtype], out=logits)
    np.exp(logits, out=logits)
    return peak[:, 0].astype(np.float64) + np.log(logits.sum(axis=1, dtype=np.float64))


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """Row-wise log Σ exp in float64, stable for large logits; leaves `logits` unchanged."""
    return logsumexp_in_place(np.array(logits, dtype=np.float64))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64."""
    shifted = np.array(logits, dtype=np.float64)
    shifted -= shifted.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=1, keepdims=True)
    return shifted


def scaled_with_peak(logits: np.ndarray, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """f / T as a fresh float64 array and its row maxima (keepdims), for logsumexp_in_place and its callers."""
    if temperature == 1.0:  # f / 1 is exact: one float64 copy, no division pass
        scaled = np.array(logits, dtype=np.float64)
    else:  # converted and divided in one pass into a fresh float64 array
        scaled = np.divide(logits, temperature, dtype=np.float64)
    return scaled, scaled.max(axis=1, keepdims=True)


def energy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy T · log Σ exp(f / T) (higher = more ID)."""
    scaled, peak = scaled_with_peak(logits, temperature)
    lse = logsumexp_in_place(scaled, peak)
    return lse if temperature == 1.0 else temperature * lse  # 1 · x is exact


def l2_normalize(features: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit ℓ2 norm (float64); all-zero rows stay zero."""
    features = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.maximum(norms, eps)
