"""Row selection and relabelling of `Outputs` with bounded memory (large selections go to temporary memory maps)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..core.errors import AuditError
from ..core.outputs import Head, Outputs
from ..util.chunking import iter_chunks, rows_per_chunk

# Selections above this many bytes of features are written to a scratch memory map instead of RAM.
IN_MEMORY_BYTES = 1 << 30


def as_index(mask_or_index: np.ndarray, num_rows: int) -> np.ndarray:
    """Sorted int64 row indices from a boolean mask or an index array."""
    array = np.asarray(mask_or_index)
    if array.dtype == bool:
        if array.shape != (num_rows,):
            raise AuditError(f"row mask has shape {array.shape}; expected ({num_rows},)")
        return np.flatnonzero(array)
    index = np.sort(array.astype(np.int64, copy=False))
    if index.size and (index[0] < 0 or index[-1] >= num_rows):
        raise AuditError(f"row index out of range [0, {num_rows})")
    return index


def _gather(array: np.ndarray, index: np.ndarray, scratch: Path | None, name: str) -> np.ndarray:
    """array[index] read in row chunks; into a scratch .npy memory map when large and a scratch dir is given."""
    shape = (index.shape[0], *array.shape[1:])
    nbytes = int(np.prod(shape, dtype=np.int64)) * array.dtype.itemsize
    if scratch is not None and nbytes > IN_MEMORY_BYTES:
        scratch.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(
            scratch / f"{name}.{os.getpid()}.{id(index)}.npy", mode="w+", dtype=array.dtype, shape=shape
        )
    else:
        out = np.empty(shape, dtype=array.dtype)
    width = int(np.prod(array.shape[1:], dtype=np.int64)) if array.ndim > 1 else 1
    for rows in iter_chunks(index.shape[0], rows_per_chunk(width, bytes_per_value=array.dtype.itemsize)):
        out[rows] = array[index[rows]]
    return out


def select_rows(
    outputs: Outputs, rows: np.ndarray, *, scratch: Path | None = None, logits: bool = True, extras: bool = False
) -> Outputs:
    """The selected rows of `outputs` (features, labels, optionally logits and extras), memory-bounded."""
    index = as_index(rows, len(outputs))
    if index.shape[0] == 0:
        raise AuditError("the row selection is empty")
    return Outputs(
        features=_gather(outputs.features, index, scratch, "features"),
        logits=_gather(outputs.logits, index, scratch, "logits") if logits and outputs.logits is not None else None,
        labels=None if outputs.labels is None else np.asarray(outputs.labels)[index],
        extras={k: _gather(v, index, scratch, f"extra-{k}") for k, v in outputs.extras.items()} if extras else {},
        check_finite=False,
    )


def features_only(outputs: Outputs, *, labels: np.ndarray | None | bool = True) -> Outputs:
    """The same rows with only features (and labels, or the given replacement labels); no copy."""
    if labels is True:
        kept = outputs.labels
    elif labels is False:
        kept = None
    else:
        kept = labels
    return Outputs(features=outputs.features, labels=kept, check_finite=False)


def relabel(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels mapped to 0..C'-1 in sorted order of the original values, and the original values."""
    classes, inverse = np.unique(np.asarray(labels), return_inverse=True)
    return inverse.astype(np.int64), classes


def with_head(outputs: Outputs, head: Head, *, labels: np.ndarray | None | bool = True) -> Outputs:
    """Features (and labels) with logits recomputed by `head`, in row chunks (float32, as stored logits)."""
    if head.num_features != outputs.num_features:
        raise AuditError(f"head expects D={head.num_features} but the outputs have D={outputs.num_features}")
    logits = np.empty((len(outputs), head.num_classes), dtype=np.float32)
    for rows in iter_chunks(len(outputs), rows_per_chunk(max(head.num_classes, outputs.num_features))):
        logits[rows] = head.logits(np.asarray(outputs.features[rows]))
    kept = outputs.labels if labels is True else (None if labels is False else labels)
    return Outputs(features=outputs.features, logits=logits, labels=kept, check_finite=False)


def sample_index(num_rows: int, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    """All rows when within `limit`, else a sorted uniform sample of `limit` rows."""
    if limit is None or num_rows <= limit:
        return np.arange(num_rows)
    return np.sort(rng.choice(num_rows, size=limit, replace=False))
