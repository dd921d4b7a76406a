"""Shared test data for the detectors: small synthetic classification problems with a consistent linear head."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from scipy.stats import spearmanr

from oodbench.core.metrics import auroc
from oodbench.core.outputs import Head, Outputs


@dataclass
class Problem:
    """A fit set (with labels), the head, and a test set of `n_id` ID rows followed by OOD rows."""

    fit: Outputs
    head: Head
    test: Outputs
    n_id: int

    @property
    def weight(self) -> np.ndarray:
        return self.head.weight.astype(np.float64)

    @property
    def bias(self) -> np.ndarray:
        return self.head.bias.astype(np.float64)


def outputs_of(features: np.ndarray, head: Head, labels: np.ndarray | None = None, **extras: np.ndarray) -> Outputs:
    """Outputs whose logits are exactly the head applied to the (float32) features."""
    features = np.asarray(features, dtype=np.float32)
    logits = head.logits(features).astype(np.float32)
    return Outputs(features, logits, labels, extras=extras)


def make_problem(
    seed: int = 0, num_classes: int = 5, dim: int = 12, fit_rows: int = 400, test_rows: int = 150, relu: bool = True
) -> Problem:
    """Gaussian classes (post-ReLU by default); OOD rows sit between two classes, so ID and OOD scores overlap."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim)) * 1.5 + 1.0
    scales = rng.uniform(0.5, 1.5, size=dim)

    def draw(rows: int, between: bool) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, num_classes, rows)
        centre = centres[labels]
        if between:
            centre = (centre + centres[(labels + rng.integers(1, num_classes, rows)) % num_classes]) / 2
        features = centre + scales * rng.normal(size=(rows, dim))
        return (np.maximum(features, 0.0) if relu else features), labels

    fit_features, fit_labels = draw(fit_rows, False)
    weight = 0.4 * centres + 0.2 * rng.normal(size=(num_classes, dim))
    head = Head(weight.astype(np.float32), (0.3 * rng.normal(size=num_classes)).astype(np.float32))
    id_features, _ = draw(test_rows, False)
    ood_features, _ = draw(test_rows, True)
    test = with_network_extras(outputs_of(np.concatenate([id_features, ood_features]), head), seed + 1)
    fit = with_network_extras(outputs_of(fit_features, head, fit_labels.astype(np.int64)), seed)
    return Problem(fit, head, test, test_rows)


STAGES = ("layer1", "layer2", "layer3", "layer4")


def with_network_extras(outputs: Outputs, seed: int) -> Outputs:
    """`outputs` plus the extras the network-time detectors read by default (odin, rankfeat, gram, mds per stage),
    derived from its features and logits with their own random draws (the problem's other arrays stay as they are)."""
    rng = np.random.default_rng(1000 + seed)
    projections = np.random.default_rng(7).normal(size=(len(STAGES), outputs.num_features, 8))
    extras = {
        "odin": (outputs.logits / 1000.0).astype(np.float32),
        "rankfeat.layer4": (outputs.logits + 0.1 * rng.normal(size=outputs.logits.shape)).astype(np.float32),
    }
    for i, stage in enumerate(STAGES):
        mapped = outputs.features @ projections[i][:, : 4 + i]
        extras[f"gram.{stage}"] = np.abs(mapped).astype(np.float32)
        extras[f"mds.{stage}"] = (mapped + 0.1 * rng.normal(size=mapped.shape)).astype(np.float32)
    return Outputs(outputs.features, outputs.logits, outputs.labels, extras={**outputs.extras, **extras})


def assert_agree(fast: np.ndarray, slow: np.ndarray, n_id: int, rtol: float | None = 1e-7) -> None:
    """The issue's acceptance: Spearman > 0.9999 and AUROC equal within 1e-9 (plus closeness of values if rtol)."""
    fast, slow = np.asarray(fast, dtype=np.float64), np.asarray(slow, dtype=np.float64)
    assert fast.shape == slow.shape
    assert spearmanr(fast, slow).statistic > 0.9999
    assert abs(auroc(fast[:n_id], fast[n_id:]) - auroc(slow[:n_id], slow[n_id:])) <= 1e-9
    # ID and OOD scores must interleave, or the AUROC comparison could not catch an ordering error.
    assert 0.0 < auroc(slow[:n_id], slow[n_id:]) < 1.0
    if rtol is not None:
        np.testing.assert_allclose(fast, slow, rtol=rtol, atol=rtol * max(1.0, float(np.abs(slow).max())))


# Small parameters so every detector fits the 400-row test problem.
SMALL_PARAMS = {
    "knn": {"k": 5},
    "nnguide": {"k": 5, "alpha": 0.2},
    "neco": {"dim": 4},
    "nac": {"alpha": 50.0, "fit_rows": 250},
    "vim": {"dim": 5},
    "ash_s": {"percentile": 80},
    "scale": {"percentile": 80},
}


@pytest.fixture(scope="session")
def small_params() -> dict:
    return SMALL_PARAMS


@pytest.fixture(scope="session")
def problem() -> Problem:
    return make_problem()


@pytest.fixture(scope="session")
def make():
    return make_problem


@pytest.fixture(scope="session")
def agree():
    return assert_agree


@pytest.fixture(scope="session")
def build_outputs():
    return outputs_of
