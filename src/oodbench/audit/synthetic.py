"""A synthetic controlled battery: Gaussian classes in many dimensions, with leaks and hard clean pairs by design.

Every class is an isotropic unit-variance Gaussian; class means are orthogonal and `separation` apart, so a linear
reader separates any two classes and each class's test rows are indistinguishable from its training rows.

- Trained classes (0..C-1) give the leaked / clean trained-class splits of `make_battery`.
- Near sets (``near-<c>``): a class that is *not* trained, drawn like class c but shifted by `near_shift` along a
  direction orthogonal to every mean. A linear reader separates it from c; in `dim` dimensions a shift of a few
  units barely changes any distance, so density readers fitted on a fit set holding c miss it: the intrinsically
  hard clean pair (the CIFAR-100 vs CIFAR-10 mode at CIFAR scale). Excluding c from the fit set makes it
  detectable, which is why an automatic contrast must check that the OOD set *is* the excluded class.
- A far set (``far``): a Gaussian far from every class.

No model and no images: the arrays stand for penultimate features of a backbone that learned the classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import AuditError
from ..core.outputs import Outputs

__all__ = ["SyntheticBattery", "synthetic_battery_data"]


@dataclass(frozen=True)
class SyntheticBattery:
    """Labelled train/test features of the trained classes, near (hard clean) sets and a far set."""

    train: Outputs
    test: Outputs
    near: dict[str, Outputs]
    far: dict[str, Outputs]


def synthetic_battery_data(
    seed: int = 0,
    *,
    classes: int = 5,
    dim: int = 128,
    separation: float = 10.0,
    near_of: tuple[int, ...] = (0, 1),
    near_shift: float = 2.5,
    n_train: int = 300,
    n_test: int = 150,
) -> SyntheticBattery:
    """Features of `classes` trained Gaussian classes, one near set per class in `near_of`, and a far set."""
    if classes < 3:
        raise AuditError("the synthetic battery needs at least 3 classes (2 must remain for a clean head)")
    if dim < classes + len(near_of) + 1:
        raise AuditError(f"dim {dim} is too small for {classes} orthogonal means and {len(near_of)} near shifts")
    bad = [c for c in near_of if not 0 <= c < classes]
    if bad:
        raise AuditError(f"near_of names classes outside 0..{classes - 1}: {bad}")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(dim, classes + len(near_of) + 1)))
    means = separation / np.sqrt(2.0) * basis[:, :classes].T  # pairwise distance = separation

    def draw(mean: np.ndarray, rows: int) -> np.ndarray:
        return (mean + rng.normal(size=(rows, dim))).astype(np.float32)

    labels = np.arange(classes, dtype=np.int64)
    train = Outputs(np.concatenate([draw(m, n_train) for m in means]), labels=np.repeat(labels, n_train))
    test = Outputs(np.concatenate([draw(m, n_test) for m in means]), labels=np.repeat(labels, n_test))
    near = {
        f"near-{c}": Outputs(draw(means[c] + near_shift * basis[:, classes + i], n_test)) for i, c in enumerate(near_of)
    }
    far = {"far": Outputs(draw(3.0 * separation * basis[:, -1], n_test))}
    return SyntheticBattery(train, test, near, far)
