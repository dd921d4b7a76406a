"""The prompt templates are the Fi-ImageNet-1k paper's Appendix G eight, in its order, and old caches are never reused."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench.text.templates import SEED_TEMPLATES, fill

# Appendix G, "Zero-shot classification prompt templates": the eight templates as printed, in the printed order
# (the bare name, then seven of the OpenAI ImageNet templates). Transcribed independently of templates.py.
APPENDIX_G = [
    "{}",
    "a photo of a {}.",
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "a cropped photo of a {}.",
    "a close-up photo of a {}.",
]

# The ensemble this module held before it followed Appendix G (CLIP's notebook's best small ensemble, with the bare
# name); text embeddings cached under it must never answer for the Appendix G templates.
PREVIOUS = (
    "{}",
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)


def test_the_eight_templates_of_appendix_g_in_order():
    assert list(SEED_TEMPLATES) == APPENDIX_G
    assert len(set(SEED_TEMPLATES)) == 8
    assert fill(SEED_TEMPLATES, "tench")[:3] == ["tench", "a photo of a tench.", "a bad photo of a tench."]


def test_text_embeddings_cached_under_other_templates_are_not_reused(tmp_path):
    """The cache key covers the template strings: an entry made with the previous ensemble is a different entry."""
    pytest.importorskip("open_clip")
    from oodbench.core.store import Store
    from oodbench.extract.openclip import TextEmbeddingsMissing, cached_text_embeddings, text_dataset_id

    labels = ["tench", "goldfish"]
    assert text_dataset_id(labels, PREVIOUS) != text_dataset_id(labels, SEED_TEMPLATES)
    store = Store(tmp_path / "store")
    old_id = text_dataset_id(labels, PREVIOUS)
    writer = store.writer(
        "m", old_id, provenance={"model": "m", "kind": "open_clip"}, num_items=2, shard_size=2, item_hash=old_id
    )
    writer.write_shard(0, {"features": np.eye(2, 4, dtype=np.float32), "index": np.arange(2, dtype=np.int64)})
    writer.finalize(extra_meta={"labels": labels, "templates": list(PREVIOUS)})
    assert np.array_equal(cached_text_embeddings(store, "m", labels, PREVIOUS), np.eye(2, 4, dtype=np.float32))
    with pytest.raises(TextEmbeddingsMissing):
        cached_text_embeddings(store, "m", labels, SEED_TEMPLATES)
