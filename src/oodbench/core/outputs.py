"""The data that flows between pipeline stages: `Outputs` (per-image arrays) and `Head` (linear classifier)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DataError, OodbenchError

# Row chunk used when checking large (memory-mapped) arrays, so validation never loads a whole array.
_CHECK_CHUNK = 65536


def require_finite(name: str, array: np.ndarray, *, offset: int = 0) -> None:
    """Raise DataError if `array` holds NaN or inf; scans in row chunks to keep memory bounded.

    `offset` is the array's first row in a larger one (a chunk), so the error names the row of the whole.
    """
    if array.size == 0:
        return
    for start in range(0, array.shape[0], _CHECK_CHUNK):
        block = np.asarray(array[start : start + _CHECK_CHUNK])
        if not np.isfinite(block).all():
            bad = int(np.flatnonzero(~np.isfinite(block).reshape(block.shape[0], -1).all(axis=1))[0]) + start + offset
            raise DataError(f"{name} contains NaN or inf values (first at row {bad})")


def check_class_labels(
    labels: np.ndarray, num_classes: int | None, *, what: str = "labels", error: type[OodbenchError] = DataError
) -> None:
    """Raise DataError unless `labels` index classes [0, num_classes) and name at least two distinct classes.

    The check a supervised fit needs: a label outside the head's classes, or a single class, gives silently wrong
    class statistics. `num_classes` None (no head and no logits) checks only that labels are non-negative.
    `error` is the exception raised (a detector's fit raises its own DetectorError). Scans in row chunks (labels of a memory-mapped 1.28 M-row entry are never loaded whole).
    """
    n = int(labels.shape[0])
    if n == 0:
        raise error(f"{what}: no labels")
    first = None
    for start in range(0, n, _CHECK_CHUNK):
        block = np.asarray(labels[start : start + _CHECK_CHUNK])
        bad = (block < 0) if num_classes is None else ((block < 0) | (block >= num_classes))
        if bad.any():
            row = start + int(np.flatnonzero(bad)[0])
            where = "" if num_classes is None else f" in [0, {num_classes}), the classes of the head"
            raise error(
                f"{what}: label {int(labels[row])} at row {row}; labels must be non-negative class indices{where}"
            )
        if first is None:
            first = int(block[0])
        if (block != first).any():
            return
    raise error(f"{what}: every label is {first}; a supervised fit needs at least two classes")


def _as_float_matrix(name: str, value: object, *, check_finite: bool = True) -> np.ndarray:
    """Validate a 2-D floating array; keep memory maps as they are (no copy)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim != 2:
        raise DataError(f"{name} must be a 2-D array (N, D); got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise DataError(f"{name} must have a floating dtype (float16/32/64); got {array.dtype}")
    if check_finite:
        require_finite(name, array)
    return array


@dataclass(frozen=True, eq=False)
class Outputs:
    """Per-image model outputs: penultimate `features` (N, D), optional `logits` (N, C), `labels` (N,), named `extras`."""

    features: np.ndarray
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)
    check_finite: bool = field(default=True, repr=False)
    # Where the rows come from (model, checkpoint, preprocessing, entry), as Store.read records it; a detector
    # fitted on them keeps it for save(). Subsets and derived outputs carry none.
    provenance: Mapping[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        features = _as_float_matrix("features", self.features, check_finite=self.check_finite)
        n = features.shape[0]
        object.__setattr__(self, "features", features)
        if self.logits is not None:
            logits = _as_float_matrix("logits", self.logits, check_finite=self.check_finite)
            if logits.shape[0] != n:
                raise DataError(f"logits has {logits.shape[0]} rows but features has {n}")
            object.__setattr__(self, "logits", logits)
        if self.labels is not None:
            labels = np.asarray(self.labels)
            if labels.ndim != 1:
                raise DataError(f"labels must be 1-D (N,); got shape {labels.shape}")
            if labels.shape[0] != n:
                raise DataError(f"labels has {labels.shape[0]} entries but features has {n} rows")
            if not np.issubdtype(labels.dtype, np.integer):
                raise DataError(f"labels must be integers; got dtype {labels.dtype}")
            object.__setattr__(self, "labels", labels.astype(np.int64, copy=False))
        extras: dict[str, np.ndarray] = {}
        for key, value in dict(self.extras).items():
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if array.ndim == 0 or array.shape[0] != n:
                raise DataError(f"extras[{key!r}] must have {n} rows (one per image); got shape {array.shape}")
            if self.check_finite and np.issubdtype(array.dtype, np.floating):
                require_finite(f"extras[{key!r}]", array)
            extras[key] = array
        object.__setattr__(self, "extras", extras)

    def __len__(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_features(self) -> int:
        """Feature dimension D."""
        return int(self.features.shape[1])

    @property
    def num_classes(self) -> int | None:
        """Number of classes C of the logits, or None without logits."""
        return None if self.logits is None else int(self.logits.shape[1])

    def array_names(self) -> set[str]:
        """Names of the arrays present: features, logits, labels, extra.<name> (as detectors declare needs)."""
        names = {"features"} | {f"extra.{key}" for key in self.extras}
        if self.logits is not None:
            names.add("logits")
        if self.labels is not None:
            names.add("labels")
        return names

    def subset(self, index: np.ndarray | slice) -> Outputs:
        """Rows selected by a boolean mask, an index array or a slice (materialised in memory)."""
        pick = (lambda a: np.asarray(a[index])) if isinstance(index, slice) else (lambda a: np.asarray(a)[index])
        return Outputs(
            features=pick(self.features),
            logits=None if self.logits is None else pick(self.logits),
            labels=None if self.labels is None else pick(self.labels),
            extras={k: pick(v) for k, v in self.extras.items()},
            check_finite=False,
        )

    def __repr__(self) -> str:
        parts = [f"N={len(self)}", f"D={self.num_features}"]
        if self.logits is not None:
            parts.append(f"C={self.num_classes}")
        if self.labels is not None:
            parts.append("labels")
        if self.extras:
            parts.append("extras=" + ",".join(sorted(self.extras)))
        return f"Outputs({', '.join(parts)})"


@dataclass(frozen=True, eq=False)
class Head:
    """The final linear classifier: logits = features @ weight.T + bias, weight (C, D), bias (C,)."""

    weight: np.ndarray
    bias: np.ndarray

    def __post_init__(self) -> None:
        weight = _as_float_matrix("head weight", self.weight)
        bias = np.asarray(self.bias)
        if bias.ndim != 1 or bias.shape[0] != weight.shape[0]:
            raise DataError(
                f"head bias must have shape ({weight.shape[0]},) to match weight {weight.shape}; got {bias.shape}"
            )
        if not np.issubdtype(bias.dtype, np.floating):
            raise DataError(f"head bias must have a floating dtype; got {bias.dtype}")
        if not np.isfinite(bias).all():
            raise DataError("head bias contains NaN or inf values")
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)

    @property
    def num_classes(self) -> int:
        """Number of classes C."""
        return int(self.weight.shape[0])

    @property
    def num_features(self) -> int:
        """Feature dimension D."""
        return int(self.weight.shape[1])

    def logits(self, features: np.ndarray) -> np.ndarray:
        """Logits of `features` (N, D) under this head, computed in float64 and returned as float64."""
        features = np.asarray(features)
        if features.ndim != 2 or features.shape[1] != self.num_features:
            raise DataError(f"features must have shape (N, {self.num_features}) for this head; got {features.shape}")
        return features.astype(np.float64, copy=False) @ self.weight.T.astype(np.float64) + self.bias.astype(np.float64)

    def check_outputs(self, outputs: Outputs, *, rtol: float = 1e-3, atol: float = 1e-3, rows: int = 4096) -> None:
        """Raise DataError unless the outputs' logits are reproduced by this head (checked on the first `rows`)."""
        if outputs.num_features != self.num_features:
            raise DataError(f"features have D={outputs.num_features} but the head expects D={self.num_features}")
        if outputs.logits is None:
            return
        if outputs.num_classes != self.num_classes:
            raise DataError(f"logits have C={outputs.num_classes} classes but the head has C={self.num_classes}")
        sample = slice(0, min(rows, len(outputs)))
        expected = self.logits(np.asarray(outputs.features[sample]))
        actual = np.asarray(outputs.logits[sample], dtype=np.float64)
        scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
        error = float(np.abs(actual - expected).max(initial=0.0))
        if error > atol * scale + rtol * scale:
            raise DataError(
                f"logits are not reproduced by the head: max |logits - (features @ W.T + b)| = {error:.3g} "
                f"(relative to logit scale {scale:.3g}); the head does not belong to these outputs"
            )

    def __repr__(self) -> str:
        return f"Head(C={self.num_classes}, D={self.num_features})"
