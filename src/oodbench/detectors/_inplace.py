"""Row-wise log-sum-exp that reuses its input's memory: at (rows x C) chunk sizes, temporaries cost page faults."""
from __future__ import annotations

import numpy as np

# exp is slow near its underflow threshold; terms below exp(floor) cannot change a float64 sum that holds exp(0) = 1.
_FLOOR = {np.dtype(np.float32): np.float32(-80.0), np.dtype(np.float64): -300.0}


def logsumexp_in_place(logits: np.ndarray) -> np.ndarray:
    """log Σ_c exp(logits[:, c]) per row (float64); overwrites `logits` (float32 or float64) with scratch values."""
    peak = logits.max(axis=1, keepdims=True)
    logits -= peak
    np.maximum(logits, _FLOOR[logits.dtype], out=logits)
    np.exp(logits, out=logits)
    return peak[:, 0].astype(np.float64) + np.log(logits.sum(axis=1, dtype=np.float64))
