"""Label text embeddings: the embedding-function protocol every zero-shot step uses, and its store-backed form.

An *embedding function* maps (labels, templates) to an (L, D) array: each label filled into every template,
encoded, averaged over templates and ℓ2-normalised. Scoring uses the eight templates of the
Fi-ImageNet-1k paper's Appendix G; NegMining uses its own single mining prompts. Tests pass small deterministic
functions; real runs use the open_clip text tower through the store's text-embedding cache
(`oodbench.extract.label_embedder.store_embedder`), which the command layer hands in: zeroshot never imports extract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core.errors import ZeroShotError
from .scores import unit_rows

__all__ = ["EmbedFn", "embed_labels"]

EmbedFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]


def embed_labels(embed: EmbedFn, labels: Sequence[str], templates: Sequence[str]) -> np.ndarray:
    """(L, D) float32 unit-norm embeddings of `labels` under `templates`, checked for shape and finiteness."""
    labels = list(labels)
    if not labels:
        return np.zeros((0, 0), dtype=np.float32)
    if not templates:
        raise ZeroShotError("no prompt templates given")
    array = np.asarray(embed(labels, tuple(templates)))
    if array.ndim != 2 or array.shape[0] != len(labels):
        raise ZeroShotError(f"the text embedding function returned shape {array.shape} for {len(labels)} labels")
    if not np.isfinite(array).all():
        raise ZeroShotError("the text embedding function returned NaN or inf")
    return unit_rows(array, "label embedding")
