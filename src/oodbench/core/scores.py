"""Per-image detector scores of an evaluation run: `<run_dir>/scores/<model>/<dataset>.npz`, one array per detector."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..util.atomic import atomic_path
from .errors import AnalysisError

__all__ = ["save_scores", "load_scores", "score_path", "list_scores"]


def score_path(run_dir: str | os.PathLike[str], model: str, dataset: str) -> Path:
    """Where the scores of one (model, dataset) live."""
    return Path(run_dir) / "scores" / model / f"{dataset}.npz"


def save_scores(
    run_dir: str | os.PathLike[str],
    model: str,
    dataset: str,
    scores: Mapping[str, np.ndarray],
    *,
    replace: bool = False,
) -> Path:
    """Write {detector: scores (N,)} atomically, merged with the scores already saved (or replacing them)."""
    path = score_path(run_dir, model, dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = load_scores(run_dir, model, dataset) if path.is_file() and not replace else {}
    merged.update({name: np.asarray(values, dtype=np.float64) for name, values in scores.items()})
    lengths = {name: v.shape for name, v in merged.items()}
    if len({shape for shape in lengths.values()}) > 1:
        raise AnalysisError(f"scores for {model}/{dataset} disagree in length: {lengths}")
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **merged)
    return path


def load_scores(run_dir: str | os.PathLike[str], model: str, dataset: str) -> dict[str, np.ndarray]:
    """{detector: scores} of one (model, dataset) of a run."""
    path = score_path(run_dir, model, dataset)
    if not path.is_file():
        raise AnalysisError(f"no scores for {model}/{dataset} in {run_dir} (expected {path})")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise AnalysisError(f"corrupt score file {path}: {exc}") from exc


def list_scores(run_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(model, dataset) pairs with saved scores."""
    root = Path(run_dir) / "scores"
    if not root.is_dir():
        return []
    return sorted((p.parent.name, p.stem) for p in root.glob("*/*.npz"))
