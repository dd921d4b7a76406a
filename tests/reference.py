"""Independent references for the end-to-end tests: scores and metrics recomputed here from the stored arrays.

Written from the definitions, not with oodbench's code, so an end-to-end run that reports wrong numbers (a detector
that scores a constant, a table that mixes up datasets) disagrees with them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# MSP and energy in float64 from float32 logits of at most C = 1000 classes and |logit| < 100: the two formulas (here
# and the detector's) each round a sum of C exponentials and one exp/log, so they differ by at most about
# (C + 2·max|logit|)·eps64 ≈ 3e-13 relative; 1e-12 states that bound with room.
SCORE_RTOL = 1e-12

# AUROC: a count of pairs (exact below 2**53) divided by n_id·n_ood, one float64 rounding: ≤ eps64 ≈ 2.2e-16.
AUROC_ABS = 1e-15


def msp(logits: np.ndarray) -> np.ndarray:
    """Largest softmax probability per row: 1 / Σ_j exp(f_j − max f)."""
    f = np.asarray(logits, dtype=np.float64)
    return 1.0 / np.exp(f - f.max(axis=1, keepdims=True)).sum(axis=1)


def energy(logits: np.ndarray) -> np.ndarray:
    """Negative free energy per row: log Σ_j exp f_j (higher = more in-distribution)."""
    f = np.asarray(logits, dtype=np.float64)
    peak = f.max(axis=1)
    return peak + np.log(np.exp(f - peak[:, None]).sum(axis=1))


def auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    """P(ID score > OOD score) + ½·P(tie), over all ID × OOD pairs (the Mann–Whitney statistic)."""
    a, b = np.asarray(id_scores)[:, None], np.asarray(ood_scores)[None, :]
    return float(np.mean(a > b) + 0.5 * np.mean(a == b))


def run_results(run_dir: Path) -> dict[tuple[str, str, str], float]:
    """(detector, OOD dataset, metric) -> value, read from a run directory's results.parquet with pyarrow."""
    import pyarrow.parquet as pq

    table = pq.read_table(Path(run_dir) / "results.parquet").to_pylist()
    return {(row["detector"], row["ood_dataset"], row["metric"]): row["value"] for row in table}


def run_scores(run_dir: Path, dataset: str) -> dict[str, np.ndarray]:
    """Detector -> per-image scores of `dataset`, read from the run directory's scores/<model>/<dataset>.npz."""
    (path,) = Path(run_dir).glob(f"scores/*/{dataset}.npz")
    with np.load(path) as saved:
        return {name: saved[name] for name in saved.files}


def float32_head_bound(features: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Per logit, the most a float32 ``features @ W.T + b`` can differ from the exact value (Higham §3.1).

    A float32 sum of D products and the bias errs by at most γ_(D+1)·Σ|terms| with γ_n ≈ n·u, u = eps32/2, whatever
    the summation order or blocking; the float32 result's own rounding adds u·|logit|. Twice u is used for room.
    """
    eps = float(np.finfo(np.float32).eps)
    f, w, b = (np.asarray(a, dtype=np.float64) for a in (features, weight, bias))
    terms = np.abs(f) @ np.abs(w).T + np.abs(b)
    return (f.shape[1] + 2) * eps * terms


def assert_float32_logits_of_head(logits: np.ndarray, features: np.ndarray, head: object) -> None:
    """The float32 `logits` are `head` applied to `features`, within `float32_head_bound` per logit."""
    weight, bias = head.weight, head.bias  # type: ignore[attr-defined]
    exact = np.asarray(features, dtype=np.float64) @ np.asarray(weight, np.float64).T + np.asarray(bias, np.float64)
    error = np.abs(np.asarray(logits, dtype=np.float64) - exact)
    bound = float32_head_bound(features, weight, bias)
    assert np.all(error <= bound), f"largest error {error.max():.3g} at a bound of {bound.flat[np.argmax(error)]:.3g}"
