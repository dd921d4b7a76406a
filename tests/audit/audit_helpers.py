"""Synthetic splits with a known answer, shared by the audit tests (Gaussians, sklearn digits pixels)."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from oodbench import Outputs
from oodbench.audit import AuditConfig


@pytest.fixture(autouse=True)
def single_thread_blas():
    """One BLAS thread per test: the tests' matrices are small, and on 2 shared cores threaded BLAS only spins."""
    with threadpool_limits(limits=1):
        yield


# A small, fast pool for tests: the Isolation Forest with few trees plus the Gaussian and neighbour detectors.
FAST = {"iforest": {"n_estimators": 25}}


def fast_config(**changes) -> AuditConfig:
    """Default thresholds, every pool member, a cheap Isolation Forest, no logit detectors unless asked."""
    values = {"logit_detectors": ()}
    values.update(changes)
    pool = values.get("pool")
    if "pool_params" not in values and (pool is None or "iforest" in pool):
        values["pool_params"] = FAST
    return AuditConfig(**values)


def outputs(blocks: list[np.ndarray], labels: list[int] | None) -> Outputs:
    features = np.concatenate(blocks).astype(np.float32)
    if labels is None:
        return Outputs(features)
    return Outputs(
        features,
        labels=np.concatenate(
            [np.full(len(b), label, dtype=np.int64) for b, label in zip(blocks, labels, strict=True)]
        ),
    )


class Pentagon:
    """Five unit-variance Gaussian classes at the vertices of a regular pentagon (radius 10) in 2-D.

    Class 4 is the designated OOD class. Leaked: its training rows are in the fit set. Clean: they are not.
    The geometry is symmetric, so with class 4 in the fit set no density reader can tell it from the others.
    """

    def __init__(self, seed: int = 0, n_train: int = 150, n_test: int = 80) -> None:
        rng = np.random.default_rng(seed)
        angles = 2 * np.pi * np.arange(5) / 5
        self.means = 10 * np.c_[np.cos(angles), np.sin(angles)]
        self.train = [self.means[c] + rng.normal(size=(n_train, 2)) for c in range(5)]
        self.test = [self.means[c] + rng.normal(size=(n_test, 2)) for c in range(5)]

    def leaked_fit(self) -> Outputs:
        return outputs(self.train, list(range(5)))

    def clean_fit(self) -> Outputs:
        return outputs(self.train[:4], list(range(4)))

    def id_test(self) -> Outputs:
        return outputs(self.test[:4], list(range(4)))

    def ood(self) -> Outputs:
        return outputs([self.test[4]], [4])


class Orthogonal:
    """C Gaussian classes with orthogonal means 8·e_c in D dimensions (for head / logit tests)."""

    def __init__(self, seed: int = 0, classes: int = 5, dim: int = 12, n_train: int = 120, n_test: int = 60) -> None:
        rng = np.random.default_rng(seed)
        self.means = 8.0 * np.eye(classes, dim)
        self.train = [self.means[c] + rng.normal(size=(n_train, dim)) for c in range(classes)]
        self.test = [self.means[c] + rng.normal(size=(n_test, dim)) for c in range(classes)]
        self.classes = classes

    def fit(self, drop: int | None = None) -> Outputs:
        keep = [c for c in range(self.classes) if c != drop]
        return outputs([self.train[c] for c in keep], keep)

    def test_without(self, c: int) -> Outputs:
        keep = [k for k in range(self.classes) if k != c]
        return outputs([self.test[k] for k in keep], keep)

    def test_of(self, c: int) -> Outputs:
        return outputs([self.test[c]], [c])


def digits_features(seed: int = 0) -> dict[str, Outputs]:
    """scikit-learn digits as raw 64-pixel features: train/test of classes 0-5, of 6-9, and uniform noise."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.4, stratify=y, random_state=seed)
    trained_train, trained_test = y_train < 6, y_test < 6
    noise = np.random.default_rng(seed).uniform(0, 1, size=(150, 64)).astype(np.float32)
    return {
        "train": Outputs(x_train[trained_train], labels=y_train[trained_train]),
        "test": Outputs(x_test[trained_test], labels=y_test[trained_test]),
        "extra_train": Outputs(x_train[~trained_train], labels=y_train[~trained_train]),
        "extra_test": Outputs(x_test[~trained_test], labels=y_test[~trained_test]),
        "noise": Outputs(noise),
    }
