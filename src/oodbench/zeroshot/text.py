"""Label text embeddings: the embedding-function protocol every zero-shot step uses, and its store-backed form.

An *embedding function* maps (labels, templates) to an (L, D) array: each label filled into every template,
encoded, averaged over templates and ℓ2-normalised. Scoring uses the eight templates of the seed's Appendix G;
NegMining uses its own single mining prompts. Tests pass small deterministic functions; real runs use the
open_clip text tower through the store's text-embedding cache (`oodbench.extract.openclip`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ZeroShotError
from .scores import unit_rows

__all__ = ["EmbedFn", "embed_labels", "store_embedder", "bundle_loader"]

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
    return unit_rows(array)


def store_embedder(
    store: Any, model_id: str, *, model_bundle: Any = None, load_bundle: Callable[[], Any] | None = None
) -> EmbedFn:
    """Embedding function over the store's cached text embeddings of `model_id`; encodes and caches what is missing.

    The open_clip model is needed only for label lists not cached yet; it is `model_bundle`, or made on first need
    by `load_bundle` (see `bundle_loader`). Without either, a missing list raises with instructions.
    """
    from ..extract.openclip import TextEmbeddingsMissing, cached_text_embeddings

    state = {"bundle": model_bundle}

    def embed(labels: Sequence[str], templates: Sequence[str]) -> np.ndarray:
        labels, templates = list(labels), list(templates)
        try:
            return cached_text_embeddings(store, model_id, labels, templates, model_bundle=state["bundle"])
        except TextEmbeddingsMissing:
            if state["bundle"] is not None or load_bundle is None:
                raise
            state["bundle"] = load_bundle()
            return cached_text_embeddings(store, model_id, labels, templates, model_bundle=state["bundle"])

    return embed


def bundle_loader(
    store: Any, model_id: str, dataset_id: str, *, pretrained: str | None = None, device: str = "cpu"
) -> Callable[[], Any]:
    """A loader of the open_clip model that made the store entry `model_id/dataset_id` (from its provenance).

    `pretrained` overrides the recorded checkpoint (needed when the entry came from a local checkpoint file).
    """
    from ..extract.openclip import load_openclip

    provenance = store.meta(model_id, dataset_id).get("provenance", {})
    model_name, checkpoint = provenance.get("model"), str(provenance.get("checkpoint", ""))
    if provenance.get("kind") not in (None, "open_clip") or not model_name:
        raise ZeroShotError(
            f"{model_id}/{dataset_id} was not extracted with an open_clip model "
            f"(provenance {provenance}); zero-shot scores need a vision-language model"
        )
    seed = 0
    if pretrained is None:
        if checkpoint.startswith("open_clip:"):
            pretrained = checkpoint.partition(":")[2]
        elif checkpoint.startswith("random-init:"):
            seed = int(checkpoint.rpartition("=")[2] or 0)
        else:
            raise ZeroShotError(
                f"{model_id} was extracted from a local checkpoint ({checkpoint}); pass its path "
                "with --pretrained so missing text embeddings can be computed"
            )

    # The store refuses text entries whose provenance differs from the model id's image entries.
    return lambda: load_openclip(model_name, pretrained, device, seed=seed)
