"""The store-backed label embedder of the zero-shot scores: open_clip text embeddings cached in the feature store.

`store_embedder` answers from the store's text-embedding cache and encodes (then caches) only what is missing;
`bundle_loader` loads the open_clip model that made a store entry, from its provenance. Both return plain callables
(`oodbench.zeroshot.text.EmbedFn`), so zeroshot itself never imports extract; the command layer wires them in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ExtractError

__all__ = ["store_embedder", "bundle_loader", "embedder_for"]

EmbedFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]


def store_embedder(
    store: Any,
    model_id: str,
    *,
    model_bundle: Any = None,
    load_bundle: Callable[[], Any] | None = None,
    report: Callable[[str], None] | None = None,
) -> EmbedFn:
    """Embedding function over the store's cached text embeddings of `model_id`; encodes and caches what is missing.

    The open_clip model is needed only for label lists not cached yet; it is `model_bundle`, or made on first need
    by `load_bundle` (see `bundle_loader`). Without either, a missing list raises with instructions. `report` gets
    a line per shard of a long list being encoded.
    """
    from .openclip import TextEmbeddingsMissing, cached_text_embeddings

    state = {"bundle": model_bundle}

    def embed(labels: Sequence[str], templates: Sequence[str]) -> np.ndarray:
        labels, templates = list(labels), list(templates)
        try:
            return cached_text_embeddings(
                store, model_id, labels, templates, model_bundle=state["bundle"], report=report
            )
        except TextEmbeddingsMissing:
            if state["bundle"] is not None or load_bundle is None:
                raise
            state["bundle"] = load_bundle()
            return cached_text_embeddings(
                store, model_id, labels, templates, model_bundle=state["bundle"], report=report
            )

    return embed


def bundle_loader(
    store: Any, model_id: str, dataset_id: str, *, pretrained: str | None = None, device: str = "cpu"
) -> Callable[[], Any]:
    """A loader of the open_clip model that made the store entry `model_id/dataset_id` (from its provenance).

    `pretrained` overrides the recorded checkpoint (needed when the entry came from a local checkpoint file).
    """
    from .openclip import load_openclip

    provenance = store.meta(model_id, dataset_id).get("provenance", {})
    model_name, checkpoint = provenance.get("model"), str(provenance.get("checkpoint", ""))
    if provenance.get("kind") not in (None, "open_clip") or not model_name:
        raise ExtractError(
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
            raise ExtractError(
                f"{model_id} was extracted from a local checkpoint ({checkpoint}); pass its path "
                "with --pretrained so missing text embeddings can be computed"
            )

    # The store refuses text entries whose provenance differs from the model id's image entries.
    return lambda: load_openclip(model_name, pretrained, device, seed=seed)


def embedder_for(
    store: str | Path, model_id: str, openclip_model: str | None, pretrained: str | None, device: str
) -> Callable[[Sequence[str], Sequence[str]], np.ndarray]:
    """Embedding function over the store's text cache, loading the open_clip model only if something is missing.

    The model is `openclip_model` (with `pretrained`) when given, else the one recorded in the provenance of the
    model id's first image entry; a model id without image entries answers from the cache only.
    """
    from ..core.store import Store
    from .openclip import load_openclip

    root = Store(store)
    if openclip_model:
        return store_embedder(root, model_id, load_bundle=lambda: load_openclip(openclip_model, pretrained, device))
    images = [d for d in root.datasets(model_id) if not d.startswith("text-")]
    if not images:
        # Text-only work on a fresh model id: nothing records which network it is.
        return store_embedder(root, model_id)
    return store_embedder(
        root, model_id, load_bundle=bundle_loader(root, model_id, images[0], pretrained=pretrained, device=device)
    )
